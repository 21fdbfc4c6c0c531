//! The fields mode: a JSON object payload read as its top-level members in order, each
//! value kept as its own JSON text, so that the object is written back with the members in
//! the producer's order and the values not encrypted exactly as they were.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The top-level members of a JSON object, in order (a repeated name is kept each time).
#[derive(Debug)]
pub(super) struct Members(pub(super) Vec<(String, Box<RawValue>)>);

impl Members {
    /// The members of `payload`, or why it is not a JSON object (where, never what: the
    /// parser's own message may quote the payload).
    pub(super) fn parse(payload: &[u8]) -> Result<Self, String> {
        let mut de = serde_json::Deserializer::from_slice(payload);
        let members = de.deserialize_map(MembersVisitor).map_err(describe)?;
        de.end().map_err(describe)?;
        Ok(members)
    }

    /// The object as compact JSON: the members in order, each value's text as it is.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            2 + self
                .0
                .iter()
                .map(|(name, value)| name.len() + value.get().len() + 4)
                .sum::<usize>(),
        );
        out.push(b'{');
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // A string always serializes.
            out.extend_from_slice(serde_json::to_string(name).unwrap_or_default().as_bytes());
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        out.push(b'}');
        out
    }
}

/// What is wrong and where, without the parser's message (it may quote the payload).
fn describe(err: serde_json::Error) -> String {
    let what = match err.classify() {
        // Only the top level can be of the wrong type (member values are taken as they are).
        serde_json::error::Category::Data => return "its top level is another JSON value".into(),
        serde_json::error::Category::Eof => "it ends early",
        serde_json::error::Category::Syntax | serde_json::error::Category::Io => "it is not JSON",
    };
    format!("{what} (line {}, column {})", err.line(), err.column())
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some((name, value)) = map.next_entry::<String, Box<RawValue>>()? {
            members.push((name, value));
        }
        Ok(Members(members))
    }
}

/// `{"enc":"<base64>"}`.
pub(super) fn enc_value(sealed_base64: &str) -> Box<RawValue> {
    let text = serde_json::json!({ "enc": sealed_base64 }).to_string();
    // The text is an object serde_json just wrote: it parses.
    RawValue::from_string(text).unwrap_or_default()
}

/// The base64 text of `{"enc":"<base64>"}`, or `None` for any other value.
pub(super) fn enc_text(value: &RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Enc {
        enc: String,
    }
    serde_json::from_str::<Enc>(value.get()).ok().map(|e| e.enc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_keep_their_order_and_their_text() {
        let payload = br#" {"z": 1, "a": {"y": [1, 2], "b": "x"}, "m": null} "#;
        let members = Members::parse(payload).expect("an object");
        let names: Vec<_> = members.0.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["z", "a", "m"]);
        assert_eq!(members.0[1].1.get(), r#"{"y": [1, 2], "b": "x"}"#);
        assert_eq!(
            String::from_utf8(members.to_bytes()).expect("utf-8"),
            r#"{"z":1,"a":{"y": [1, 2], "b": "x"},"m":null}"#
        );
    }

    #[test]
    fn anything_but_an_object_is_refused_without_quoting_it() {
        for payload in [
            &br#""secret""#[..],
            b"[\"secret\"]",
            b"12",
            b"{\"a\":\"secret\"",
            b"{} secret",
            b"\xff",
            br#"{"secret" 1}"#,
        ] {
            let err = Members::parse(payload).expect_err("not an object");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn enc_values_round_trip() {
        let value = enc_value("AAEC");
        assert_eq!(value.get(), r#"{"enc":"AAEC"}"#);
        assert_eq!(enc_text(&value).as_deref(), Some("AAEC"));
        let other = RawValue::from_string(r#"{"enc":"AAEC","x":1}"#.into()).expect("json");
        assert_eq!(enc_text(&other), None);
        let other = RawValue::from_string(r#""AAEC""#.into()).expect("json");
        assert_eq!(enc_text(&other), None);
    }
}

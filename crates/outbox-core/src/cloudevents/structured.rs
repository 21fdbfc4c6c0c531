//! The structured content mode's JSON envelope: written from an event's [`Attributes`] (the
//! relay's side) and read back into an [`Envelope`] (the inbox's side).

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Attributes, attribute, is_json_media_type};

impl Attributes<'_> {
    /// Appends the structured mode's JSON envelope to `out`: the attributes in the order of
    /// [`for_each`](Self::for_each), then `data` (the payload's JSON text, surrounding
    /// whitespace dropped) when `datacontenttype` is a JSON type and the payload is a JSON
    /// text, else `data_base64` (standard base64 with padding; also for an empty payload).
    pub fn write_envelope(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        let mut first = true;
        self.for_each(|name, value| {
            if !first {
                out.push(b',');
            }
            first = false;
            write_json_string(out, name);
            out.push(b':');
            write_json_string(out, value);
        });
        match json_data(self.payload, self.data_content_type) {
            Some(json) => {
                out.extend_from_slice(b",\"data\":");
                out.extend_from_slice(json.as_bytes());
            }
            None => {
                out.extend_from_slice(b",\"data_base64\":\"");
                let engine = base64::engine::general_purpose::STANDARD;
                let start = out.len();
                out.resize(
                    start + base64::encoded_len(self.payload.len(), true).unwrap_or(0),
                    0,
                );
                let written = engine
                    .encode_slice(self.payload, &mut out[start..])
                    .unwrap_or(0);
                out.truncate(start + written);
                out.push(b'"');
            }
        }
        out.push(b'}');
    }

    /// The structured mode's JSON envelope.
    pub fn envelope(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.payload.len() * 4 / 3);
        self.write_envelope(&mut out);
        out
    }
}

/// The payload's JSON text when it goes as `data`.
fn json_data<'p>(payload: &'p [u8], content_type: &str) -> Option<&'p str> {
    if payload.is_empty() || !is_json_media_type(content_type) {
        return None;
    }
    let text = std::str::from_utf8(payload).ok()?;
    let value: &RawValue = serde_json::from_str(text).ok()?;
    Some(value.get())
}

fn write_json_string(out: &mut Vec<u8>, value: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// The pairs of an `outboxheaders` attribute (`[["name","value"], ...]`), or `None` when
/// `text` is not that.
pub fn parse_header_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let pairs: Vec<[String; 2]> = serde_json::from_str(text).ok()?;
    Some(pairs.into_iter().map(|[n, v]| (n, v)).collect())
}

/// An outbox event read back out of a structured CloudEvent (the inbox's side): the
/// attributes as they were sent, `data` as the payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Every attribute but `data` / `data_base64`, in the envelope's order; non-string values
    /// as their JSON text.
    pub attributes: Vec<(String, String)>,
    /// `data`'s JSON text, or the bytes of `data_base64`; empty when neither is present.
    pub data: Bytes,
}

impl Envelope {
    /// Parses a structured-mode body; `None` when it is not a JSON object with a
    /// `specversion` (not a CloudEvent) or `data_base64` is not base64.
    pub fn parse(body: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(body).ok()?;
        let fields: Vec<(String, &RawValue)> = {
            struct Fields<'t>(Vec<(String, &'t RawValue)>);
            impl<'de: 't, 't> Deserialize<'de> for Fields<'t> {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    struct Visit<'t>(std::marker::PhantomData<&'t ()>);
                    impl<'de: 't, 't> serde::de::Visitor<'de> for Visit<'t> {
                        type Value = Fields<'t>;
                        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                            f.write_str("a JSON object")
                        }
                        fn visit_map<M: serde::de::MapAccess<'de>>(
                            self,
                            mut map: M,
                        ) -> Result<Self::Value, M::Error> {
                            let mut out = Vec::new();
                            while let Some((k, v)) = map.next_entry::<String, &'t RawValue>()? {
                                out.push((k, v));
                            }
                            Ok(Fields(out))
                        }
                    }
                    d.deserialize_map(Visit(std::marker::PhantomData))
                }
            }
            serde_json::from_str::<Fields<'_>>(text).ok()?.0
        };
        if !fields.iter().any(|(k, _)| k == attribute::SPECVERSION) {
            return None;
        }
        let mut attributes = Vec::with_capacity(fields.len());
        let mut data = Bytes::new();
        for (name, raw) in fields {
            match name.as_str() {
                "data" => data = Bytes::copy_from_slice(raw.get().as_bytes()),
                "data_base64" => {
                    let encoded: String = serde_json::from_str(raw.get()).ok()?;
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .ok()?;
                    data = Bytes::from(decoded);
                }
                _ => {
                    let value = serde_json::from_str::<String>(raw.get())
                        .unwrap_or_else(|_| raw.get().to_owned());
                    attributes.push((name, value));
                }
            }
        }
        Some(Self { attributes, data })
    }
}

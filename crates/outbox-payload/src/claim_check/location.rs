//! Where a claim-check store is (`s3://bucket/prefix`, `file:///dir`), and the key and URL
//! of an event's object in it.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use uuid::Uuid;

/// What [`Location::parse`] adds to every refusal.
const WRITE: &str = "write s3://bucket/prefix or file:///absolute/dir";

/// Bytes of an aggregate type kept as they are in a key: `A-Za-z0-9._-`.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

/// A parsed `store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Location {
    /// `s3://bucket/prefix`: `prefix` without a leading or trailing `/`, possibly empty.
    S3 { bucket: String, prefix: String },
    /// `file:///dir`: `dir` absolute, without a trailing `/` (empty for the root).
    File { dir: String },
}

impl Location {
    /// The store of `store`; the error is the whole message for `claim_check.store`.
    pub(super) fn parse(store: &str) -> Result<Self, String> {
        let shown = outbox_core::redact::redact_url(store);
        let refuse = |what: &str| format!("store: `{shown}` is not {what}; {WRITE}");
        if let Some(rest) = store.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if let Err(why) = check_bucket(bucket) {
                return Err(refuse(&format!("a valid S3 location: {why}")));
            }
            let prefix = prefix.trim_end_matches('/');
            if let Err(why) = check_prefix(prefix) {
                return Err(refuse(&format!("a valid S3 location: {why}")));
            }
            return Ok(Self::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.to_owned(),
            });
        }
        if let Some(path) = store.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(refuse(
                    "an absolute directory (file:// then an absolute path: three slashes in all)",
                ));
            }
            if path.split('/').any(|s| s == "." || s == "..")
                || path.contains(['?', '#'])
                || path.chars().any(char::is_control)
            {
                return Err(refuse(
                    "a plain directory path (no `.` or `..` segments, `?`, `#` or control \
                     characters)",
                ));
            }
            return Ok(Self::File {
                dir: path.trim_end_matches('/').to_owned(),
            });
        }
        Err(refuse("a claim-check store"))
    }

    /// True for an `s3://` store.
    pub(super) fn is_s3(&self) -> bool {
        matches!(self, Self::S3 { .. })
    }

    /// The object key of event `id` of `aggregate_type`: `<prefix>/<aggregate type>/<id>`
    /// (no prefix for a file store, nor for an S3 store without one).
    pub(super) fn key(&self, aggregate_type: &str, id: Uuid) -> String {
        let prefix = match self {
            Self::S3 { prefix, .. } => prefix.as_str(),
            Self::File { .. } => "",
        };
        let mut key = String::with_capacity(prefix.len() + aggregate_type.len() + 38);
        if !prefix.is_empty() {
            key.push_str(prefix);
            key.push('/');
        }
        key.push_str(&segment(aggregate_type));
        key.push('/');
        key.push_str(id.hyphenated().encode_lower(&mut Uuid::encode_buffer()));
        key
    }

    /// The URL of the object at `key`: `s3://bucket/<key>` or `file:///dir/<key>`.
    pub(super) fn url(&self, key: &str) -> String {
        match self {
            Self::S3 { bucket, .. } => format!("s3://{bucket}/{key}"),
            Self::File { dir } => format!("file://{dir}/{key}"),
        }
    }
}

/// An aggregate type as one key segment: percent-encoded outside `A-Za-z0-9._-`; one made
/// of dots only (`.`, `..`) has them encoded too (`%2E`), so that no path or URL reads it as
/// a directory step; an empty one is `_`.
fn segment(aggregate_type: &str) -> String {
    if aggregate_type.is_empty() {
        return "_".to_owned();
    }
    if aggregate_type.bytes().all(|b| b == b'.') {
        return "%2E".repeat(aggregate_type.len());
    }
    utf8_percent_encode(aggregate_type, SEGMENT).to_string()
}

/// S3's bucket naming rules (general purpose buckets).
pub(super) fn check_bucket(bucket: &str) -> Result<(), String> {
    let rules = "3 to 63 lower-case letters, digits, dots and hyphens, starting and ending \
                 with a letter or digit";
    let bytes = bucket.as_bytes();
    let valid_chars = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-');
    let ends_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if bucket.is_empty() {
        return Err("it names no bucket".into());
    }
    if !(3..=63).contains(&bytes.len())
        || !valid_chars
        || !ends_ok(bytes.first())
        || !ends_ok(bytes.last())
    {
        return Err(format!("`{bucket}` is not a bucket name ({rules})"));
    }
    if bucket.contains("..") || bucket.contains(".-") || bucket.contains("-.") {
        return Err(format!(
            "`{bucket}` is not a bucket name (no two adjacent dots, nor a dot next to a hyphen)"
        ));
    }
    if bucket.split('.').count() == 4 && bucket.split('.').all(|p| p.parse::<u8>().is_ok()) {
        return Err(format!(
            "`{bucket}` is not a bucket name (it is formatted as an IP address)"
        ));
    }
    let reserved_start = ["xn--", "sthree-", "amzn-s3-demo-"];
    let reserved_end = ["-s3alias", "--ol-s3", "--x-s3", "--table-s3", ".mrap"];
    if reserved_start.iter().any(|p| bucket.starts_with(p))
        || reserved_end.iter().any(|s| bucket.ends_with(s))
    {
        return Err(format!(
            "`{bucket}` is not a bucket name (its prefix or suffix is reserved by S3)"
        ));
    }
    Ok(())
}

/// A prefix (trailing `/` already removed): empty, or segments that are not empty, `.` or
/// `..`, without `?`, `#`, `%`, `\` or control characters (they would make the objects' URLs
/// ambiguous).
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!(
            "the prefix `{prefix}` has an empty, `.` or `..` segment"
        ));
    }
    if prefix.contains(['?', '#', '%', '\\']) || prefix.chars().any(char::is_control) {
        return Err(format!(
            "the prefix `{prefix}` has a `?`, `#`, `%`, `\\` or a control character"
        ));
    }
    if prefix.len() > 512 {
        return Err(format!(
            "the prefix is {} bytes, over 512 (S3 keys are at most 1024 bytes)",
            prefix.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: Uuid = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001);

    fn s3(bucket: &str, prefix: &str) -> Location {
        Location::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn stores_parse_into_bucket_and_prefix_or_directory() {
        assert_eq!(Location::parse("s3://orders-big"), Ok(s3("orders-big", "")));
        assert_eq!(
            Location::parse("s3://orders-big/"),
            Ok(s3("orders-big", ""))
        );
        assert_eq!(
            Location::parse("s3://my.bucket-1/outbox/large/"),
            Ok(s3("my.bucket-1", "outbox/large"))
        );
        assert_eq!(
            Location::parse("file:///var/lib/outbox/"),
            Ok(Location::File {
                dir: "/var/lib/outbox".into()
            })
        );
        assert_eq!(
            Location::parse("file:///"),
            Ok(Location::File { dir: String::new() })
        );
    }

    #[test]
    fn bad_stores_are_refused_with_the_reason_and_the_forms_to_write() {
        for (store, why) in [
            ("http://example.com/x", "is not a claim-check store"),
            ("/var/lib/outbox", "is not a claim-check store"),
            ("s3://", "it names no bucket"),
            ("s3://Orders", "`Orders` is not a bucket name (3 to 63"),
            ("s3://ab", "`ab` is not a bucket name (3 to 63"),
            ("s3://-abc", "`-abc` is not a bucket name"),
            ("s3://a_b_c", "`a_b_c` is not a bucket name"),
            ("s3://a..b", "no two adjacent dots"),
            ("s3://192.168.5.4", "formatted as an IP address"),
            ("s3://xn--abc", "reserved by S3"),
            ("s3://abc-s3alias", "reserved by S3"),
            ("s3://bucket//x", "empty, `.` or `..` segment"),
            ("s3://bucket/a/../b", "empty, `.` or `..` segment"),
            ("s3://bucket/a?b", "has a `?`"),
            ("file://relative/dir", "is not an absolute directory"),
            ("file:/var/x", "is not a claim-check store"),
            ("file:///var/../etc", "is not a plain directory path"),
        ] {
            let err = Location::parse(store).unwrap_err();
            assert!(err.starts_with("store: `"), "{store}: {err}");
            assert!(err.contains(why), "{store}: {err}");
            assert!(
                err.ends_with("; write s3://bucket/prefix or file:///absolute/dir"),
                "{store}: {err}"
            );
        }
        let long = format!("s3://{}", "a".repeat(64));
        assert!(Location::parse(&long).is_err());
        assert!(Location::parse(&format!("s3://{}", "a".repeat(63))).is_ok());
    }

    #[test]
    fn keys_are_prefix_aggregate_type_and_event_id_with_the_type_percent_encoded() {
        let id = "01900000-0000-7000-8000-000000000001";
        assert_eq!(
            s3("b", "outbox/large").key("Order", ID),
            format!("outbox/large/Order/{id}")
        );
        assert_eq!(s3("b", "").key("Order", ID), format!("Order/{id}"));
        assert_eq!(
            s3("b", "p").key("Sales Order/ü+x_y.z-1", ID),
            format!("p/Sales%20Order%2F%C3%BC%2Bx_y.z-1/{id}")
        );
        assert_eq!(s3("b", "p").key("..", ID), format!("p/%2E%2E/{id}"));
        assert_eq!(s3("b", "p").key(".", ID), format!("p/%2E/{id}"));
        assert_eq!(s3("b", "p").key("a..b", ID), format!("p/a..b/{id}"));
        assert_eq!(s3("b", "p").key("", ID), format!("p/_/{id}"));
        let file = Location::File {
            dir: "/tmp/cc".into(),
        };
        let key = file.key("Order", ID);
        assert_eq!(key, format!("Order/{id}"));
        assert_eq!(file.url(&key), format!("file:///tmp/cc/Order/{id}"));
        assert_eq!(
            s3("b", "p").url("p/Order/x"),
            "s3://b/p/Order/x",
            "the URL holds the key as written"
        );
    }
}

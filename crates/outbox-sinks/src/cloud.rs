//! Rules shared by the cloud sinks (`docs/contract.md`, "The message on the broker"): ordering
//! keys that the service accepts, and bodies that a text-only service can carry.

use std::borrow::Cow;

use sha2::{Digest as _, Sha256};

/// Prefix of a digested key: `sha256:` and 64 lower-case hex digits (71 characters).
pub(crate) const DIGEST_PREFIX: &str = "sha256:";

/// `aggregate_id` itself when the service accepts it as an ordering key (at most `max_len`
/// bytes, every character `legal`, not empty), else `sha256:<hex of the UTF-8 bytes>`: stable
/// and collision-resistant, so one aggregate always maps to one key and two aggregates never
/// share one in practice. Never a lossy strip of characters, which could merge aggregates.
pub(crate) fn ordering_key(
    aggregate_id: &str,
    max_len: usize,
    legal: impl Fn(char) -> bool,
) -> Cow<'_, str> {
    if !aggregate_id.is_empty()
        && aggregate_id.len() <= max_len
        && !aggregate_id.starts_with(DIGEST_PREFIX)
        && aggregate_id.chars().all(legal)
    {
        Cow::Borrowed(aggregate_id)
    } else {
        Cow::Owned(digest(aggregate_id.as_bytes()))
    }
}

/// `sha256:` and the hex SHA-256 of `bytes`.
pub(crate) fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(DIGEST_PREFIX.len() + 64);
    out.push_str(DIGEST_PREFIX);
    for byte in hash {
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printable(c: char) -> bool {
        c.is_ascii_graphic()
    }

    #[test]
    fn a_legal_id_is_its_own_key() {
        assert_eq!(ordering_key("order-42", 128, printable), "order-42");
    }

    #[test]
    fn an_illegal_id_becomes_a_stable_digest_never_a_strip() {
        let a = ordering_key("caf\u{e9} 1", 128, printable);
        let b = ordering_key("caf 1", 128, printable);
        assert!(a.starts_with(DIGEST_PREFIX), "{a}");
        assert_eq!(a.len(), 71);
        assert_eq!(a, ordering_key("caf\u{e9} 1", 128, printable));
        assert_ne!(a, b, "a stripped id must not collide with the original");
        // sha256("") is well known: the digest is the plain SHA-256 of the UTF-8 bytes.
        assert_eq!(
            ordering_key("", 128, printable),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_long_id_or_one_that_looks_digested_is_digested() {
        let long = "x".repeat(129);
        assert!(ordering_key(&long, 128, printable).starts_with(DIGEST_PREFIX));
        assert_eq!(ordering_key(&"x".repeat(128), 128, printable).len(), 128);
        let spoof = digest(b"other");
        assert_ne!(ordering_key(&spoof, 128, printable), spoof);
    }
}

//! Percent-encoding of header values, as the HTTP and NATS bindings of CloudEvents require.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `value` percent-encoded per the HTTP and NATS bindings: space, `"`, `%` and every
/// character outside printable ASCII become `%XX` (upper-case hex) of their UTF-8 bytes.
/// Returns `value` itself when nothing needs encoding, else the encoding written to `buffer`.
pub fn percent_encode<'v>(value: &'v str, buffer: &'v mut String) -> &'v str {
    let needs = |b: u8| !(0x21..=0x7E).contains(&b) || b == b'"' || b == b'%';
    if !value.bytes().any(needs) {
        return value;
    }
    buffer.clear();
    for b in value.bytes() {
        if needs(b) {
            let _ = write!(buffer, "%{b:02X}");
        } else {
            buffer.push(char::from(b));
        }
    }
    buffer.as_str()
}

/// `value` percent-decoded (one round, as the HTTP and NATS bindings say), or `None` when
/// the result is not UTF-8. A `%` not followed by two hex digits stays as it is.
pub fn percent_decode(value: &str) -> Option<Cow<'_, str>> {
    if !value.contains('%') {
        return Some(Cow::Borrowed(value));
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let byte = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(byte).unwrap_or(0));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

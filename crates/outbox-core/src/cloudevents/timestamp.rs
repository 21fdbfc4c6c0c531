//! The `time` attribute: an RFC 3339 UTC timestamp written without allocating.

/// An RFC 3339 UTC timestamp (`2026-11-22T10:15:30.123456Z`, the fraction as long as needed),
/// formatted without allocating: this runs for every event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Timestamp {
    text: [u8; 30],
    len: usize,
}

impl Timestamp {
    /// `at` in UTC; `None` for a year RFC 3339 cannot write (before 0 or after 9999).
    pub(super) fn rfc3339(at: time::OffsetDateTime) -> Option<Self> {
        /// Writes `value` as `out.len()` decimal digits, zero-padded.
        fn digits(out: &mut [u8], mut value: u32) {
            for slot in out.iter_mut().rev() {
                *slot = b'0' + u8::try_from(value % 10).unwrap_or(0);
                value /= 10;
            }
        }
        let at = at.to_offset(time::UtcOffset::UTC);
        let year = u32::try_from(at.year()).ok().filter(|y| *y <= 9999)?;
        let mut text = *b"0000-00-00T00:00:00.000000000Z";
        digits(&mut text[0..4], year);
        digits(&mut text[5..7], u32::from(u8::from(at.month())));
        digits(&mut text[8..10], u32::from(at.day()));
        digits(&mut text[11..13], u32::from(at.hour()));
        digits(&mut text[14..16], u32::from(at.minute()));
        digits(&mut text[17..19], u32::from(at.second()));
        let mut nanos = at.nanosecond();
        let mut len = 19;
        if nanos != 0 {
            let mut width = 9;
            while nanos.is_multiple_of(10) {
                nanos /= 10;
                width -= 1;
            }
            digits(&mut text[20..20 + width], nanos);
            len = 20 + width;
        }
        text[len] = b'Z';
        Some(Self { text, len: len + 1 })
    }

    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text[..self.len]).unwrap_or_default()
    }
}

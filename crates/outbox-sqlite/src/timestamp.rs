//! Timestamps as stored: INTEGER Unix microseconds, UTC (see the migration for why).

use time::OffsetDateTime;

/// `t` as Unix microseconds, saturating far outside the representable range.
pub(crate) fn to_micros(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000).unwrap_or(if t.year() < 1970 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// Unix microseconds as a UTC time; out-of-range values (only a plain-SQL producer could
/// write them) clamp to the Unix epoch rather than fail the whole batch.
pub(crate) fn from_micros(us: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// A duration as microseconds, saturating.
pub(crate) fn duration_micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_round_trip() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_795_320_970_123_456_000)
            .expect("valid time");
        assert_eq!(to_micros(t), 1_795_320_970_123_456);
        assert_eq!(from_micros(to_micros(t)), t);
        assert_eq!(to_micros(OffsetDateTime::UNIX_EPOCH), 0);
        assert_eq!(from_micros(i64::MAX), OffsetDateTime::UNIX_EPOCH);
    }
}

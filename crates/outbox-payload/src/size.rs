//! [`ByteSize`]: `above = "200KiB"` in the config.

use std::fmt;
use std::str::FromStr;

/// A size in bytes, written `262144`, `"200KiB"`, `"5MiB"`, `"1GiB"`, `"200KB"` or `"1MB"`
/// (KiB/MiB/GiB are powers of 1024; KB/MB/GB of 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size as a `usize` (saturating on 32-bit targets).
    pub fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        let (digits, unit) = trimmed.split_at(split);
        let bad = || {
            format!(
                "`{text}` is not a size: write a number of bytes with an optional unit, e.g. \
                 \"200KiB\", \"5MiB\" or 262144"
            )
        };
        let number: u64 = digits.parse().map_err(|_| bad())?;
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            _ => return Err(bad()),
        };
        number.checked_mul(multiplier).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (size, unit) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"200KiB\" or a number of bytes")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("{v} is not a size: it is negative")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::ByteSize;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units_and_print_back() {
        assert_eq!("200KiB".parse(), Ok(ByteSize(200 * 1024)));
        assert_eq!("5MiB".parse(), Ok(ByteSize(5 << 20)));
        assert_eq!("1MB".parse(), Ok(ByteSize(1_000_000)));
        assert_eq!("262144".parse(), Ok(ByteSize(262_144)));
        assert_eq!(ByteSize(200 * 1024).to_string(), "200KiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
        let bad = "20 parsecs".parse::<ByteSize>().unwrap_err();
        assert!(bad.contains("`20 parsecs` is not a size"), "{bad}");
        assert!("".parse::<ByteSize>().is_err());
        assert!("99999999999999999999GiB".parse::<ByteSize>().is_err());
    }
}

//! Byte sizes in config files: an integer, or a string with a unit.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses "4096", "4k", "128KiB", "1.5GiB", "10GB": k/m/g/t and KiB..TiB
    /// are binary (as fio's and qemu's "4k"), kB/KB..TB are decimal (10^3..10^12).
    /// A fraction must come to a whole number of bytes.
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        let number_len = t
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len());
        let (number, unit) = (&t[..number_len], t[number_len..].trim());
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty()
            || fraction.contains('.')
            || (number.contains('.') && fraction.is_empty())
        {
            return Err(format!(
                "`{s}` is not a size like 4096, 128KiB, 1.5GiB or 10GB"
            ));
        }
        let multiplier = unit_multiplier(unit).ok_or_else(|| {
            format!("`{s}`: unknown unit `{unit}` (use KiB, MiB, GiB, TiB, or kB, MB, GB, TB)")
        })?;
        let too_large = || format!("`{s}` is too large");
        let whole: u64 = whole.parse().map_err(|_| too_large())?;
        let mut bytes = u128::from(whole) * u128::from(multiplier);
        if !fraction.is_empty() {
            let digits = u32::try_from(fraction.len()).map_err(|_| too_large())?;
            let scale = 10u128.checked_pow(digits).ok_or_else(too_large)?;
            let numerator: u128 = fraction.parse().map_err(|_| too_large())?;
            let scaled = numerator * u128::from(multiplier);
            if !scaled.is_multiple_of(scale) {
                return Err(format!("`{s}` is not a whole number of bytes"));
            }
            bytes += scaled / scale;
        }
        u64::try_from(bytes).map(ByteSize).map_err(|_| too_large())
    }
}

/// Bytes per unit: binary for k, KiB, ...; decimal for kB, KB, MB, ...
fn unit_multiplier(unit: &str) -> Option<u64> {
    let binary = |power: u32| Some(1u64 << (10 * power));
    let decimal = |power: u32| Some(1000u64.pow(power));
    match unit {
        "" | "b" | "B" => Some(1),
        "k" | "K" | "KiB" | "kiB" => binary(1),
        "m" | "M" | "MiB" => binary(2),
        "g" | "G" | "GiB" => binary(3),
        "t" | "T" | "TiB" => binary(4),
        "kB" | "KB" | "kb" => decimal(1),
        "MB" | "mb" => decimal(2),
        "GB" | "gb" => decimal(3),
        "TB" | "tb" => decimal(4),
        _ => None,
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if n >= 1 << shift && n.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a size: an integer number of bytes or a string like \"128KiB\" or \"10GB\"",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(ByteSize::parse("512"), Ok(ByteSize(512)));
        assert_eq!(ByteSize::parse("4k"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("128KiB"), Ok(ByteSize(128 << 10)));
        assert_eq!(ByteSize::parse("1G"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("1.5GiB"), Ok(ByteSize(3 << 29)));
        assert_eq!(ByteSize::parse("10GB"), Ok(ByteSize(10_000_000_000)));
        assert_eq!(ByteSize::parse("128KB"), Ok(ByteSize(128_000)));
        assert_eq!(ByteSize::parse("0.5k"), Ok(ByteSize(512)));
        assert!(ByteSize::parse("0.3k").is_err(), "307.2 bytes");
        assert!(ByteSize::parse("1.2.3k").is_err());
        assert!(ByteSize::parse("1.k").is_err());
        assert!(ByteSize::parse(".5k").is_err());
        assert_eq!(ByteSize::parse(" 2 MiB "), Ok(ByteSize(2 << 20)));
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("KiB").is_err());
        assert!(ByteSize::parse("99999999999999TiB").is_err());
        assert_eq!(ByteSize(1 << 30).to_string(), "1GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }
}

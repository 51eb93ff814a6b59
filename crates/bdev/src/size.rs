//! Byte sizes in config files: an integer, or a string with a binary unit.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses "4096", "4k", "4K", "4KiB", "128KB", "1GiB", "1g": units are binary.
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        if digits == 0 {
            return Err(format!("`{s}` is not a size like 4096, 128KiB or 1GiB"));
        }
        let n: u64 = t[..digits]
            .parse()
            .map_err(|_| format!("`{s}` is too large"))?;
        let unit = t[digits..].trim().to_ascii_lowercase();
        let shift = match unit.as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => {
                return Err(format!(
                    "`{s}`: unknown unit `{}` (use KiB, MiB, GiB, TiB)",
                    &t[digits..]
                ))
            }
        };
        n.checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| format!("`{s}` is too large"))
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
                f.write_str("a size: an integer number of bytes or a string like \"128KiB\"")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(ByteSize::parse("512"), Ok(ByteSize(512)));
        assert_eq!(ByteSize::parse("4k"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("128KiB"), Ok(ByteSize(128 << 10)));
        assert_eq!(ByteSize::parse("1G"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse(" 2 MiB "), Ok(ByteSize(2 << 20)));
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("KiB").is_err());
        assert!(ByteSize::parse("99999999999999TiB").is_err());
        assert_eq!(ByteSize(1 << 30).to_string(), "1GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }
}

//! Durations as users write them: `500ms`, `10s`, `5m`, `1h`, or sums like `1h30m`. The units
//! are those of Go's `time.ParseDuration`, so the CRD's CEL rules (`duration(...)`) read the
//! same strings; a day is `24h`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration {
    millis: i64,
}

impl Duration {
    pub const fn from_millis(millis: i64) -> Self {
        Self { millis }
    }

    pub const fn as_millis(self) -> i64 {
        self.millis
    }

    pub fn parse(input: &str) -> Result<Self, ApiError> {
        let fail = |reason| ApiError::Duration {
            input: input.to_owned(),
            reason,
        };
        let text = input.trim();
        if text.is_empty() {
            return Err(fail("empty; write e.g. 10s, 5m, 1h"));
        }
        let mut total: i64 = 0;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(fail("expected a number before each unit"));
            }
            let value: i64 = rest[..digits]
                .parse()
                .map_err(|_| fail("number too large"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "" => return Err(fail("missing unit (ms, s, m or h)")),
                _ => return Err(fail("unknown unit; use ms, s, m or h (a day is 24h)")),
            };
            rest = &rest[unit_len..];
            total = value
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(|| fail("too large"))?;
        }
        Ok(Self { millis: total })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [(3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms")];
        if self.millis == 0 {
            return f.write_str("0s");
        }
        let mut rest = self.millis;
        for (size, name) in units {
            if rest >= size {
                write!(f, "{}{}", rest / size, name)?;
                rest %= size;
            }
        }
        Ok(())
    }
}

/// In the CRD: a string of Go duration units, so CEL's `duration()` can read it.
impl schemars::JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^([0-9]+(ms|s|m|h))+$",
            "maxLength": 32,
        })
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums_and_prints_back() {
        for (text, ms) in [
            ("500ms", 500),
            ("10s", 10_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("24h", 86_400_000),
        ] {
            let d = Duration::parse(text).unwrap();
            assert_eq!(d.as_millis(), ms, "{text}");
            assert_eq!(d.to_string(), text);
        }
    }

    #[test]
    fn rejects_bad_text_with_a_reason() {
        for text in ["", "10", "s", "10x", "1d", "-5s", "99999999999999999999s"] {
            let err = Duration::parse(text).unwrap_err().to_string();
            assert!(err.contains(&format!("{text:?}")), "{err}");
        }
    }
}

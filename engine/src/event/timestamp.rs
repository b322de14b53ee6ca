//! Event times as RFC 3339 text and Unix milliseconds.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Parses an RFC 3339 timestamp to Unix milliseconds (sub-millisecond digits are truncated).
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

/// Formats Unix milliseconds as RFC 3339 in UTC, e.g. `2026-09-01T19:00:00Z`.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) => t.format(&Rfc3339).unwrap_or_else(|_| ms.to_string()),
        Err(_) => ms.to_string(),
    }
}

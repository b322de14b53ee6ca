//! One JSON event per line or Kafka message, parsed without copying where possible.
//!
//! `parse_event` only checks what a single event can tell about itself. Whether it is late,
//! too far in the future or of another metric depends on the pipeline and is decided there;
//! the reasons share one enum so that every component reports them alike.

mod flat;
mod reject;
mod timestamp;

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

pub use reject::RejectReason;
pub use timestamp::{format_rfc3339_ms, parse_rfc3339_ms};

/// Earliest accepted `event_time` (the Unix epoch). Bounding times at parse time keeps every
/// bucket, window and lateness computation far from the ends of `i64`.
pub const MIN_EVENT_TIME_MS: i64 = 0;
/// Latest accepted `event_time`: 9999-12-31T23:59:59.999Z.
pub const MAX_EVENT_TIME_MS: i64 = 253_402_300_799_999;
/// Largest accepted `cost`. Counts add saturating at `u64::MAX`, which this bound puts more
/// than four billion maximum-cost events of one key in one window away.
pub const MAX_COST: u64 = u32::MAX as u64;

/// Longest accepted event, in bytes: far above any real event, low enough that one record
/// cannot make a parser or a dead letter hold megabytes.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// A parsed event. Strings borrow from the input unless it contained escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    pub event_id: Option<Cow<'a, str>>,
    pub time_ms: i64,
    pub metric: Cow<'a, str>,
    pub scope: Cow<'a, str>,
    pub key: Cow<'a, str>,
    pub cost: u64,
}

#[derive(Deserialize, Default)]
struct RawEvent<'a> {
    #[serde(borrow, default)]
    event_id: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    event_time: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    metric: Option<Text<'a>>,
    #[serde(borrow, default)]
    scope: Option<Text<'a>>,
    #[serde(borrow, default)]
    key: Option<Text<'a>>,
    #[serde(borrow, default)]
    cost: Option<Scalar<'a>>,
}

/// Parses one event. `max_key_bytes` bounds the key's UTF-8 length.
pub fn parse_event(line: &str, max_key_bytes: usize) -> Result<Event<'_>, RejectReason> {
    parse_event_bytes(line.as_bytes(), max_key_bytes)
}

/// Parses one event from raw bytes, such as a Kafka payload; invalid UTF-8 is `invalid_json`.
pub fn parse_event_bytes(input: &[u8], max_key_bytes: usize) -> Result<Event<'_>, RejectReason> {
    if input.len() > MAX_EVENT_BYTES {
        return Err(RejectReason::OversizeEvent);
    }
    // Filled in place: the fields are moved once, into the event.
    let mut raw = RawEvent::default();
    if flat::scan(input, &mut raw).is_none() {
        raw = with_serde(input)?;
    }
    checked(raw, max_key_bytes)
}

/// [`parse_event_bytes`] with the key bound of a pipeline's config.
#[derive(Debug, Clone, Copy)]
pub struct EventParser {
    max_key_bytes: usize,
}

impl EventParser {
    pub fn new(max_key_bytes: usize) -> Self {
        Self { max_key_bytes }
    }

    #[inline]
    pub fn parse<'a>(&self, input: &'a [u8]) -> Result<Event<'a>, RejectReason> {
        parse_event_bytes(input, self.max_key_bytes)
    }
}

#[cold]
fn with_serde(input: &[u8]) -> Result<RawEvent<'_>, RejectReason> {
    // serde reads a struct from a JSON array too (its fields in order), which no producer
    // means as an event: only an object is one.
    if input.trim_ascii_start().first() != Some(&b'{') {
        return Err(RejectReason::InvalidJson);
    }
    serde_json::from_slice(input).map_err(|_| RejectReason::InvalidJson)
}

/// The field checks shared by both parsers.
#[inline(always)]
fn checked(raw: RawEvent<'_>, max_key_bytes: usize) -> Result<Event<'_>, RejectReason> {
    // Taken apart at once: each field is moved or dropped on its own, not the whole struct.
    let RawEvent {
        event_id,
        event_time,
        metric,
        scope,
        key,
        cost,
    } = raw;
    let metric = match metric {
        Some(Text(m)) if !m.is_empty() => m,
        _ => return Err(RejectReason::MissingMetric),
    };
    let key = match key {
        Some(Text(k)) if !k.is_empty() => k,
        _ => return Err(RejectReason::MissingKey),
    };
    if key.len() > max_key_bytes {
        return Err(RejectReason::OversizeKey);
    }
    let time_ms = event_time
        .as_ref()
        .and_then(Scalar::time_ms)
        .ok_or(RejectReason::InvalidTime)?;
    if !(MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&time_ms) {
        return Err(RejectReason::TimeOutOfRange);
    }
    let cost = match &cost {
        None => 1,
        Some(c) => c.cost().ok_or(RejectReason::InvalidCost)?,
    };
    if cost > MAX_COST {
        return Err(RejectReason::CostOutOfRange);
    }
    Ok(Event {
        event_id: event_id.and_then(Scalar::into_id),
        time_ms,
        metric,
        scope: scope.map_or(Cow::Borrowed(""), |Text(s)| s),
        key,
        cost,
    })
}

impl<'a> RawEvent<'a> {
    /// Whether the field was read already.
    #[inline(always)]
    fn has(&self, field: flat::Field) -> bool {
        use flat::Field;
        match field {
            Field::EventId => self.event_id.is_some(),
            Field::EventTime => self.event_time.is_some(),
            Field::Cost => self.cost.is_some(),
            Field::Metric => self.metric.is_some(),
            Field::Scope => self.scope.is_some(),
            Field::Key => self.key.is_some(),
            Field::Other => false,
        }
    }

    /// Stores a value read by the flat parser; `None` for a value the field cannot take there
    /// (a number as a metric, scope or key is serde's to reject).
    #[inline(always)]
    fn put(&mut self, field: flat::Field, value: Scalar<'a>) -> Option<()> {
        use flat::Field;
        let text = |value| match value {
            Scalar::Text(s) => Some(Some(Text(s))),
            _ => None,
        };
        match field {
            Field::EventId => self.event_id = Some(value),
            Field::EventTime => self.event_time = Some(value),
            Field::Cost => self.cost = Some(value),
            Field::Metric => self.metric = text(value)?,
            Field::Scope => self.scope = text(value)?,
            Field::Key => self.key = text(value)?,
            Field::Other => {}
        }
        Some(())
    }
}

/// A JSON string that borrows from the input unless it holds escapes. serde's own
/// `Option<Cow<str>>` always copies (its `borrow` attribute does not reach through `Option`),
/// which cost an allocation per field on the hot path.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A JSON value reduced to what the field checks need. Wrong types become `Other` instead of
/// failing the parse, so an event is rejected for the field at fault (`invalid_time`,
/// `invalid_cost`) rather than as unparseable JSON.
enum Scalar<'a> {
    Signed(i64),
    Unsigned(u64),
    Float(f64),
    Text(Cow<'a, str>),
    Other,
}

impl<'a> Scalar<'a> {
    /// `event_time`: epoch milliseconds (an integral number) or an RFC 3339 string.
    #[inline]
    fn time_ms(&self) -> Option<i64> {
        match self {
            Scalar::Signed(v) => Some(*v),
            Scalar::Unsigned(v) => i64::try_from(*v).ok(),
            Scalar::Float(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => Some(*v as i64),
            Scalar::Text(t) => parse_rfc3339_ms(t),
            _ => None,
        }
    }

    /// `cost`: a positive integer.
    #[inline]
    fn cost(&self) -> Option<u64> {
        match self {
            Scalar::Signed(v) => u64::try_from(*v).ok(),
            Scalar::Unsigned(v) => Some(*v),
            Scalar::Float(v) if v.fract() == 0.0 && (1.0..9.0e15).contains(v) => Some(*v as u64),
            _ => None,
        }
        .filter(|c| *c > 0)
    }

    /// `event_id`: a string, or an integer kept in its decimal form.
    #[inline]
    fn into_id(self) -> Option<Cow<'a, str>> {
        match self {
            Scalar::Text(t) => Some(t),
            Scalar::Signed(v) => Some(Cow::Owned(v.to_string())),
            Scalar::Unsigned(v) => Some(Cow::Owned(v.to_string())),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Signed(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Unsigned(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar<'de>, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Scalar<'de>, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Event<'_>, RejectReason> {
        parse_event(line, 16)
    }

    #[test]
    fn parses_full_event_with_rfc3339_time() {
        let e = parse(r#"{"event_id":"e1","event_time":"2026-09-01T19:00:00.5Z","metric":"m","scope":"eu","key":"a","cost":3}"#).unwrap();
        assert_eq!(e.time_ms, 1_788_289_200_500);
        assert_eq!(
            (e.metric.as_ref(), e.scope.as_ref(), e.key.as_ref(), e.cost),
            ("m", "eu", "a", 3)
        );
        assert_eq!(e.event_id.as_deref(), Some("e1"));
    }

    #[test]
    fn defaults_scope_and_cost_and_accepts_epoch_millis() {
        let e = parse(r#"{"event_id":7,"event_time":1000,"metric":"m","key":"k"}"#).unwrap();
        assert_eq!((e.time_ms, e.scope.as_ref(), e.cost), (1000, "", 1));
        assert_eq!(e.event_id.as_deref(), Some("7"));
    }

    #[test]
    fn rfc3339_offsets_are_honoured() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(format_rfc3339_ms(1_788_289_200_000), "2026-09-01T19:00:00Z");
    }

    #[test]
    fn every_bad_field_has_its_reason() {
        let cases = [
            ("not json", RejectReason::InvalidJson),
            (r#"{"event_time":1,"key":"k"}"#, RejectReason::MissingMetric),
            (r#"{"event_time":1,"metric":"m"}"#, RejectReason::MissingKey),
            (
                r#"{"event_time":1,"metric":"m","key":""}"#,
                RejectReason::MissingKey,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"0123456789abcdefX"}"#,
                RejectReason::OversizeKey,
            ),
            (r#"{"metric":"m","key":"k"}"#, RejectReason::InvalidTime),
            (
                r#"{"event_time":"yesterday","metric":"m","key":"k"}"#,
                RejectReason::InvalidTime,
            ),
            (
                r#"{"event_time":1.5,"metric":"m","key":"k"}"#,
                RejectReason::InvalidTime,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"k","cost":0}"#,
                RejectReason::InvalidCost,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"k","cost":-2}"#,
                RejectReason::InvalidCost,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"k","cost":1.5}"#,
                RejectReason::InvalidCost,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"k","cost":"3"}"#,
                RejectReason::InvalidCost,
            ),
            (
                r#"{"event_time":-1,"metric":"m","key":"k"}"#,
                RejectReason::TimeOutOfRange,
            ),
            (
                r#"{"event_time":9223372036854775807,"metric":"m","key":"k"}"#,
                RejectReason::TimeOutOfRange,
            ),
            (
                r#"{"event_time":253402300800000,"metric":"m","key":"k"}"#,
                RejectReason::TimeOutOfRange,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"k","cost":4294967296}"#,
                RejectReason::CostOutOfRange,
            ),
            (
                r#"{"event_time":1,"metric":"m","key":"k","cost":18446744073709551615}"#,
                RejectReason::CostOutOfRange,
            ),
        ];
        for (line, want) in cases {
            assert_eq!(parse(line).unwrap_err(), want, "{line}");
        }
        // Valid JSON, one byte too long: refused before it is read.
        let padding = " ".repeat(MAX_EVENT_BYTES);
        let long = format!(r#"{{"event_time":1,"metric":"m","key":"k"}}{padding}"#);
        assert_eq!(parse(&long).unwrap_err(), RejectReason::OversizeEvent);
        assert!(parse(&long[..MAX_EVENT_BYTES]).is_ok());
    }

    #[test]
    fn escaped_keys_are_unescaped() {
        let e = parse(r#"{"event_time":1,"metric":"m","key":"a\"b"}"#).unwrap();
        assert_eq!(e.key, "a\"b");
        assert!(matches!(e.key, Cow::Owned(_)));
    }

    #[test]
    fn plain_strings_borrow_from_the_input() {
        let e =
            parse(r#"{"event_time":1,"metric":"m","scope":"s","key":"k","event_id":"i"}"#).unwrap();
        for field in [&e.metric, &e.scope, &e.key, e.event_id.as_ref().unwrap()] {
            assert!(matches!(field, Cow::Borrowed(_)), "{field} was copied");
        }
    }

    #[test]
    fn invalid_utf8_is_invalid_json() {
        let mut bytes = br#"{"event_time":1,"metric":"m","key":"k"#.to_vec();
        bytes.extend_from_slice(&[0xff, b'"', b'}']);
        assert_eq!(
            parse_event_bytes(&bytes, 16),
            Err(RejectReason::InvalidJson)
        );
    }

    #[test]
    fn only_a_json_object_is_an_event() {
        for input in [
            r#"[null, 1, "m", "", "k", 1]"#,
            r#"[{"event_time":1,"metric":"m","key":"k"}]"#,
            r#" [1]"#,
            r#""m""#,
            "7",
            "null",
        ] {
            assert_eq!(parse(input), Err(RejectReason::InvalidJson), "{input}");
        }
        assert!(parse(r#" {"event_time":1,"metric":"m","key":"k"}"#).is_ok());
    }

    #[test]
    fn a_non_string_key_is_invalid_json() {
        assert_eq!(
            parse(r#"{"event_time":1,"metric":"m","key":7}"#),
            Err(RejectReason::InvalidJson)
        );
    }

    #[test]
    fn typical_events_take_the_fast_path_and_unusual_ones_do_not() {
        let typical = br#"{"event_time":1788289200000,"metric":"m","scope":"eu","key":"k","cost":2,"event_id":"e1"}"#;
        assert!(flat::scan(typical, &mut RawEvent::default()).is_some());
        for unusual in [
            &br#"{"event_time":1,"metric":"m","key":"a\"b"}"#[..],
            br#"{"event_time":1.5,"metric":"m","key":"k"}"#,
            br#"{"event_time":1,"metric":"m","key":"k","key":"k"}"#,
            br#"{"event_time":1,"metric":"m","key":"k","extra":[1]}"#,
            br#"{"event_time":1,"metric":"m","key":"k"} x"#,
        ] {
            assert!(
                flat::scan(unusual, &mut RawEvent::default()).is_none(),
                "{}",
                String::from_utf8_lossy(unusual)
            );
        }
    }

    mod flat_vs_serde {
        use proptest::prelude::*;

        use super::super::*;

        fn serde_only(input: &[u8]) -> Result<Event<'_>, RejectReason> {
            checked(with_serde(input)?, 8)
        }

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9 ]{0,6}".prop_map(|s| format!("\"{s}\"")),
                Just("\"a\\\"b\"".to_owned()),
                Just("\"\u{e9}t\u{e9}\"".to_owned()),
                Just("\"tab\there\"".to_owned()),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<u64>().prop_map(|n| n.to_string()),
                // One past u64 and i64: serde reads them as floats.
                Just("18446744073709551616".to_owned()),
                Just("-9223372036854775809".to_owned()),
                (0u32..3).prop_map(|n| format!("0{n}")),
                Just("-0".to_owned()),
                Just("-".to_owned()),
                Just("1.5".to_owned()),
                Just("2e3".to_owned()),
                Just("12abc".to_owned()),
                Just("true".to_owned()),
                Just("false".to_owned()),
                Just("null".to_owned()),
                Just("nul".to_owned()),
                Just("[1, {\"a\": 2}]".to_owned()),
                Just("{\"x\": \"y\"}".to_owned()),
                Just("\"2026-09-01T19:00:00Z\"".to_owned()),
            ]
        }

        fn field() -> impl Strategy<Value = String> {
            let name = prop_oneof![
                Just("event_id"),
                Just("event_time"),
                Just("metric"),
                Just("scope"),
                Just("key"),
                Just("cost"),
                Just("other"),
                Just("k\\u0065y"),
                // Longer and shorter than read names: not them.
                Just("keys"),
                Just("event_times"),
                Just("metri"),
            ];
            (
                name,
                value(),
                prop_oneof![Just(""), Just(" "), Just("\n\t")],
            )
                .prop_map(|(n, v, ws)| format!("{ws}\"{n}\"{ws}:{ws}{v}{ws}"))
        }

        fn object() -> impl Strategy<Value = Vec<u8>> {
            (
                prop::collection::vec(field(), 0..8),
                prop_oneof![Just(""), Just(" "), Just(" x"), Just("}"), Just(",")],
                any::<bool>(),
            )
                .prop_map(|(fields, tail, invalid_utf8)| {
                    let mut bytes = format!("{{{}}}{tail}", fields.join(",")).into_bytes();
                    if invalid_utf8 && bytes.len() > 4 {
                        let at = bytes.len() / 2;
                        bytes[at] = 0xff;
                    }
                    bytes
                })
        }

        fn typical() -> impl Strategy<Value = Vec<u8>> {
            (any::<i64>(), "[a-z]{0,3}", "[a-z]{0,10}", 0u64..5, any::<bool>()).prop_map(
                |(t, scope, key, cost, id)| {
                    let id = if id { format!(",\"event_id\":\"{t}\"") } else { String::new() };
                    format!(
                        "{{\"event_time\":{t},\"metric\":\"m\",\"scope\":\"{scope}\",\"key\":\"{key}\",\"cost\":{cost}{id}}}"
                    )
                    .into_bytes()
                },
            )
        }

        /// A typical event with one byte changed: close to a valid event without being one.
        fn near_typical() -> impl Strategy<Value = Vec<u8>> {
            let byte = prop_oneof![
                Just(b'"'),
                Just(b'\\'),
                Just(b' '),
                Just(b'\t'),
                Just(b'x'),
                Just(b','),
                Just(b'}'),
                Just(b':'),
                Just(b'0'),
                Just(b'.'),
                Just(0x01),
                Just(0xff),
            ];
            (typical(), any::<prop::sample::Index>(), byte).prop_map(|(mut event, at, byte)| {
                let at = at.index(event.len());
                event[at] = byte;
                event
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4000))]

            #[test]
            fn the_word_scan_finds_what_a_byte_scan_finds(
                bytes in (prop::collection::vec(
                    prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20, 0x20u8..0x80, 0x80u8..],
                    0..40,
                ), any::<bool>()).prop_map(|(mut v, plain_first)| {
                    // Long runs of plain bytes before the first match, half of the time.
                    if plain_first {
                        v.sort_by_key(|b| *b < 0x20 || *b == b'"' || *b == b'\\');
                    }
                    v
                })
            ) {
                let want = bytes.iter().position(|b| matches!(b, b'"' | b'\\' | 0..0x20));
                prop_assert_eq!(super::super::flat::string_end(&bytes), want);
            }

            #[test]
            fn leading_digits_reads_what_a_digit_loop_reads(
                bytes in prop::array::uniform8(prop_oneof![
                    6 => b'0'..=b'9',
                    1 => any::<u8>(),
                ])
            ) {
                let count = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
                let value = bytes[..count]
                    .iter()
                    .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
                let word = u64::from_le_bytes(bytes);
                prop_assert_eq!(super::super::flat::leading_digits(word), (count, value));
            }

            #[test]
            fn the_fast_path_answers_as_serde_does(input in prop_oneof![object(), typical(), near_typical()]) {
                prop_assert_eq!(parse_event_bytes(&input, 8), serde_only(&input));
            }
        }
    }
}

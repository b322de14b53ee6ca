//! A request body as events: JSON lines or one JSON array, each event's own text kept as
//! it came (it becomes the Kafka record's payload, which the workers parse).

use serde_json::value::RawValue;

/// How a body is written, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// One JSON object per line (`application/x-ndjson`, `application/jsonl`, `text/plain`, or
    /// no content type); blank lines are skipped.
    Lines,
    /// A JSON array of objects (`application/json`).
    Array,
}

/// Why a body cannot be read as events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error(
        "unsupported Content-Type {0:?}: send application/x-ndjson (JSON lines) or application/json (an array)"
    )]
    UnsupportedType(String),
    #[error("the body is not a JSON array of events: {0}")]
    NotAnArray(String),
    #[error("the body is not UTF-8 text")]
    NotText,
    #[error("{found} events in one request; at most {max} are taken")]
    TooManyEvents { found: usize, max: usize },
}

impl BodyFormat {
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, BodyError> {
        let Some(value) = content_type else {
            return Ok(Self::Lines);
        };
        let essence = value
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            ""
            | "application/x-ndjson"
            | "application/jsonl"
            | "application/json-lines"
            | "application/jsonlines"
            | "text/plain" => Ok(Self::Lines),
            "application/json" => Ok(Self::Array),
            _ => Err(BodyError::UnsupportedType(value.to_owned())),
        }
    }
}

/// The events of `body`, each as its text, at most `max_events` of them.
pub fn events(body: &[u8], format: BodyFormat, max_events: usize) -> Result<Vec<&str>, BodyError> {
    let text = std::str::from_utf8(body).map_err(|_| BodyError::NotText)?;
    let events: Vec<&str> = match format {
        BodyFormat::Lines => text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect(),
        BodyFormat::Array => {
            let items: Vec<&RawValue> =
                serde_json::from_str(text).map_err(|e| BodyError::NotAnArray(e.to_string()))?;
            items.into_iter().map(RawValue::get).collect()
        }
    };
    if events.len() > max_events {
        return Err(BodyError::TooManyEvents {
            found: events.len(),
            max: max_events,
        });
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_arrays_give_each_event_its_own_text() {
        let lines = b"{\"key\":\"a\"}\n\n  {\"key\":\"b\"}\r\n";
        assert_eq!(
            events(lines, BodyFormat::Lines, 10).unwrap(),
            ["{\"key\":\"a\"}", "{\"key\":\"b\"}"]
        );
        let array = br#"[{"key":"a"}, {"key": "b", "cost": 2}, "not an object"]"#;
        assert_eq!(
            events(array, BodyFormat::Array, 10).unwrap(),
            [
                r#"{"key":"a"}"#,
                r#"{"key": "b", "cost": 2}"#,
                r#""not an object""#
            ]
        );
    }

    #[test]
    fn bodies_that_are_not_events_say_why() {
        assert!(matches!(
            events(b"{\"key\":1}", BodyFormat::Array, 10),
            Err(BodyError::NotAnArray(_))
        ));
        assert_eq!(
            events(b"\xff\xfe", BodyFormat::Lines, 10),
            Err(BodyError::NotText)
        );
        assert_eq!(
            events(b"{}\n{}\n{}", BodyFormat::Lines, 2),
            Err(BodyError::TooManyEvents { found: 3, max: 2 })
        );
    }

    #[test]
    fn content_types_pick_the_format() {
        assert_eq!(BodyFormat::from_content_type(None), Ok(BodyFormat::Lines));
        assert_eq!(
            BodyFormat::from_content_type(Some("application/x-ndjson; charset=utf-8")),
            Ok(BodyFormat::Lines)
        );
        assert_eq!(
            BodyFormat::from_content_type(Some("Application/JSON")),
            Ok(BodyFormat::Array)
        );
        assert!(BodyFormat::from_content_type(Some("application/xml")).is_err());
    }
}

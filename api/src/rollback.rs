//! Rolling a list back: a request written as an annotation on the TopKMetric, so that the
//! Kubernetes API (and its RBAC: `patch` on `topkmetrics`) decides who may do it, and acted
//! on by every reducer replica, each once. The query API's port stays read-only.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use topk_engine::event::parse_rfc3339_ms;

/// The annotation holding the newest rollback request, as JSON.
pub const ROLLBACK_ANNOTATION: &str = "topk.io/rollback";

/// A request older than this when a reducer first sees it is refused: a replica started (or a
/// store rebuilt) long after the request must not point readers at an old list.
pub const ROLLBACK_MAX_AGE_MS: i64 = 15 * 60 * 1000;

/// Point one list back (or forward) at one of its stored versions, until the next
/// publication of that list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackRequest {
    pub window: String,
    /// The scope; `""` (the default) is the global list.
    #[serde(default)]
    pub scope: String,
    pub version: u64,
    /// When it was asked for (RFC 3339); it also tells two requests for the same version
    /// apart.
    pub requested_at: String,
}

/// What became of a rollback request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RollbackResult {
    /// The list points at the requested version.
    Applied,
    /// The version is not stored (never published, or removed by retention).
    NoSuchVersion,
    /// The annotation is not a request this metric can act on.
    Invalid,
    /// The request was older than 15 minutes when this reducer first saw it.
    Expired,
}

impl RollbackResult {
    pub const ALL: [Self; 4] = [
        Self::Applied,
        Self::NoSuchVersion,
        Self::Invalid,
        Self::Expired,
    ];

    /// The metric label (`topk_reducer_rollbacks_total{result}`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::NoSuchVersion => "no_such_version",
            Self::Invalid => "invalid",
            Self::Expired => "expired",
        }
    }
}

/// The newest rollback request a reducer handled, in the TopKMetric status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackStatus {
    #[serde(default)]
    pub window: String,
    #[serde(default)]
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,
    /// `Applied`, `NoSuchVersion`, `Invalid` or `Expired`.
    pub result: RollbackResult,
    pub message: String,
    /// When the reducer handled it (RFC 3339).
    pub handled_at: String,
}

impl RollbackRequest {
    /// A request made at `now_ms`.
    pub fn new(window: String, scope: String, version: u64, now_ms: i64) -> Self {
        Self {
            window,
            scope,
            version,
            requested_at: topk_engine::event::format_rfc3339_ms(now_ms),
        }
    }

    /// Reads an annotation's text and checks it against the metric's `windows` and the
    /// clock. Pure: every refusal is a result and a message for the status.
    pub fn judge(
        text: &str,
        windows: &[String],
        now_ms: i64,
    ) -> Result<Self, (RollbackResult, String)> {
        let invalid = |message: String| (RollbackResult::Invalid, message);
        let request: Self = serde_json::from_str(text).map_err(|e| {
            invalid(format!(
                "the {ROLLBACK_ANNOTATION} annotation is not a request \
                 ({{\"window\",\"scope\",\"version\",\"requestedAt\"}}): {e}"
            ))
        })?;
        if !windows.contains(&request.window) {
            return Err(invalid(format!(
                "unknown window {:?}; the metric has {windows:?}",
                request.window
            )));
        }
        let Some(at) = parse_rfc3339_ms(&request.requested_at) else {
            return Err(invalid(format!(
                "requestedAt {:?} is not an RFC 3339 time",
                request.requested_at
            )));
        };
        if now_ms.saturating_sub(at) > ROLLBACK_MAX_AGE_MS {
            return Err((
                RollbackResult::Expired,
                format!(
                    "requested at {}, more than 15 minutes before this reducer saw it; \
                     ask again if it still applies",
                    request.requested_at
                ),
            ));
        }
        Ok(request)
    }
}

impl RollbackStatus {
    /// What became of the request in the annotation `text`, with its fields when it reads as
    /// a request.
    pub fn new(text: &str, result: RollbackResult, message: String, handled_at: String) -> Self {
        let request = serde_json::from_str::<RollbackRequest>(text).ok();
        Self {
            window: request
                .as_ref()
                .map(|r| r.window.clone())
                .unwrap_or_default(),
            scope: request
                .as_ref()
                .map(|r| r.scope.clone())
                .unwrap_or_default(),
            version: request.as_ref().map(|r| r.version),
            requested_at: request.map(|r| r.requested_at),
            result,
            message,
            handled_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_790_000_000_000;

    fn windows() -> Vec<String> {
        vec!["1m".into(), "1h".into()]
    }

    fn at(ms: i64) -> String {
        topk_engine::event::format_rfc3339_ms(ms)
    }

    #[test]
    fn a_fresh_request_for_a_known_window_is_accepted() {
        let text = format!(
            r#"{{"window":"1h","scope":"eu","version":41,"requestedAt":"{}"}}"#,
            at(NOW - 1000)
        );
        let request = RollbackRequest::judge(&text, &windows(), NOW).expect("accepted");
        assert_eq!(
            (request.window.as_str(), request.scope.as_str()),
            ("1h", "eu")
        );
        assert_eq!(request.version, 41);
        let global = format!(
            r#"{{"window":"1m","version":2,"requestedAt":"{}"}}"#,
            at(NOW)
        );
        assert_eq!(
            RollbackRequest::judge(&global, &windows(), NOW).map(|r| r.scope),
            Ok(String::new())
        );
    }

    #[test]
    fn refusals_say_why() {
        let refuse = |text: &str| RollbackRequest::judge(text, &windows(), NOW).unwrap_err();
        let (result, message) = refuse("not json");
        assert_eq!(result, RollbackResult::Invalid);
        assert!(message.contains("is not a request"), "{message}");
        let (result, message) = refuse(&format!(
            r#"{{"window":"9h","version":1,"requestedAt":"{}"}}"#,
            at(NOW)
        ));
        assert_eq!(result, RollbackResult::Invalid);
        assert!(message.contains("unknown window \"9h\""), "{message}");
        let (_, message) = refuse(r#"{"window":"1m","version":1,"requestedAt":"yesterday"}"#);
        assert!(message.contains("not an RFC 3339 time"), "{message}");
        let (_, message) = refuse(&format!(
            r#"{{"window":"1m","version":1,"requestedAt":"{}","force":true}}"#,
            at(NOW)
        ));
        assert!(message.contains("force"), "{message}");
        let (result, message) = refuse(&format!(
            r#"{{"window":"1m","version":1,"requestedAt":"{}"}}"#,
            at(NOW - ROLLBACK_MAX_AGE_MS - 1)
        ));
        assert_eq!(result, RollbackResult::Expired);
        assert!(message.contains("ask again"), "{message}");
    }
}

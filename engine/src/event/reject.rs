//! Why an event was not counted: one enum, so that every component reports alike.

use std::fmt;

/// Why an event was not counted. Every variant has a stable label for metrics and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    InvalidJson,
    MissingMetric,
    OtherMetric,
    MissingKey,
    OversizeKey,
    InvalidTime,
    FutureTime,
    Late,
    InvalidCost,
    /// An `event_time` outside [`MIN_EVENT_TIME_MS`, `MAX_EVENT_TIME_MS`] (1970 to year 9999).
    ///
    /// [`MIN_EVENT_TIME_MS`]: crate::event::MIN_EVENT_TIME_MS
    /// [`MAX_EVENT_TIME_MS`]: crate::event::MAX_EVENT_TIME_MS
    TimeOutOfRange,
    /// A `cost` above [`MAX_COST`](crate::event::MAX_COST).
    CostOutOfRange,
    /// An event (a Kafka record's payload or a line of input) longer than
    /// [`MAX_EVENT_BYTES`](crate::event::MAX_EVENT_BYTES).
    OversizeEvent,
    /// A `scope` longer than the config's `max_scope_bytes`.
    OversizeScope,
    /// A scope new to its shard when the shard already holds `max_scopes` of them.
    TooManyScopes,
    /// On a partition other than the one Kafka's default partitioner gives its key: the
    /// producer used another partitioner, and counting it would give the key two owners.
    WrongShard,
}

impl RejectReason {
    pub const ALL: [RejectReason; 15] = [
        RejectReason::InvalidJson,
        RejectReason::MissingMetric,
        RejectReason::OtherMetric,
        RejectReason::MissingKey,
        RejectReason::OversizeKey,
        RejectReason::InvalidTime,
        RejectReason::FutureTime,
        RejectReason::Late,
        RejectReason::InvalidCost,
        RejectReason::TimeOutOfRange,
        RejectReason::CostOutOfRange,
        RejectReason::OversizeEvent,
        RejectReason::OversizeScope,
        RejectReason::TooManyScopes,
        RejectReason::WrongShard,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::InvalidJson => "invalid_json",
            RejectReason::MissingMetric => "missing_metric",
            RejectReason::OtherMetric => "other_metric",
            RejectReason::MissingKey => "missing_key",
            RejectReason::OversizeKey => "oversize_key",
            RejectReason::InvalidTime => "invalid_time",
            RejectReason::FutureTime => "future_time",
            RejectReason::Late => "late",
            RejectReason::InvalidCost => "invalid_cost",
            RejectReason::TimeOutOfRange => "time_out_of_range",
            RejectReason::CostOutOfRange => "cost_out_of_range",
            RejectReason::OversizeEvent => "oversize_event",
            RejectReason::OversizeScope => "oversize_scope",
            RejectReason::TooManyScopes => "too_many_scopes",
            RejectReason::WrongShard => "wrong_shard",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

//! Where a shard's saved next offset stands against its partition, and where it reads on:
//! pure, so that every case is a unit test.

use topk_api::manifest::NewTopicPolicy;

/// Where a shard's next offset stands against its partition's retained offsets
/// `[low, high)`; [`InputPosition::resume`] says where the shard reads on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputPosition {
    /// Retained (or the end): resume there.
    Retained,
    /// Older than the oldest retained offset: `lost` offsets were deleted by retention before
    /// they were read.
    Expired { lost: i64 },
    /// Past the end of the same topic (its id unchanged): the partition was truncated (an
    /// unclean leader election, a lost replica). Everything below the end was counted.
    Truncated,
    /// Past the partition's end where the broker gives no topic id: truncated, or re-created
    /// with fewer records, which offsets cannot tell apart.
    BeyondEnd,
    /// Of another topic than the one the state counted (its id changed: deleted and created
    /// again, restored from a backup, a mirror), wherever its offsets stand.
    Recreated,
}

/// Where a shard reads on (see [`InputPosition::resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    At(i64),
    /// Nothing of the partition is read (a new topic under `onNewTopic: refuse`).
    Hold,
}

impl InputPosition {
    /// Where `next_offset`, saved while reading the topic `counted` (its id, if known), stands
    /// in the topic `current` now is, whose partition holds `[low, high)`.
    pub fn of(
        next_offset: i64,
        (counted, current): (Option<&str>, Option<&str>),
        low: i64,
        high: i64,
    ) -> Self {
        let same_topic = counted.zip(current).map(|(a, b)| a == b);
        if same_topic == Some(false) {
            Self::Recreated
        } else if next_offset < low {
            Self::Expired {
                lost: low - next_offset,
            }
        } else if next_offset > high {
            if same_topic == Some(true) {
                Self::Truncated
            } else {
                Self::BeyondEnd
            }
        } else {
            Self::Retained
        }
    }

    /// Where the shard reads on from `next_offset` in a partition holding `[low, high)`. No
    /// position makes it read an offset it may have counted: a truncated partition, or one
    /// whose id cannot be told, is read from its end; a new topic as `policy` says.
    pub fn resume(self, next_offset: i64, low: i64, high: i64, policy: NewTopicPolicy) -> Resume {
        match self {
            Self::Retained => Resume::At(next_offset),
            Self::Expired { .. } => Resume::At(low),
            Self::Truncated | Self::BeyondEnd => Resume::At(high),
            Self::Recreated => match policy {
                NewTopicPolicy::Refuse => Resume::Hold,
                NewTopicPolicy::FromStart => Resume::At(low),
                NewTopicPolicy::FromEnd => Resume::At(high),
            },
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retained => "retained",
            Self::Expired { .. } => "expired",
            Self::Truncated => "truncated",
            Self::BeyondEnd => "beyond_end",
            Self::Recreated => "recreated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{InputPosition, NewTopicPolicy, Resume};

    #[test]
    fn a_next_offset_outside_the_retained_range_is_named() {
        let same = (Some("id"), Some("id"));
        assert_eq!(InputPosition::of(5, same, 0, 10), InputPosition::Retained);
        assert_eq!(InputPosition::of(10, same, 0, 10), InputPosition::Retained);
        assert_eq!(InputPosition::of(0, same, 0, 0), InputPosition::Retained);
        assert_eq!(
            InputPosition::of(3, same, 8, 10),
            InputPosition::Expired { lost: 5 }
        );
        assert_eq!(InputPosition::of(11, same, 0, 10), InputPosition::Truncated);
        // A re-created, empty partition whose id is not known.
        assert_eq!(
            InputPosition::of(500, (None, Some("new")), 0, 0),
            InputPosition::BeyondEnd
        );
    }

    #[test]
    fn another_topic_id_is_a_recreated_topic_wherever_its_offsets_stand() {
        for (next, low, high) in [(5, 0, 10), (500, 0, 0), (3, 8, 10)] {
            assert_eq!(
                InputPosition::of(next, (Some("old"), Some("new")), low, high),
                InputPosition::Recreated
            );
        }
    }

    #[test]
    fn no_position_resumes_below_an_offset_the_shard_may_have_counted() {
        let policies = [
            NewTopicPolicy::Refuse,
            NewTopicPolicy::FromStart,
            NewTopicPolicy::FromEnd,
        ];
        for policy in policies {
            // A truncated partition: everything below its end was counted.
            assert_eq!(
                InputPosition::Truncated.resume(11, 0, 10, policy),
                Resume::At(10)
            );
            // Truncated or re-created, offsets cannot tell: nothing there is read twice.
            assert_eq!(
                InputPosition::BeyondEnd.resume(500, 0, 20, policy),
                Resume::At(20)
            );
            assert_eq!(
                InputPosition::Expired { lost: 5 }.resume(3, 8, 10, policy),
                Resume::At(8)
            );
            assert_eq!(
                InputPosition::Retained.resume(5, 0, 10, policy),
                Resume::At(5)
            );
        }
        // A new topic id: as the policy says, held by default.
        let recreated = |policy| InputPosition::Recreated.resume(5, 0, 10, policy);
        assert_eq!(recreated(NewTopicPolicy::default()), Resume::Hold);
        assert_eq!(recreated(NewTopicPolicy::FromStart), Resume::At(0));
        assert_eq!(recreated(NewTopicPolicy::FromEnd), Resume::At(10));
    }
}

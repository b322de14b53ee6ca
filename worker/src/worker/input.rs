//! The input side of the owned shards: where the consumer reads each from, where a saved
//! offset resumes (reported when input may be missed), consumer lag, and the input topic's id.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use topk_api::manifest::NewTopicPolicy;
use topk_api::report::{LossKind, ShardLoss};
use topk_runtime::control::Report;
use topk_runtime::now_ms;

use super::position::{InputPosition, Resume};
use super::{Owned, Worker};
use crate::error::Error;
use crate::metrics::{KindLabel, ShardLabel};

/// Where [`Worker::resume_offset`] left a shard.
pub(super) struct Resumed {
    pub(super) next_offset: i64,
    /// The input topic's id the state counts from now on.
    pub(super) topic_id: Option<String>,
    pub(super) held: bool,
}

impl Resumed {
    fn at(next_offset: i64, topic_id: Option<String>) -> Self {
        Self {
            next_offset,
            topic_id,
            held: false,
        }
    }
}

/// Where a shard's input has been read to: its next offset, or the consumer's position when
/// that has moved past offsets that are not messages (see [`Worker::positions`]).
pub(super) fn read_to(positions: &BTreeMap<i32, i64>, shard: u32, owned: &Owned) -> i64 {
    positions
        .get(&(shard as i32))
        .map_or(owned.next_offset, |at| owned.next_offset.max(*at))
}

pub(super) const LAG_CHECK_EVERY: Duration = Duration::from_secs(10);

impl Worker {
    /// Has the consumer read every owned shard from its next offset.
    pub(super) fn assign_owned(&self) -> Result<(), Error> {
        let mut tpl = TopicPartitionList::new();
        for (shard, owned) in self.owned.iter().filter(|(_, o)| !o.held) {
            tpl.add_partition_offset(
                &self.sink.settings.input_topic,
                *shard as i32,
                Offset::Offset(owned.next_offset),
            )?;
        }
        self.input.consumer().assign(&tpl)?;
        self.probe
            .watch(self.owned.keys().map(|shard| *shard as i32).collect());
        Ok(())
    }

    /// The input topic's id now, if the broker gives one; `None` (so offsets alone decide)
    /// when it cannot be read.
    pub(super) fn input_topic_id(&self) -> Option<String> {
        let topic = &self.sink.settings.input_topic;
        self.input
            .topic_id(topic, Duration::from_secs(10))
            .unwrap_or_else(|err| {
                tracing::warn!(%err, "cannot read the input topic's id; offsets alone decide");
                None
            })
    }

    /// Where a shard resumes from `next_offset`, saved while counting the topic whose id is
    /// `counted`: there if the partition still holds it, else as [`InputPosition::resume`]
    /// decides, counted, logged and (where input may be missed) reported.
    pub(super) fn resume_offset(
        &self,
        shard: u32,
        next_offset: i64,
        counted: Option<&str>,
    ) -> Result<Resumed, Error> {
        let current = self.input_topic_id();
        self.resumed_at.set(Instant::now());
        let watermarks = self.input.consumer().fetch_watermarks(
            &self.sink.settings.input_topic,
            shard as i32,
            Duration::from_secs(10),
        );
        let (low, high) = match watermarks {
            Ok(range) => range,
            Err(err) => {
                // Checked again by the broker itself: an offset out of range comes back as
                // an error message, handled by `resume_out_of_range`.
                tracing::warn!(shard, %err, "cannot read the partition's offsets; resuming as saved");
                return Ok(Resumed::at(
                    next_offset,
                    counted.map(str::to_owned).or(current),
                ));
            }
        };
        let position = InputPosition::of(next_offset, (counted, current.as_deref()), low, high);
        if position == InputPosition::Retained {
            return Ok(Resumed::at(
                next_offset,
                current.or(counted.map(str::to_owned)),
            ));
        }
        let policy = self.sink.settings.on_new_topic;
        let resume = position.resume(next_offset, low, high, policy);
        let metrics = &self.sink.health.metrics;
        metrics
            .input_gaps
            .get_or_create(&KindLabel {
                kind: position.as_str(),
            })
            .inc();
        let at = match resume {
            Resume::At(offset) => format!("reading on at offset {offset}"),
            Resume::Hold => "reading nothing of it until source.onNewTopic says how".to_owned(),
        };
        tracing::error!(
            shard,
            next_offset,
            low,
            high,
            counted_topic_id = counted,
            topic_id = current.as_deref(),
            position = position.as_str(),
            "the shard's next offset is outside its partition; {at}"
        );
        let detail = format!("saved offset {next_offset}, partition holds {low}..{high}; {at}");
        match position {
            InputPosition::Expired { lost } => {
                metrics.input_offsets_lost.inc_by(lost as u64);
                self.report_loss(shard, LossKind::Expired, lost as u64, detail);
            }
            InputPosition::BeyondEnd => self.report_loss(shard, LossKind::BeyondEnd, 0, detail),
            InputPosition::Recreated => {
                let policy = format!("{detail} (source.onNewTopic: {})", policy.as_str());
                self.report_loss(shard, LossKind::Recreated, 0, policy);
            }
            // Everything the truncated partition held was counted: nothing is missed.
            InputPosition::Truncated | InputPosition::Retained => {}
        }
        Ok(match resume {
            Resume::At(offset) => Resumed::at(offset, current),
            // The state keeps the id it counted, so the same decision is made on a restart.
            Resume::Hold => Resumed {
                next_offset,
                topic_id: counted.map(str::to_owned),
                held: true,
            },
        })
    }

    /// Moves shards whose offset the broker reported out of range to where
    /// [`Self::resume_offset`] says, and reads them again.
    pub(super) fn resume_out_of_range(&mut self, shards: &[u32]) -> Result<(), Error> {
        for shard in shards {
            let Some((next_offset, counted)) = self
                .owned
                .get(shard)
                .map(|o| (o.next_offset, o.input_topic_id.clone()))
            else {
                continue;
            };
            let resumed = self.resume_offset(*shard, next_offset, counted.as_deref())?;
            if let Some(owned) = self.owned.get_mut(shard) {
                owned.next_offset = resumed.next_offset;
                owned.input_topic_id = resumed.topic_id;
                owned.held = resumed.held;
            }
        }
        self.assign_owned()
    }

    /// Whether the input partition of `shard` still holds its first offset (0), so that
    /// counting it from the start misses nothing; false when that cannot be read.
    pub(super) fn input_starts_at_zero(&self, shard: u32) -> bool {
        self.input
            .consumer()
            .fetch_watermarks(
                &self.sink.settings.input_topic,
                shard as i32,
                Duration::from_secs(10),
            )
            .is_ok_and(|(low, _)| low == 0)
    }

    /// The consumer's position per input partition. Past the last message counted, a
    /// partition may hold offsets never delivered as messages (a transactional producer's
    /// markers, aborted events, as on the combiners' partials): the position has moved past
    /// those, so they are neither lag nor unread input.
    pub(super) fn positions(&self) -> BTreeMap<i32, i64> {
        self.input
            .consumer()
            .position()
            .map(|list| {
                list.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(at) => Some((e.partition(), at)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Consumer lag per shard, against the high watermarks the fetches brought (no request
    /// to the broker: a slow one never holds the counting thread here).
    pub(super) fn measure_lag(&mut self) {
        let positions = self.positions();
        let topic = &self.sink.settings.input_topic;
        for (shard, owned) in &self.owned {
            if let Some(high) = self.input.cached_high(topic, *shard as i32) {
                let read_to = read_to(&positions, *shard, owned);
                self.sink
                    .health
                    .metrics
                    .consumer_lag
                    .get_or_create(&ShardLabel { shard: *shard })
                    .set((high - read_to).max(0));
            }
        }
        self.last_lag_check = Instant::now();
    }

    /// Catches the one re-creation of the input topic the broker cannot report: deleted and
    /// created again under the running worker, and refilled past a shard's next offset before
    /// the shard fetched again, it is read on from there without an out-of-range answer, its
    /// start unread. Its new id tells: the gap is counted and reported (how many offsets went
    /// unread is not known). Under `onNewTopic: refuse` the shard is held there instead. A
    /// shard whose offset is past the new end is left to the broker's out-of-range answer.
    /// The id and the partition's end come from [`topk_runtime::input::InputProbe`], so that a
    /// slow broker never holds the counting thread here.
    pub(super) fn check_input_topic(&mut self) -> Result<(), Error> {
        // An id asked before the newest resume may be older than what that resume found.
        let Some(current) = self.probe.topic_id_since(self.resumed_at.get()) else {
            return Ok(());
        };
        let hold = self.sink.settings.on_new_topic == NewTopicPolicy::Refuse;
        let mut missed = Vec::new();
        for (shard, owned) in &mut self.owned {
            if owned.held || owned.input_topic_id.as_ref() == Some(&current) {
                continue;
            }
            if let Some(counted) = &owned.input_topic_id {
                match self.probe.high_of_topic_id(*shard as i32) {
                    Some(high) if owned.next_offset <= high => {
                        missed.push((*shard, counted.clone(), owned.next_offset));
                        if hold {
                            // Keeps the id it counted: a restart decides the same.
                            owned.held = true;
                            continue;
                        }
                    }
                    _ => continue,
                }
            }
            owned.input_topic_id = Some(current.clone());
        }
        if hold && !missed.is_empty() {
            self.assign_owned()?;
        }
        for (shard, counted, next_offset) in missed {
            self.sink
                .health
                .metrics
                .input_gaps
                .get_or_create(&KindLabel {
                    kind: InputPosition::Recreated.as_str(),
                })
                .inc();
            tracing::error!(
                shard,
                counted_topic_id = counted,
                topic_id = current,
                next_offset,
                held = hold,
                "the input topic was created again under the running worker"
            );
            let detail = if hold {
                format!(
                    "re-created while running; reading nothing of it from offset {next_offset} until source.onNewTopic says how"
                )
            } else {
                format!(
                    "re-created while running; offsets of the new partition below {next_offset} may be uncounted"
                )
            };
            self.report_loss(shard, LossKind::Recreated, 0, detail);
        }
        Ok(())
    }

    /// Tells the operator that a shard's counts miss input (the metric turns `Degraded`).
    pub(super) fn report_loss(
        &self,
        shard: u32,
        kind: LossKind,
        offsets_lost: u64,
        detail: String,
    ) {
        let _ = self.reports.send(Report::Loss(ShardLoss {
            shard,
            kind,
            offsets_lost,
            at_ms: now_ms(),
            detail,
        }));
    }
}

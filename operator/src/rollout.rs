//! The order of a rescale, as a pure step function. Scale up: grow the StatefulSet, wait for
//! the new workers to be ready, then move shards to them. Scale down: move shards off the
//! departing ordinals first, wait until the departing workers report that they released them
//! (or the drain period ends; epochs fence them from then on), then shrink.

use topk_api::assignment::AssignmentTable;

use topk_api::assignment::planner::plan;

/// What the reconciler observes and decides a rescale step from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed<'a> {
    pub shards: u32,
    /// `spec.workers.replicas`, already clamped to 1..=shards.
    pub desired_workers: u32,
    pub table: Option<&'a AssignmentTable>,
    /// Ready replicas of the worker StatefulSet.
    pub ready_workers: u32,
    /// Milliseconds since the assignment table last changed (None: unknown, e.g. new).
    pub table_age_ms: Option<i64>,
    /// How long a departing worker gets to release its shards before it is removed.
    pub drain_ms: i64,
    /// Every worker at or above the desired ordinal has reported the current table version.
    pub departing_released: bool,
}

/// A rescale step that waits on something outside the operator, and so has a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    WaitingForWorkers,
    Draining,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::WaitingForWorkers => "WaitingForWorkers",
            Phase::Draining => "Draining",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Replicas to give the worker StatefulSet now.
    pub statefulset_replicas: u32,
    /// The table to write (equal to the current one when nothing moves).
    pub table: AssignmentTable,
    /// What is going on, for the `Progressing` condition; None when settled.
    pub progress: Option<String>,
    /// The waiting step in progress, if any.
    pub phase: Option<Phase>,
}

/// Workers the table spreads shards over (highest owner ordinal + 1).
pub fn table_workers(table: &AssignmentTable) -> u32 {
    table.shards.iter().map(|o| o.worker + 1).max().unwrap_or(0)
}

pub fn step(o: &Observed<'_>) -> Step {
    let desired = o.desired_workers.clamp(1, o.shards.max(1));
    let Some(current) = o.table.filter(|t| t.shards.len() == o.shards as usize) else {
        return Step {
            statefulset_replicas: desired,
            table: plan(o.shards, o.table, desired),
            progress: None,
            phase: None,
        };
    };
    let spread = table_workers(current);
    if desired > spread {
        if o.ready_workers < desired {
            return Step {
                statefulset_replicas: desired,
                table: current.clone(),
                progress: Some(format!(
                    "scaling up: waiting for {desired} ready workers ({} ready) before moving shards",
                    o.ready_workers
                )),
                phase: Some(Phase::WaitingForWorkers),
            };
        }
        let next = plan(o.shards, Some(current), desired);
        let moved = moved(current, &next);
        return Step {
            statefulset_replicas: desired,
            table: next,
            progress: (moved > 0)
                .then(|| format!("scaling up: moved {moved} shards to new workers")),
            phase: None,
        };
    }
    if desired < spread {
        let next = plan(o.shards, Some(current), desired);
        let moved = moved(current, &next);
        return Step {
            statefulset_replicas: spread,
            table: next,
            progress: Some(format!(
                "scaling down: moved {moved} shards off workers {desired}..{}; draining",
                spread - 1
            )),
            phase: Some(Phase::Draining),
        };
    }
    // The table already fits the desired workers; departed ordinals may still be running
    // until they report their shards released or the drain period ends.
    let draining = o.ready_workers > desired
        && !o.departing_released
        && o.table_age_ms.is_some_and(|age| age < o.drain_ms);
    let next = plan(o.shards, Some(current), desired);
    Step {
        statefulset_replicas: if draining { o.ready_workers } else { desired },
        progress: draining.then(|| {
            format!(
                "scaling down: waiting for {} departing worker(s) to release their shards",
                o.ready_workers - desired
            )
        }),
        phase: draining.then_some(Phase::Draining),
        table: next,
    }
}

fn moved(a: &AssignmentTable, b: &AssignmentTable) -> usize {
    a.shards
        .iter()
        .zip(&b.shards)
        .filter(|(x, y)| x.worker != y.worker)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(
        table: Option<&AssignmentTable>,
        desired: u32,
        ready: u32,
        age: Option<i64>,
    ) -> Observed<'_> {
        Observed {
            shards: 4,
            desired_workers: desired,
            table,
            ready_workers: ready,
            table_age_ms: age,
            drain_ms: 30_000,
            departing_released: false,
        }
    }

    #[test]
    fn scale_up_grows_first_and_moves_shards_only_once_ready() {
        let two = plan(4, None, 2);
        let s = step(&observed(Some(&two), 3, 2, Some(60_000)));
        assert_eq!((s.statefulset_replicas, &s.table), (3, &two));
        assert!(s.progress.unwrap().contains("waiting for 3 ready workers"));
        let s = step(&observed(Some(&two), 3, 3, Some(60_000)));
        assert_eq!(table_workers(&s.table), 3);
        assert_eq!(s.table.version, two.version + 1);
    }

    #[test]
    fn scale_down_moves_shards_first_then_shrinks_after_the_drain() {
        let three = plan(4, Some(&plan(4, None, 2)), 3);
        let three = plan(4, Some(&three), 3);
        let s = step(&observed(Some(&three), 2, 3, Some(60_000)));
        assert_eq!(
            s.statefulset_replicas, 3,
            "departing worker kept while it drains"
        );
        assert_eq!(table_workers(&s.table), 2);
        let moved = s.table.clone();
        let s = step(&observed(Some(&moved), 2, 3, Some(1_000)));
        assert_eq!(s.statefulset_replicas, 3, "still draining");
        assert_eq!(s.phase, Some(Phase::Draining));
        let s = step(&observed(Some(&moved), 2, 3, Some(31_000)));
        assert_eq!((s.statefulset_replicas, s.progress), (2, None));
    }

    #[test]
    fn scale_down_shrinks_as_soon_as_departing_workers_report_release() {
        let three = plan(4, Some(&plan(4, None, 3)), 3);
        let two = plan(4, Some(&three), 2);
        let mut o = observed(Some(&two), 2, 3, Some(1_000));
        assert_eq!(step(&o).statefulset_replicas, 3);
        o.departing_released = true;
        let s = step(&o);
        assert_eq!((s.statefulset_replicas, s.phase), (2, None));
    }
}

//! Shard assignment planning: a pure function from (shards, current table, worker replicas) to
//! the next table. Balanced (worker shard counts differ by at most one), with the fewest
//! moves, and every moved shard's epoch bumped so that its previous owner is fenced. It lives
//! beside the table, not in the operator, so that the fuzz target for tables read from a
//! ConfigMap reaches it without the operator's Kubernetes and Kafka clients.

use super::{AssignmentTable, ShardOwner};

/// The next assignment for `workers` replicas. Returns the current table unchanged (same
/// version) when it is already balanced over exactly those workers.
pub fn plan(shards: u32, current: Option<&AssignmentTable>, workers: u32) -> AssignmentTable {
    let workers = workers.clamp(1, shards.max(1));
    let Some(current) = current.filter(|c| c.shards.len() == shards as usize) else {
        return AssignmentTable {
            version: current.map_or(1, |c| c.version.saturating_add(1)),
            shards: (0..shards)
                .map(|shard| ShardOwner {
                    shard,
                    worker: shard % workers,
                    epoch: 1,
                })
                .collect(),
        };
    };

    // Quotas: `shards % workers` workers carry one extra shard. Giving the extras to the workers
    // that already hold the most shards keeps the most shards in place.
    let mut held = vec![0u32; workers as usize];
    for owner in &current.shards {
        if owner.worker < workers {
            held[owner.worker as usize] += 1;
        }
    }
    let base = shards / workers;
    let extra = (shards % workers) as usize;
    let mut by_load: Vec<u32> = (0..workers).collect();
    by_load.sort_by_key(|w| (std::cmp::Reverse(held[*w as usize]), *w));
    let mut quota = vec![base; workers as usize];
    for w in by_load.iter().take(extra) {
        quota[*w as usize] += 1;
    }

    // Keep each shard where it is while its worker is within quota; the rest move.
    let mut kept = vec![0u32; workers as usize];
    let mut next = current.shards.clone();
    // Positions in the table, not shard ids: a table is read as it is, never indexed by it.
    let mut homeless = Vec::new();
    for (at, owner) in next.iter_mut().enumerate() {
        let w = owner.worker as usize;
        if owner.worker < workers && kept[w] < quota[w] {
            kept[w] += 1;
        } else {
            homeless.push(at);
        }
    }
    if homeless.is_empty() {
        return current.clone();
    }
    let mut open = (0..workers).flat_map(|w| {
        let free = quota[w as usize] - kept[w as usize];
        std::iter::repeat_n(w, free as usize)
    });
    for at in homeless {
        let owner = &mut next[at];
        // Quotas sum to `shards`, so every homeless shard finds a place.
        owner.worker = open.next().unwrap_or(0);
        owner.epoch = owner.epoch.saturating_add(1);
    }
    AssignmentTable {
        version: current.version.saturating_add(1),
        shards: next,
    }
}

/// What is wrong with `table` as the assignment of a metric with `shards` shards, whose
/// workers run as ordinals below `workers`, after the operator wrote version `floor`; `None`
/// when nothing. A table the operator wrote always passes: ids 0..shards in order, every
/// owner a running ordinal, every epoch between 1 and the version (each table change raises
/// the version by one and a shard's epoch by at most one), and no version below one written.
pub fn table_problem(
    table: &AssignmentTable,
    shards: u32,
    workers: u32,
    floor: Option<u64>,
) -> Option<String> {
    if table.shards.len() != shards as usize {
        return Some(format!(
            "it lists {} shards, the metric has {shards}",
            table.shards.len()
        ));
    }
    if let Some(floor) = floor.filter(|floor| table.version < *floor) {
        return Some(format!(
            "its version {} is below {floor}, already written (status.assignmentVersion)",
            table.version
        ));
    }
    for (at, owner) in table.shards.iter().enumerate() {
        if owner.shard as usize != at {
            return Some(format!("entry {at} is shard {}", owner.shard));
        }
        if owner.worker >= workers {
            return Some(format!(
                "shard {at} is owned by worker {}, past the {workers} workers",
                owner.worker
            ));
        }
        if owner.epoch == 0 || owner.epoch > table.version {
            return Some(format!(
                "shard {at} has epoch {}, outside 1..={}",
                owner.epoch, table.version
            ));
        }
    }
    None
}

/// A new table for `workers` replicas that follows every table up to version `after`: its
/// version is the next, and so is every shard's epoch (no earlier epoch was above `after`),
/// so that every previous owner is fenced and readers take it as the newest.
pub fn fresh_table(shards: u32, workers: u32, after: u64) -> AssignmentTable {
    let version = after.saturating_add(1);
    let mut table = plan(shards, None, workers);
    table.version = version;
    for owner in &mut table.shards {
        owner.epoch = version;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(owners: &[u32]) -> AssignmentTable {
        AssignmentTable {
            version: 7,
            shards: owners
                .iter()
                .enumerate()
                .map(|(s, w)| ShardOwner {
                    shard: s as u32,
                    worker: *w,
                    epoch: 3 + s as u64 % 2,
                })
                .collect(),
        }
    }

    /// Most shards that can stay put under any balanced assignment: try every choice of which
    /// workers get the extra shard.
    fn best_possible_stays(current: &AssignmentTable, shards: u32, workers: u32) -> u32 {
        let mut held = vec![0u32; workers as usize];
        for o in &current.shards {
            if o.worker < workers {
                held[o.worker as usize] += 1;
            }
        }
        let (base, extra) = (shards / workers, shards % workers);
        (0u32..1 << workers)
            .filter(|mask| mask.count_ones() == extra)
            .map(|mask| {
                (0..workers)
                    .map(|w| held[w as usize].min(base + (mask >> w & 1)))
                    .sum::<u32>()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn first_plan_spreads_round_robin_at_epoch_one() {
        let t = plan(5, None, 2);
        let owners: Vec<_> = t.shards.iter().map(|o| (o.worker, o.epoch)).collect();
        assert_eq!(owners, vec![(0, 1), (1, 1), (0, 1), (1, 1), (0, 1)]);
        assert_eq!(t.version, 1);
    }

    #[test]
    fn a_balanced_table_is_left_alone() {
        let t = table(&[0, 1, 0, 1]);
        assert_eq!(plan(4, Some(&t), 2), t);
    }

    proptest! {
        #[test]
        fn plans_are_balanced_minimal_and_fence_every_move(
            (shards, owners) in (1u32..24).prop_flat_map(|n| (Just(n), prop::collection::vec(0u32..8, n as usize))),
            workers in 1u32..8,
        ) {
            let current = table(&owners);
            let next = plan(shards, Some(&current), workers);
            let workers = workers.min(shards);
            let mut counts = vec![0u32; workers as usize];
            for o in &next.shards {
                prop_assert!(o.worker < workers, "shard {} on departed worker {}", o.shard, o.worker);
                counts[o.worker as usize] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(max - min <= 1, "unbalanced: {counts:?}");

            let mut moves = 0;
            for (before, after) in current.shards.iter().zip(&next.shards) {
                prop_assert!(after.epoch >= before.epoch, "epoch went down");
                if before.worker == after.worker {
                    prop_assert_eq!(after.epoch, before.epoch, "unmoved shard {} re-epoched", before.shard);
                } else {
                    prop_assert_eq!(after.epoch, before.epoch + 1);
                    moves += 1;
                }
            }
            prop_assert_eq!(moves, shards - best_possible_stays(&current, shards, workers));
            prop_assert_eq!(next.version, if moves == 0 { current.version } else { current.version + 1 });
            // Planning again changes nothing.
            prop_assert_eq!(&plan(shards, Some(&next), workers), &next);
        }

        #[test]
        fn every_table_the_planner_writes_passes_the_check(
            shards in 1u32..24,
            steps in prop::collection::vec(1u32..8, 1..6),
            after in prop::option::of(0u64..1_000),
        ) {
            let mut written = match after {
                Some(after) => fresh_table(shards, steps[0], after),
                None => plan(shards, None, steps[0]),
            };
            let floor = written.version;
            for workers in steps {
                written = plan(shards, Some(&written), workers);
                prop_assert_eq!(table_problem(&written, shards, workers.min(shards), Some(floor)), None);
            }
        }

        #[test]
        fn any_table_read_is_planned_or_refused_without_a_panic(
            shards in 1u32..16,
            owners in prop::collection::vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..20),
            version in prop_oneof![any::<u64>(), Just(u64::MAX), Just(0)],
            workers in 1u32..8,
            floor in prop::option::of(any::<u64>()),
        ) {
            let table = AssignmentTable {
                version,
                shards: owners
                    .into_iter()
                    .map(|(shard, worker, epoch)| ShardOwner { shard, worker, epoch })
                    .collect(),
            };
            let next = plan(shards, Some(&table), workers);
            prop_assert_eq!(next.shards.len(), shards as usize);
            if table_problem(&table, shards, workers, floor).is_none() {
                prop_assert!(next.shards.iter().all(|o| o.worker < workers));
            }
        }
    }

    #[test]
    fn a_fresh_table_fences_every_earlier_epoch() {
        let fresh = fresh_table(4, 2, 9);
        assert_eq!(fresh.version, 10);
        assert!(fresh.shards.iter().all(|o| o.epoch == 10 && o.worker < 2));
        assert_eq!(table_problem(&fresh, 4, 2, Some(9)), None);
        let mut bad = fresh.clone();
        bad.shards[3].shard = 99;
        assert!(table_problem(&bad, 4, 2, None).is_some());
        let mut bad = fresh.clone();
        bad.shards[0].worker = 1_000_000;
        assert!(table_problem(&bad, 4, 2, None).is_some());
        assert!(table_problem(&fresh, 4, 2, Some(11)).is_some());
        assert!(table_problem(&fresh, 5, 2, None).is_some());
    }
}

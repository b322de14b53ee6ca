//! Shard assignment planning: a pure function from (shards, current table, worker replicas) to
//! the next table. Balanced (worker shard counts differ by at most one), with the fewest
//! moves, and every moved shard's epoch bumped so that its previous owner is fenced.

use topk_api::assignment::{AssignmentTable, ShardOwner};

/// The next assignment for `workers` replicas. Returns the current table unchanged (same
/// version) when it is already balanced over exactly those workers.
pub fn plan(shards: u32, current: Option<&AssignmentTable>, workers: u32) -> AssignmentTable {
    let workers = workers.clamp(1, shards.max(1));
    let Some(current) = current.filter(|c| c.shards.len() == shards as usize) else {
        return AssignmentTable {
            version: current.map_or(1, |c| c.version + 1),
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
    let mut homeless = Vec::new();
    for owner in next.iter_mut() {
        let w = owner.worker as usize;
        if owner.worker < workers && kept[w] < quota[w] {
            kept[w] += 1;
        } else {
            homeless.push(owner.shard);
        }
    }
    if homeless.is_empty() {
        return current.clone();
    }
    let mut open = (0..workers).flat_map(|w| {
        let free = quota[w as usize] - kept[w as usize];
        std::iter::repeat_n(w, free as usize)
    });
    for shard in homeless {
        let owner = &mut next[shard as usize];
        // Quotas sum to `shards`, so every homeless shard finds a place.
        owner.worker = open.next().unwrap_or(0);
        owner.epoch += 1;
    }
    AssignmentTable {
        version: current.version + 1,
        shards: next,
    }
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
    }
}

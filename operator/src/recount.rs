//! Scheduling of the hourly exact recount, as a pure function of (clock, settings, what the
//! status remembers, the Jobs that exist). Each closed hour gets a Job with a deterministic name
//! per (hour, attempt); failed hours are retried with exponential backoff; `exactUntil` moves
//! only over a contiguous run of succeeded hours. Hours that fall behind the backfill horizon
//! before they were recounted are given up with a warning, and the exact run restarts after them
//! (`exactFrom`), rather than stalling `exactUntil` forever.

use std::collections::{BTreeMap, BTreeSet};

pub const HOUR_MS: i64 = 3_600_000;
/// The first retry waits this long; each further one twice as long, up to `RETRY_MAX_MS`.
const RETRY_BASE_MS: i64 = 60_000;
const RETRY_MAX_MS: i64 = HOUR_MS;
/// After this many failed Jobs for one hour the metric reports `Degraded` (retries go on).
pub const DEGRADED_AFTER_ATTEMPTS: u32 = 3;

pub fn floor_hour(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS) * HOUR_MS
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub grace_ms: i64,
    pub backfill_ms: i64,
    pub max_concurrent: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    /// Failed for good (its pod retries are spent). The backoff before the next attempt runs
    /// from when the operator first sees the failure, on its own clock.
    Failed,
}

/// A recount Job as observed in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObservedJob {
    pub hour_ms: i64,
    pub attempt: u32,
    pub state: JobState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub attempts: u32,
    pub last_ms: i64,
}

/// What the status remembers between reconciles (Jobs are deleted by their TTL).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    pub exact_from_ms: Option<i64>,
    /// Every hour in `[exact_from, exact_until)` has been recounted.
    pub exact_until_ms: Option<i64>,
    /// Recounted hours after `exact_until`.
    pub succeeded: BTreeSet<i64>,
    pub failures: BTreeMap<i64, Failure>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Jobs to create now: (hour, attempt).
    pub create: Vec<(i64, u32)>,
    pub memory: Memory,
    pub running: u32,
    /// Hours `[from, to)` given up because they fell behind the backfill horizon.
    pub abandoned: Option<(i64, i64)>,
    /// The oldest hour that failed at least `DEGRADED_AFTER_ATTEMPTS` times, with its attempts.
    pub failing: Option<(i64, u32)>,
    /// When something is next due (an hour closes or a retry's backoff ends).
    pub next_due_ms: i64,
}

fn backoff_ms(attempts: u32) -> i64 {
    let doublings = attempts.saturating_sub(1).min(30);
    (RETRY_BASE_MS << doublings).min(RETRY_MAX_MS)
}

/// Decides the recount step at `now_ms` for a metric created at `created_ms`.
pub fn plan(
    now_ms: i64,
    created_ms: i64,
    settings: &Settings,
    memory: &Memory,
    jobs: &[ObservedJob],
) -> Plan {
    // Hour H is closed once H + 1h + grace has passed.
    let closed_end = floor_hour(now_ms - settings.grace_ms);
    let horizon = floor_hour(now_ms - settings.backfill_ms);
    let mut memory = memory.clone();
    let mut exact_until = memory.exact_until_ms.unwrap_or(floor_hour(created_ms));
    let mut exact_from = memory.exact_from_ms.unwrap_or(exact_until);
    let mut abandoned = None;
    if exact_until < horizon {
        abandoned = Some((exact_until, horizon));
        exact_until = horizon;
        exact_from = horizon;
    }
    memory.succeeded.retain(|h| *h >= exact_until);
    memory.failures.retain(|h, _| *h >= exact_until);

    // The newest attempt seen per hour decides its state; older attempts are history.
    let mut latest: BTreeMap<i64, ObservedJob> = BTreeMap::new();
    for job in jobs.iter().filter(|j| j.hour_ms >= exact_until) {
        let slot = latest.entry(job.hour_ms).or_insert(*job);
        if job.attempt > slot.attempt {
            *slot = *job;
        }
        if job.state == JobState::Failed {
            let failure = memory.failures.entry(job.hour_ms).or_insert(Failure {
                attempts: 0,
                last_ms: now_ms,
            });
            if job.attempt > failure.attempts {
                *failure = Failure {
                    attempts: job.attempt,
                    last_ms: now_ms,
                };
            }
        }
    }
    for job in latest.values() {
        if job.state == JobState::Succeeded {
            memory.succeeded.insert(job.hour_ms);
            memory.failures.remove(&job.hour_ms);
        }
    }
    while memory.succeeded.remove(&exact_until) {
        exact_until += HOUR_MS;
    }

    let mut running = 0;
    let mut wanted = Vec::new();
    let mut next_due_ms = closed_end + HOUR_MS + settings.grace_ms;
    let mut hour = exact_until;
    while hour < closed_end {
        if !memory.succeeded.contains(&hour) {
            match latest.get(&hour).map(|j| j.state) {
                Some(JobState::Running) => running += 1,
                _ => match memory.failures.get(&hour) {
                    None => wanted.push((hour, 1)),
                    Some(f) => {
                        let due = f.last_ms + backoff_ms(f.attempts);
                        if now_ms >= due {
                            wanted.push((hour, f.attempts + 1));
                        } else {
                            next_due_ms = next_due_ms.min(due);
                        }
                    }
                },
            }
        }
        hour += HOUR_MS;
    }
    let room = settings.max_concurrent.saturating_sub(running) as usize;
    let create: Vec<_> = wanted.into_iter().take(room).collect();
    let failing = memory
        .failures
        .iter()
        .find(|(_, f)| f.attempts >= DEGRADED_AFTER_ATTEMPTS)
        .map(|(h, f)| (*h, f.attempts));
    memory.exact_from_ms = Some(exact_from);
    memory.exact_until_ms = Some(exact_until);
    Plan {
        running: running + create.len() as u32,
        create,
        memory,
        abandoned,
        failing,
        next_due_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: i64 = 1_000 * HOUR_MS;
    const MIN: i64 = 60_000;

    fn settings(max_concurrent: u32) -> Settings {
        Settings {
            grace_ms: 5 * MIN,
            backfill_ms: 24 * HOUR_MS,
            max_concurrent,
        }
    }

    fn job(hour: i64, attempt: u32, state: JobState) -> ObservedJob {
        ObservedJob {
            hour_ms: T0 + hour * HOUR_MS,
            attempt,
            state,
        }
    }

    #[test]
    fn an_hour_is_recounted_only_after_its_grace() {
        let p = plan(
            T0 + HOUR_MS + 4 * MIN,
            T0,
            &settings(2),
            &Memory::default(),
            &[],
        );
        assert!(p.create.is_empty());
        assert_eq!(p.next_due_ms, T0 + HOUR_MS + 5 * MIN);
        let p = plan(
            T0 + HOUR_MS + 5 * MIN,
            T0,
            &settings(2),
            &Memory::default(),
            &[],
        );
        assert_eq!(p.create, vec![(T0, 1)]);
        assert_eq!(p.memory.exact_until_ms, Some(T0));
    }

    #[test]
    fn backfill_is_oldest_first_and_bounded_by_concurrency() {
        let now = T0 + 5 * HOUR_MS + 10 * MIN;
        let p = plan(now, T0, &settings(2), &Memory::default(), &[]);
        assert_eq!(p.create, vec![(T0, 1), (T0 + HOUR_MS, 1)]);
        let jobs = [job(0, 1, JobState::Running), job(1, 1, JobState::Succeeded)];
        let p = plan(now, T0, &settings(2), &Memory::default(), &jobs);
        assert_eq!(p.create, vec![(T0 + 2 * HOUR_MS, 1)]);
        assert_eq!(p.running, 2);
        assert_eq!(p.memory.exact_until_ms, Some(T0), "hour 0 still running");
        assert!(p.memory.succeeded.contains(&(T0 + HOUR_MS)));
    }

    #[test]
    fn exact_until_moves_over_contiguous_successes_and_survives_job_ttl() {
        let now = T0 + 3 * HOUR_MS + 10 * MIN;
        let jobs = [
            job(1, 1, JobState::Succeeded),
            job(2, 1, JobState::Succeeded),
        ];
        let p = plan(now, T0, &settings(1), &Memory::default(), &jobs);
        assert_eq!(p.memory.exact_until_ms, Some(T0));
        // The Jobs are gone (TTL); hour 0 then succeeds: the remembered hours count.
        let p = plan(
            now,
            T0,
            &settings(1),
            &p.memory,
            &[job(0, 1, JobState::Succeeded)],
        );
        assert_eq!(p.memory.exact_until_ms, Some(T0 + 3 * HOUR_MS));
        assert!(p.memory.succeeded.is_empty() && p.create.is_empty());
    }

    #[test]
    fn failures_are_retried_with_growing_backoff_and_reported() {
        let seen = T0 + HOUR_MS + 6 * MIN;
        let jobs = vec![job(0, 1, JobState::Failed)];
        let p = plan(seen, T0, &settings(2), &Memory::default(), &jobs);
        assert!(p.create.is_empty(), "backoff not over");
        assert_eq!(p.next_due_ms, seen + MIN);
        let p = plan(seen + MIN - 1, T0, &settings(2), &p.memory, &jobs);
        assert!(p.create.is_empty(), "the failure is dated when first seen");
        let now = seen + MIN;
        let p = plan(now, T0, &settings(2), &p.memory, &jobs);
        assert_eq!(p.create, vec![(T0, 2)]);
        let jobs = vec![job(0, 1, JobState::Failed), job(0, 2, JobState::Failed)];
        let p = plan(now, T0, &settings(2), &p.memory, &jobs);
        let p = plan(now + 2 * MIN - 1, T0, &settings(2), &p.memory, &jobs);
        assert!(p.create.is_empty(), "second backoff is twice the first");
        assert_eq!(p.failing, None);
        let p = plan(now + 2 * MIN, T0, &settings(2), &p.memory, &jobs);
        assert_eq!(p.create, vec![(T0, 3)]);
        let jobs = vec![job(0, 3, JobState::Failed)];
        let p = plan(now + 3 * MIN, T0, &settings(2), &p.memory, &jobs);
        assert_eq!(p.failing, Some((T0, 3)));
        assert_eq!(
            p.memory.exact_until_ms,
            Some(T0),
            "a failed hour blocks exactUntil"
        );
    }
    #[test]
    fn hours_behind_the_backfill_horizon_are_given_up_once() {
        let memory = Memory {
            exact_from_ms: Some(T0),
            exact_until_ms: Some(T0 + HOUR_MS),
            ..Memory::default()
        };
        let now = T0 + 30 * HOUR_MS + 10 * MIN;
        let p = plan(now, T0, &settings(2), &memory, &[]);
        let horizon = T0 + 6 * HOUR_MS;
        assert_eq!(p.abandoned, Some((T0 + HOUR_MS, horizon)));
        assert_eq!(p.memory.exact_from_ms, Some(horizon));
        assert_eq!(p.create[0], (horizon, 1));
        let again = plan(now, T0, &settings(2), &p.memory, &[]);
        assert_eq!(again.abandoned, None);
    }

    /// Jobs in a simulated cluster finish in a random order (some fail and are retried, and
    /// finished Jobs may disappear by TTL); whatever happens, exactUntil is exactly the longest
    /// prefix of succeeded hours, no more than `max_concurrent` Jobs run, only closed hours are
    /// recounted, and no (hour, attempt) Job is created twice.
    #[derive(Debug, Clone)]
    enum Outcome {
        Succeed,
        Fail,
        Wait,
    }

    proptest! {
        #[test]
        fn exact_until_is_the_contiguous_prefix_of_succeeded_hours(
            outcomes in proptest::collection::vec(
                prop_oneof![Just(Outcome::Succeed), Just(Outcome::Fail), Just(Outcome::Wait)], 1..200),
            max_concurrent in 1u32..4,
            ttl_forgets in any::<bool>(),
        ) {
            // A backfill longer than the simulation: abandonment has its own test.
            let s = Settings { backfill_ms: 1_000 * HOUR_MS, ..settings(max_concurrent) };
            let mut memory = Memory::default();
            let mut jobs: Vec<ObservedJob> = Vec::new();
            let mut succeeded_ever = BTreeSet::new();
            let mut now = T0 + 10 * MIN;
            for (step, outcome) in outcomes.iter().cycle().take(400).enumerate() {
                now += 7 * MIN;
                let p = plan(now, T0, &s, &memory, &jobs);
                prop_assert!(p.running <= max_concurrent);
                for (hour, attempt) in &p.create {
                    prop_assert!(*hour + HOUR_MS + s.grace_ms <= now, "only closed hours");
                    prop_assert!(!jobs.iter().any(|j| j.hour_ms == *hour && j.attempt == *attempt));
                    jobs.push(ObservedJob { hour_ms: *hour, attempt: *attempt, state: JobState::Running });
                }
                memory = p.memory;
                let until = memory.exact_until_ms.unwrap_or(T0);
                let mut prefix = T0;
                while succeeded_ever.contains(&prefix) { prefix += HOUR_MS; }
                prop_assert_eq!(until, prefix);
                if ttl_forgets && step.is_multiple_of(5) {
                    jobs.retain(|j| j.state == JobState::Running);
                }
                // One running Job finishes per step.
                if let Some(j) = jobs.iter_mut().find(|j| j.state == JobState::Running) {
                    match outcome {
                        Outcome::Succeed => { j.state = JobState::Succeeded; succeeded_ever.insert(j.hour_ms); }
                        Outcome::Fail => j.state = JobState::Failed,
                        Outcome::Wait => {}
                    }
                }
            }
        }
    }
}

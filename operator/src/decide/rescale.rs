//! The rescale step: which shards move, when a step is done, and the assignment table read back and checked.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable, planner};

use crate::builders::{RescaleStep, Settings, TABLE_CHANGED_AT};
use crate::error::Error;

use crate::rollout::{self, Observed};

use super::*;

/// What the rescale step decided: the objects' inputs and where the step stands.
pub(super) struct Rescale {
    pub(super) rollout: RescaleStep,
    pub(super) step: rollout::Step,
    /// Shards the new table moves to another worker, when the table changes.
    pub(super) shard_moves: Option<u64>,
    /// Why the table found was not used (a new one replaces it): the `InvalidAssignment`
    /// problem.
    pub(super) invalid_table: Option<String>,
}

/// The rescale step of a metric with workers: the rollout the objects are built from and
/// where the step stands. A changed table is noted, with the shards it moves.
pub(super) fn rescale_step(
    o: &Observation,
    settings: &Settings,
    notes: &mut Vec<Note>,
) -> Result<Rescale, Error> {
    let metric = &o.metric;
    let at = &o.now;
    let shards = metric.spec.shards();
    let desired_workers = metric.spec.workers.as_ref().map_or(1, |w| w.replicas);
    let running_workers = count(o.worker.as_ref().and_then(|s| s.spec.as_ref()?.replicas));
    let written = metric.status.as_ref().and_then(|s| s.assignment_version);
    let (table, invalid_table) = checked_table(
        o.assignment.as_ref(),
        shards,
        desired_workers.max(running_workers),
        written,
    );
    let table = table.or_else(|| {
        // No usable table after one was written: a new one continues the old versions and
        // epochs, so that workers and reducers take it and fence every previous owner.
        invalid_table.as_ref().map(|(_, after)| {
            planner::fresh_table(shards, desired_workers.clamp(1, shards.max(1)), *after)
        })
    });
    let invalid_table = invalid_table.map(|(why, _)| why);
    let changed_at = o
        .assignment
        .as_ref()
        .and_then(|cm| cm.annotations().get(TABLE_CHANGED_AT).cloned());
    let table_age_ms = changed_at.as_deref().and_then(|text| {
        let changed = text.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
        Some(at.0.duration_since(changed).as_millis() as i64)
    });
    let ready_workers = ready_replicas(o.worker.as_ref());
    let departing_released = table.as_ref().is_none_or(|t| {
        all_released(
            o.worker_reports.as_ref(),
            desired_workers..running_workers,
            t.version,
        )
    });
    let step = rollout::step(&Observed {
        shards,
        desired_workers,
        table: table.as_ref(),
        ready_workers,
        table_age_ms,
        drain_ms: settings.drain.as_millis() as i64,
        departing_released,
    });

    let mut shard_moves = None;
    // A replaced table is written whatever the step makes of the new one.
    let table_changed = invalid_table.is_some() || table.as_ref() != Some(&step.table);
    let rollout = RescaleStep {
        worker_replicas: step.statefulset_replicas,
        table: step.table.clone(),
        table_changed_at: if table_changed {
            Some(at.0.to_string())
        } else {
            changed_at
        },
        replaces: if table_changed {
            o.assignment
                .as_ref()
                .and_then(|cm| cm.metadata.resource_version.clone())
        } else {
            None
        },
    };
    if let Some(old) = table
        .as_ref()
        .filter(|_| table_changed && invalid_table.is_none())
    {
        let moved = old
            .shards
            .iter()
            .zip(&step.table.shards)
            .filter(|(a, b)| a.worker != b.worker)
            .count();
        shard_moves = Some(moved as u64);
        notes.push(Note::normal(
            "ShardsMoved",
            format!(
                "moved {moved} of {shards} shards (assignment version {}, each moved shard at a new epoch); {}",
                step.table.version,
                step.progress.clone().unwrap_or_else(|| "settled".into())
            ),
        ));
    }
    if let Some(why) = &invalid_table {
        notes.push(Note::warning(
            "InvalidAssignment",
            format!(
                "{why}; wrote assignment version {} instead",
                step.table.version
            ),
        ));
    }
    Ok(Rescale {
        rollout,
        step,
        shard_moves,
        invalid_table,
    })
}

/// The assignment table in `cm`, if it is one the operator can go on from; else why not,
/// with the highest version or epoch it or the status (`written`) names, which a new table
/// must pass. No ConfigMap before any table was written is a new metric: neither.
pub(super) fn checked_table(
    cm: Option<&ConfigMap>,
    shards: u32,
    workers: u32,
    written: Option<u64>,
) -> (Option<AssignmentTable>, Option<(String, u64)>) {
    let floor = written.unwrap_or(0);
    let read = match cm {
        Some(cm) => read_table(cm),
        None => Ok(None),
    };
    match read {
        Ok(Some(table)) => match planner::table_problem(&table, shards, workers, written) {
            None => (Some(table), None),
            Some(why) => {
                let highest = table.shards.iter().map(|o| o.epoch).max().unwrap_or(0);
                let after = floor.max(table.version).max(highest);
                (
                    None,
                    Some((format!("the assignment table is invalid: {why}"), after)),
                )
            }
        },
        Ok(None) => match written {
            Some(version) => (
                None,
                Some((
                    format!("the assignment table (version {version}) is gone"),
                    version,
                )),
            ),
            None => (None, None),
        },
        Err(err) => (None, Some((err.to_string(), floor))),
    }
}

pub(super) fn read_table(cm: &ConfigMap) -> Result<Option<AssignmentTable>, Error> {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(ASSIGNMENT_KEY)) else {
        return Ok(None);
    };
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| Error::Assignment(cm.name_any(), e))
}

/// Whether every worker ordinal in `departing` has reported (in the worker-reports ConfigMap,
/// key `worker-N`, value `{"assignmentVersion": V}`) that it applied table `version` or newer,
/// i.e. released the shards moved off it.
pub(super) fn all_released(
    reports: Option<&ConfigMap>,
    mut departing: std::ops::Range<u32>,
    version: u64,
) -> bool {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Report {
        assignment_version: u64,
    }
    let data = reports.and_then(|cm| cm.data.as_ref());
    departing.all(|ordinal| {
        data.and_then(|d| d.get(&format!("worker-{ordinal}")))
            .and_then(|text| serde_json::from_str::<Report>(text).ok())
            .is_some_and(|r| r.assignment_version >= version)
    })
}

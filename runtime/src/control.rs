//! Where a worker or reducer learns its shards (and a reducer its deny list) and a worker
//! tells the operator what it applied.
//!
//! In a cluster it watches the assignment ConfigMap through the API (a mounted file updates
//! late) and reports into the worker-reports ConfigMap; outside a cluster both are files. Both
//! run as async tasks feeding a watch channel that the counting thread polls between messages.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
use topk_api::report::ShardLoss;
use topk_api::{DataPlaneConfig, DenyList};

/// Where the assignment table comes from and where the applied version goes.
pub enum ControlPlane {
    /// Files: outside a cluster (tests, local runs).
    Files {
        assignment: PathBuf,
        report: Option<PathBuf>,
    },
    /// The assignment and worker-reports ConfigMaps, through the API.
    Kubernetes { client: Client, namespace: String },
}

/// Field manager of the workers' reports.
const MANAGER: &str = "topk-worker";

fn parse_table(text: &str, from: &str) -> Option<AssignmentTable> {
    match serde_json::from_str(text) {
        Ok(table) => Some(table),
        Err(err) => {
            tracing::warn!(%err, from, "unreadable assignment table; keeping the current one");
            None
        }
    }
}

/// Calls `on_text` with the text of the file at `path` whenever it changed, looking every
/// `every`: the outside-a-cluster twin of [`watch_configmap_key`]. A file that cannot be read
/// (yet, or any more) changes nothing; losing a file that was read is logged once.
pub async fn poll_file(path: PathBuf, every: Duration, mut on_text: impl FnMut(&str)) {
    let mut last: Option<String> = None;
    let mut unreadable = false;
    loop {
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                unreadable = false;
                if last.as_ref() != Some(&text) {
                    on_text(&text);
                    last = Some(text);
                }
            }
            Err(err) if last.is_some() && !unreadable => {
                unreadable = true;
                tracing::warn!(%err, path = %path.display(), "cannot read the file any more; keeping what it said");
            }
            Err(err) => tracing::debug!(%err, path = %path.display(), "file not readable yet"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Sends `table` unless one with a higher version was sent before: versions only rise (the
/// operator replaces a table it finds lower than one it wrote), so a lower one is a hand edit
/// or a stale read, and applying it could hand shards back to owners that released them.
/// Returns whether it was sent.
pub fn offer_table(tx: &watch::Sender<Option<AssignmentTable>>, table: AssignmentTable) -> bool {
    tx.send_if_modified(|current| match current {
        Some(newer) if table.version < newer.version => {
            tracing::warn!(
                version = table.version,
                applied = newer.version,
                "ignoring an assignment table older than one already followed"
            );
            false
        }
        _ => {
            *current = Some(table);
            true
        }
    })
}

/// Publishes the table in `path` whenever its content changes (checked every 200 ms).
pub async fn watch_file(path: PathBuf, tx: watch::Sender<Option<AssignmentTable>>) {
    let from = path.display().to_string();
    poll_file(path, Duration::from_millis(200), move |text| {
        if let Some(table) = parse_table(text, &from) {
            offer_table(&tx, table);
        }
    })
    .await
}

/// Sends the deny list `list` unless it is already the one in force.
pub fn offer_deny_list(tx: &watch::Sender<Option<DenyList>>, list: DenyList) {
    tx.send_if_modified(|current| {
        let changed = current.as_ref() != Some(&list);
        if changed {
            tracing::info!(keys = list.len(), "deny list in force");
            *current = Some(list);
        }
        changed
    });
}

/// Outside a cluster: the deny list of the config in the file at `path` (read by `load`: the
/// rendered config for a reducer, a manifest for `topk run`), looked at every second. A file
/// that no longer loads keeps the list in force. A `denyKeysFrom` ConfigMap, which only a
/// reducer in a cluster can read, is reported once and left out.
pub async fn poll_deny_list<E: std::fmt::Display>(
    path: PathBuf,
    load: impl Fn(&str) -> Result<DataPlaneConfig, E>,
    tx: watch::Sender<Option<DenyList>>,
) {
    let from = path.display().to_string();
    let mut warned = false;
    poll_file(path, Duration::from_secs(1), move |text| match load(text) {
        Ok(config) => {
            if let (Some(referenced), false) = (&config.deny.config_map, warned) {
                tracing::warn!(
                    configmap = referenced.name,
                    "denyKeysFrom names a ConfigMap, which only a reducer in a cluster reads; using denyKeys alone"
                );
                warned = true;
            }
            offer_deny_list(&tx, config.deny.list(None));
        }
        Err(err) => tracing::warn!(%err, path = from, "unreadable config; keeping the deny list"),
    })
    .await
}

/// Publishes the table of ConfigMap `name` on every change, through a watch on the API.
pub async fn watch_configmap(
    client: Client,
    namespace: String,
    name: String,
    tx: watch::Sender<Option<AssignmentTable>>,
) {
    let from = name.clone();
    watch_configmap_key(
        client,
        namespace,
        name,
        ASSIGNMENT_KEY.to_owned(),
        move |text| {
            if let Some(table) = text.and_then(|t| parse_table(t, &from)) {
                offer_table(&tx, table);
            }
        },
    )
    .await
}

/// Calls `on_value` with the text of `key` in ConfigMap `name` whenever it may have changed,
/// through a watch on the API: `None` once the ConfigMap or its key is known to be absent.
pub async fn watch_configmap_key(
    client: Client,
    namespace: String,
    name: String,
    key: String,
    mut on_value: impl FnMut(Option<&str>) + Send + 'static,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).boxed();
    let value = |cm: &ConfigMap| cm.data.as_ref().and_then(|d| d.get(&key)).cloned();
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::InitApply(cm)) => {
                listed = true;
                on_value(value(&cm).as_deref());
            }
            Ok(watcher::Event::InitDone) if !listed => on_value(None),
            Ok(watcher::Event::Apply(cm)) => on_value(value(&cm).as_deref()),
            Ok(watcher::Event::Delete(_)) => on_value(None),
            Ok(watcher::Event::InitDone) => {}
            Err(err) => {
                tracing::warn!(%err, configmap = name, "ConfigMap watch interrupted; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// What a worker tells the operator.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The assignment version it applied (its released shards are free to move).
    Applied(u64),
    /// A shard's counts miss input; the metric shows it as `Degraded` for a while.
    Loss(ShardLoss),
}

impl Report {
    /// The worker-reports key and value.
    fn entry(&self, ordinal: u32) -> (String, String) {
        match self {
            Report::Applied(version) => (format!("worker-{ordinal}"), report_value(*version)),
            Report::Loss(loss) => (loss.key(), serde_json::to_string(loss).unwrap_or_default()),
        }
    }
}

/// The value a worker reports for the assignment version it applied.
pub fn report_value(version: u64) -> String {
    serde_json::json!({"assignmentVersion": version}).to_string()
}

/// Writes each applied version to `path` (`{"assignmentVersion": V}`) and each loss to
/// `path.shard-N-loss`.
pub async fn report_to_file(path: PathBuf, mut rx: mpsc::UnboundedReceiver<Report>) {
    while let Some(report) = rx.recv().await {
        let (key, value) = report.entry(0);
        let target = match report {
            Report::Applied(_) => path.clone(),
            Report::Loss(_) => {
                let mut name = path.as_os_str().to_owned();
                name.push(format!(".{key}"));
                PathBuf::from(name)
            }
        };
        if let Err(err) = tokio::fs::write(&target, value).await {
            tracing::warn!(%err, path = %target.display(), "cannot write the worker report");
        }
    }
}

/// Patches ConfigMap `name` with each report: key `worker-ORDINAL` for the applied version,
/// `shard-N-loss` for a loss.
pub async fn report_to_configmap(
    client: Client,
    namespace: String,
    name: String,
    ordinal: u32,
    mut rx: mpsc::UnboundedReceiver<Report>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    while let Some(report) = rx.recv().await {
        let (key, value) = report.entry(ordinal);
        let patch = serde_json::json!({"data": {key: value}});
        // Retried until it lands; an applied version also stops when a newer one is queued.
        loop {
            match api
                .patch(&name, &PatchParams::apply(MANAGER), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => break,
                Err(err) => {
                    tracing::warn!(%err, ?report, "cannot write the worker report; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if matches!(report, Report::Applied(_)) && !rx.is_empty() {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topk_api::assignment::ShardOwner;

    fn table(version: u64, worker: u32) -> AssignmentTable {
        AssignmentTable {
            version,
            shards: vec![ShardOwner {
                shard: 0,
                worker,
                epoch: version,
            }],
        }
    }

    #[test]
    fn a_table_older_than_one_followed_is_ignored() {
        let (tx, rx) = watch::channel(None);
        assert!(offer_table(&tx, table(2, 0)));
        // A hand edit back to version 1 (shard 0 to worker 1) changes nothing...
        assert!(!offer_table(&tx, table(1, 1)));
        assert_eq!(rx.borrow().as_ref(), Some(&table(2, 0)));
        // ... the same version again is taken (a re-read), and a later rise is followed.
        assert!(offer_table(&tx, table(2, 0)));
        assert!(offer_table(&tx, table(3, 1)));
        assert_eq!(rx.borrow().as_ref(), Some(&table(3, 1)));
    }
}

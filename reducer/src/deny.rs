//! Where a reducer learns its deny list while it runs: the rendered config (the spec's
//! `denyKeys`) and the ConfigMap key `denyKeysFrom` names. The list goes into a watch channel
//! that the merging thread looks at between messages; `None` until every source has been read
//! once, so that a restarted reducer never publishes a key that is still denied.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;
use topk_api::dataplane::{CONFIG_KEY, DenySource};
use topk_api::manifest::ConfigMapKey;
use topk_api::{DataPlaneConfig, DenyList};
use topk_runtime::control::watch_configmap_key;

/// How often the config file is read again outside a cluster.
const FILE_POLL: Duration = Duration::from_secs(1);

/// Sends `list` unless it is already the current one.
fn offer(tx: &watch::Sender<Option<DenyList>>, list: DenyList) {
    tx.send_if_modified(|current| {
        let changed = current.as_ref() != Some(&list);
        if changed {
            tracing::info!(keys = list.len(), "deny list in force");
            *current = Some(list);
        }
        changed
    });
}

/// Outside a cluster: the deny list of the config file, read again every second. A ConfigMap
/// reference cannot be followed there; it is reported once and left out.
pub async fn watch_file(path: PathBuf, tx: watch::Sender<Option<DenyList>>) {
    let mut warned = false;
    loop {
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => match DataPlaneConfig::parse(&text) {
                Ok(config) => {
                    if let (Some(from), false) = (&config.deny.config_map, warned) {
                        tracing::warn!(
                            configmap = from.name,
                            "denyKeysFrom names a ConfigMap, which only a reducer in a cluster reads; using denyKeys alone"
                        );
                        warned = true;
                    }
                    offer(&tx, config.deny.list(None));
                }
                Err(err) => {
                    tracing::warn!(%err, path = %path.display(), "unreadable config; keeping the deny list")
                }
            },
            Err(err) => {
                tracing::warn!(%err, path = %path.display(), "cannot read the config; keeping the deny list")
            }
        }
        tokio::time::sleep(FILE_POLL).await;
    }
}

/// In a cluster: the config ConfigMap and the ConfigMap it references, both watched through
/// the API (a mounted file updates a minute or more late).
pub async fn watch_cluster(
    client: kube::Client,
    namespace: String,
    config_map: String,
    tx: watch::Sender<Option<DenyList>>,
) {
    let (source_tx, mut source_rx) = watch::channel::<Option<DenySource>>(None);
    let from = config_map.clone();
    tokio::spawn(watch_configmap_key(
        client.clone(),
        namespace.clone(),
        config_map,
        CONFIG_KEY.to_owned(),
        move |text| match text.map(DataPlaneConfig::parse) {
            Some(Ok(config)) => {
                source_tx.send_replace(Some(config.deny));
            }
            Some(Err(err)) => {
                tracing::warn!(%err, configmap = from, "unreadable config; keeping the deny list")
            }
            None => tracing::warn!(configmap = from, "config missing; keeping the deny list"),
        },
    ));
    // The referenced ConfigMap's watch: its key and its latest text (`None` before the first
    // look, `Some(None)` when absent).
    type Referenced = (
        ConfigMapKey,
        tokio::task::JoinHandle<()>,
        watch::Receiver<Option<Option<String>>>,
    );
    let mut referenced: Option<Referenced> = None;
    loop {
        let source = source_rx.borrow_and_update().clone();
        if let Some(source) = source {
            if referenced.as_ref().map(|r| &r.0) != source.config_map.as_ref() {
                if let Some((_, task, _)) = referenced.take() {
                    task.abort();
                }
                if let Some(key) = &source.config_map {
                    let (text_tx, text_rx) = watch::channel(None);
                    let task = tokio::spawn(watch_configmap_key(
                        client.clone(),
                        namespace.clone(),
                        key.name.clone(),
                        key.key.clone(),
                        move |text| {
                            text_tx.send_replace(Some(text.map(str::to_owned)));
                        },
                    ));
                    referenced = Some((key.clone(), task, text_rx));
                }
            }
            match &mut referenced {
                None => offer(&tx, source.list(None)),
                Some((key, _, text)) => match &*text.borrow_and_update() {
                    None => {}
                    Some(None) => {
                        tracing::warn!(
                            configmap = key.name,
                            key = key.key,
                            "the denyKeysFrom ConfigMap key is missing; denying the spec's keys alone"
                        );
                        offer(&tx, source.list(None));
                    }
                    Some(Some(lines)) => offer(&tx, source.list(Some(lines))),
                },
            }
        }
        let changed = match &mut referenced {
            Some((_, _, text)) => tokio::select! {
                r = source_rx.changed() => r.is_ok(),
                r = text.changed() => r.is_ok(),
            },
            None => source_rx.changed().await.is_ok(),
        };
        if !changed {
            return;
        }
    }
}

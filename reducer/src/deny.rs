//! Where a reducer in a cluster learns its deny list while it runs: the rendered config (the
//! spec's `denyKeys`) and the ConfigMap key `denyKeysFrom` names (outside a cluster,
//! `topk_runtime::control::poll_deny_list` reads the config file). The list goes into a
//! watch channel that the merging thread looks at between messages; `None` until every
//! source has been read once, so that a restarted reducer never publishes a key that is
//! still denied.

use tokio::sync::watch;
use topk_api::dataplane::{CONFIG_KEY, DenySource};
use topk_api::manifest::ConfigMapKey;
use topk_api::{DataPlaneConfig, DenyList};
use topk_runtime::control::{offer_deny_list as offer, watch_configmap_key};

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

//! End to end on a kind cluster prepared by `e2e/run.sh` (the chart installed with its dev
//! Kafka, the image loaded). Skipped, with a message, unless `TOPK_E2E=1`; `TOPK_REQUIRE_KIND=1`
//! makes a missing cluster a failure. Each scenario uses its own namespace, topic and metric.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use topk_api::TopKMetric;
use topk_testenv::{await_some, list_items as items, metric_manifest};

const WAIT: Duration = Duration::from_secs(300);

struct Cluster {
    client: Client,
    /// Where the chart (and its dev Kafka) is installed.
    system: String,
    release: String,
}

impl Cluster {
    async fn get(test: &str) -> Option<Self> {
        if std::env::var("TOPK_E2E").as_deref() != Ok("1") {
            let msg =
                format!("SKIPPED {test}: needs a kind cluster prepared by e2e/run.sh (TOPK_E2E=1)");
            assert!(
                std::env::var("TOPK_REQUIRE_KIND").as_deref() != Ok("1"),
                "{msg}"
            );
            eprintln!("\n*** {msg} ***\n");
            return None;
        }
        let client = Client::try_default()
            .await
            .expect("kubeconfig of the kind cluster");
        Some(Self {
            client,
            system: std::env::var("TOPK_E2E_NAMESPACE").unwrap_or_else(|_| "topk-system".into()),
            release: std::env::var("TOPK_E2E_RELEASE").unwrap_or_else(|_| "topk".into()),
        })
    }

    fn kafka_pod(&self) -> String {
        format!("{}-topk-operator-kafka-0", self.release)
    }

    fn bootstrap(&self) -> String {
        format!(
            "{}-topk-operator-kafka.{}.svc:9092",
            self.release, self.system
        )
    }

    async fn namespace(&self, prefix: &str) -> String {
        let name = format!(
            "{prefix}-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis()
                % 1_000_000_000
        );
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        name
    }

    /// Creates a topic with the broker's own tool, in the dev broker's pod.
    fn create_topic(&self, topic: &str, partitions: u32) {
        let status = Command::new("kubectl")
            .args(["exec", "-n", &self.system, &self.kafka_pod(), "--"])
            .args([
                "/opt/kafka/bin/kafka-topics.sh",
                "--bootstrap-server",
                "localhost:9092",
            ])
            .args([
                "--create",
                "--topic",
                topic,
                "--partitions",
                &partitions.to_string(),
            ])
            .status()
            .expect("kubectl exec");
        assert!(status.success(), "creating topic {topic} failed");
    }

    /// Produces `plays` events (one per entry, event time now).
    fn produce(&self, topic: &str, keys: &[String]) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        let events: Vec<(i64, String)> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| (now + i as i64 % 1000, key.clone()))
            .collect();
        self.produce_at(topic, &events);
    }

    /// Produces `plays` events with the given event times through `topk produce` in a pod of
    /// the image under test: keyed `plays||key`, stamped with the event time.
    fn produce_at(&self, topic: &str, events: &[(i64, String)]) {
        let mut lines = String::new();
        for (i, (time, key)) in events.iter().enumerate() {
            let event = json!({"event_time": time, "metric": "plays", "key": key,
                "event_id": format!("{topic}-{time}-{i}")});
            lines.push_str(&format!("{event}\n"));
        }
        let image = std::env::var("TOPK_E2E_IMAGE").expect("TOPK_E2E_IMAGE");
        let pod = format!("produce-{}", std::process::id());
        let mut child = Command::new("kubectl")
            .args(["run", &pod, "-i", "--rm", "--restart=Never", "--quiet"])
            .args([
                "-n",
                &self.system,
                "--image",
                &image,
                "--image-pull-policy=Never",
                "--",
            ])
            .args([
                "produce",
                "--bootstrap",
                &self.bootstrap(),
                "--topic",
                topic,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("kubectl run");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(lines.as_bytes())
            .expect("write events");
        let out = child.wait_with_output().expect("kubectl run");
        assert!(out.status.success(), "topk produce failed");
        let summary = String::from_utf8_lossy(&out.stdout);
        assert!(
            summary.contains(&format!("\"sent\":{}", events.len())),
            "{summary}"
        );
    }

    async fn apply_metric(&self, ns: &str, name: &str, topic: &str, workers: u32) {
        let spec = format!(
            r#"
shards: 4
k: 5
workers: {{replicas: {workers}, idleTimeout: 2s}}
allowedLateness: 2s
windows:
  - {{name: 1h, length: 1h, bucket: 1m}}
  - {{name: all, allTime: true, bucket: 10s}}
"#
        );
        let manifest = metric_manifest(name, "plays", &self.bootstrap(), topic, &spec);
        let metric: TopKMetric = topk_api::load_manifest(&manifest).expect("manifest");
        Api::<TopKMetric>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &metric)
            .await
            .expect("create TopKMetric");
    }

    /// A list from the metric's reducer, through the apiserver's service proxy.
    async fn list(&self, ns: &str, name: &str, window: &str) -> Option<Value> {
        let path = format!(
            "/api/v1/namespaces/{ns}/services/{}:http/proxy/v1/rankings/plays?window={window}&k=5",
            topk_api::names::Names::of(name).reducer
        );
        let request = http::Request::get(path).body(Vec::new()).ok()?;
        let text = self.client.request_text(request).await.ok()?;
        serde_json::from_str(&text).ok()
    }

    async fn metric(&self, ns: &str, name: &str) -> Option<TopKMetric> {
        Api::<TopKMetric>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()
    }
}

/// `song-i` played `i + 1` times, i in 0..12, shuffled deterministically.
fn plays(round: u64) -> Vec<String> {
    let mut keys: Vec<String> = (0..12)
        .flat_map(|i| std::iter::repeat_n(format!("song-{i}"), i + 1))
        .collect();
    let n = keys.len();
    for i in 0..n {
        keys.swap(i, (i * 31 + round as usize * 7) % n);
    }
    keys
}

fn top5(counts: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = counts.iter().map(|(k, c)| (k.clone(), *c)).collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.truncate(5);
    all
}

fn add(counts: &mut BTreeMap<String, u64>, keys: &[String]) {
    for key in keys {
        *counts.entry(key.clone()).or_default() += 1;
    }
}

async fn await_exact(cluster: &Cluster, ns: &str, name: &str, counts: &BTreeMap<String, u64>) {
    let want = top5(counts);
    await_some(
        &format!("the all-time list of {ns}/{name} = {want:?}"),
        WAIT,
        || async {
            let list = cluster.list(ns, name, "all").await?;
            (items(&list) == want).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_known_stream_shows_its_leader_and_exact_lists() {
    let Some(cluster) = Cluster::get("known stream").await else {
        return;
    };
    let ns = cluster.namespace("known").await;
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    cluster.apply_metric(&ns, "plays", &topic, 2).await;
    let keys = plays(0);
    cluster.produce(&topic, &keys);
    let mut counts = BTreeMap::new();
    add(&mut counts, &keys);
    await_exact(&cluster, &ns, "plays", &counts).await;
    // `kubectl get tkm` reads these fields (printer columns).
    let metric = await_some("leader and ready workers", WAIT, || async {
        let m = cluster.metric(&ns, "plays").await?;
        let status = m.status.clone()?;
        (status.leader.as_deref() == Some("song-11")
            && status.workers.as_ref().map(|w| w.summary.as_str()) == Some("2/2"))
        .then_some(m)
    })
    .await;
    let ready = metric
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    assert_eq!(ready.as_deref(), Some("True"));
}

#[tokio::test]
async fn a_worker_pod_killed_mid_stream_loses_nothing() {
    let Some(cluster) = Cluster::get("killed worker").await else {
        return;
    };
    let ns = cluster.namespace("kill").await;
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    cluster.apply_metric(&ns, "plays", &topic, 2).await;
    let mut counts = BTreeMap::new();
    let first = plays(1);
    cluster.produce(&topic, &first);
    add(&mut counts, &first);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    await_some("worker 1 running", WAIT, || async {
        let pod = pods.get_opt("plays-worker-1").await.ok()??;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    pods.delete("plays-worker-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("kill worker 1");
    let second = plays(2);
    cluster.produce(&topic, &second);
    add(&mut counts, &second);
    await_exact(&cluster, &ns, "plays", &counts).await;
}

#[tokio::test]
async fn scaling_out_and_back_keeps_the_lists_exact() {
    let Some(cluster) = Cluster::get("scale").await else {
        return;
    };
    let ns = cluster.namespace("scale").await;
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    cluster.apply_metric(&ns, "plays", &topic, 2).await;
    let metrics: Api<TopKMetric> = Api::namespaced(cluster.client.clone(), &ns);
    let mut counts = BTreeMap::new();
    for (round, replicas) in [(3u64, 3), (4, 2), (5, 2)] {
        let keys = plays(round);
        cluster.produce(&topic, &keys);
        add(&mut counts, &keys);
        // `kubectl scale tkm/plays --replicas=N` is a patch of the scale subresource.
        metrics
            .patch_scale(
                "plays",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scale");
        await_some(&format!("{replicas} workers, settled"), WAIT, || async {
            let status = cluster.metric(&ns, "plays").await?.status?;
            let settled = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Progressing" && c.status == "False");
            (status.workers?.summary == format!("{replicas}/{replicas}") && settled).then_some(())
        })
        .await;
        await_exact(&cluster, &ns, "plays", &counts).await;
    }
}

#[tokio::test]
async fn an_hourly_recount_advances_exact_until() {
    let Some(cluster) = Cluster::get("hourly recount").await else {
        return;
    };
    let ns = cluster.namespace("recount").await;
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    // Events of an hour two hours back, and a metric that recounts from that hour on
    // (`topk.io/recount-from`), so closed hours exist without waiting for one to close.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let hour = now.div_euclid(3_600_000) * 3_600_000 - 2 * 3_600_000;
    let keys = plays(6);
    let events: Vec<(i64, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (hour + 60_000 + i as i64 * 1_000, key.clone()))
        .collect();
    cluster.produce_at(&topic, &events);
    cluster.apply_metric(&ns, "plays", &topic, 2).await;
    let from = k8s_openapi::jiff::Timestamp::from_millisecond(hour)
        .expect("hour")
        .to_string();
    Api::<TopKMetric>::namespaced(cluster.client.clone(), &ns)
        .patch(
            "plays",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"topk.io/recount-from": from}}})),
        )
        .await
        .expect("annotate");
    let second_hour = k8s_openapi::jiff::Timestamp::from_millisecond(hour + 3_600_000)
        .expect("hour")
        .to_string();
    // The Jobs run `topk recount` in the cluster; exactUntil passes the hour of the events.
    let status = await_some("exactUntil past the recounted hour", WAIT, || async {
        let status = cluster.metric(&ns, "plays").await?.status?;
        (status.exact_until.as_deref()? >= second_hour.as_str()).then_some(status)
    })
    .await;
    let recount = status.recount.expect("recount status");
    assert!(recount.failures.is_empty(), "{recount:?}");
    let last = await_some("the recount summary", WAIT, || async {
        cluster
            .metric(&ns, "plays")
            .await?
            .status?
            .recount?
            .last_recount
    })
    .await;
    assert!(last.hour.as_str() >= from.as_str(), "{last:?}");
}

#[tokio::test]
async fn an_unchanged_helm_upgrade_rolls_nothing() {
    let Some(cluster) = Cluster::get("helm upgrade").await else {
        return;
    };
    let ns = cluster.namespace("upgrade").await;
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    cluster.apply_metric(&ns, "plays", &topic, 2).await;
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), &ns);
    await_some("the worker StatefulSet", WAIT, || async {
        sets.get_opt("plays-worker").await.ok()?
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let uids = |list: Vec<Pod>| -> Vec<String> {
        let mut uids: Vec<String> = list.iter().filter_map(|p| p.uid()).collect();
        uids.sort();
        uids
    };
    let before = uids(pods.list(&ListParams::default()).await.expect("pods").items);
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), &cluster.system);
    let operator = format!("{}-topk-operator", cluster.release);
    let generation = deployments
        .get(&operator)
        .await
        .expect("operator")
        .metadata
        .generation;
    let chart = std::env::var("TOPK_E2E_CHART").expect("TOPK_E2E_CHART");
    let extra = std::env::var("TOPK_E2E_HELM_ARGS").unwrap_or_default();
    let status = Command::new("helm")
        .args([
            "upgrade",
            &cluster.release,
            &chart,
            "--namespace",
            &cluster.system,
            "--wait",
        ])
        .args(extra.split_whitespace())
        .status()
        .expect("helm upgrade");
    assert!(status.success());
    // Give the operator a reconcile to (wrongly) roll something.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = uids(pods.list(&ListParams::default()).await.expect("pods").items);
    assert_eq!(before, after, "pods were replaced by an unchanged upgrade");
    assert_eq!(
        deployments
            .get(&operator)
            .await
            .expect("operator")
            .metadata
            .generation,
        generation
    );
}

#[tokio::test]
async fn deleting_the_metric_removes_what_it_created() {
    let Some(cluster) = Cluster::get("delete").await else {
        return;
    };
    let ns = cluster.namespace("delete").await;
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    cluster.apply_metric(&ns, "plays", &topic, 2).await;
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), &ns);
    await_some("the StatefulSets", WAIT, || async {
        (sets.list(&ListParams::default()).await.ok()?.items.len() == 2).then_some(())
    })
    .await;
    Api::<TopKMetric>::namespaced(cluster.client.clone(), &ns)
        .delete("plays", &DeleteParams::default())
        .await
        .expect("delete");
    let selector = "app.kubernetes.io/instance=plays";
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), &ns);
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &ns);
    await_some("everything the metric created gone", WAIT, || async {
        let params = ListParams::default().labels(selector);
        let left = sets.list(&params).await.ok()?.items.len()
            + services.list(&params).await.ok()?.items.len()
            + maps.list(&params).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
}

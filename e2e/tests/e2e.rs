//! End to end on a real cluster prepared by `e2e/run.sh`: kind (`e2e/run.sh`) or the test
//! environment's node (`e2e/run.sh testenv`, what CI runs), with the chart installed with its
//! dev Kafka and the image under test on the nodes. Skipped, with a message, unless
//! `TOPK_E2E=1`; under `TOPK_REQUIRE_TESTENV=1` (CI) or `TOPK_REQUIRE_KIND=1` a missing
//! cluster is a failure. Each scenario uses its own namespace, topic and metric; a scenario
//! that fails prints the pods, events and logs of what it touched, one that passes deletes
//! its namespace.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use topk_api::TopKMetric;
use topk_testenv::{SecureKafka, await_some, list_items as items, metric_manifest_from};

const WAIT: Duration = Duration::from_secs(300);

struct Cluster {
    client: Client,
    /// Where the chart (and its dev Kafka) is installed.
    system: String,
    release: String,
}

/// One scenario's namespace: on a failure (a panic) prints what is in it and the operator's
/// logs. Then it is deleted, failed or not, so that later scenarios have the node's room (a
/// failed scenario's pods once kept the CPU the next ones needed, and they failed unscheduled);
/// `TOPK_E2E_KEEP_FAILED=1` keeps a failed one for a look.
struct Scenario {
    ns: String,
    system: String,
    release: String,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n===== scenario in namespace {} failed: what it touched =====",
                self.ns
            );
            let ns = self.ns.as_str();
            kubectl_print(&["get", "pods,pvc,jobs,statefulsets", "-n", ns, "-o", "wide"]);
            kubectl_print(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"]);
            kubectl_print(&["get", "tkm", "-n", ns, "-o", "yaml"]);
            kubectl_print(&[
                "logs",
                "-n",
                ns,
                "-l",
                "app.kubernetes.io/instance",
                "--all-containers",
                "--prefix",
                "--tail=60",
                "--max-log-requests=20",
            ]);
            let operator = format!(
                "app.kubernetes.io/instance={},app.kubernetes.io/component=operator",
                self.release
            );
            kubectl_print(&["get", "pods,events", "-n", &self.system]);
            kubectl_print(&[
                "logs",
                "-n",
                &self.system,
                "-l",
                &operator,
                "--prefix",
                "--tail=80",
            ]);
            if std::env::var("TOPK_E2E_KEEP_FAILED").is_ok_and(|v| v == "1") {
                eprintln!("kept namespace {} (TOPK_E2E_KEEP_FAILED=1)", self.ns);
                return;
            }
        }
        kubectl_print(&["delete", "namespace", &self.ns, "--wait=false"]);
    }
}

/// Runs kubectl and copies what it prints to stderr (diagnostics and clean-up only).
fn kubectl_print(args: &[&str]) {
    match Command::new("kubectl").args(args).output() {
        Ok(out) => {
            eprintln!("$ kubectl {}", args.join(" "));
            eprintln!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(err) => eprintln!("kubectl {}: {err}", args.join(" ")),
    }
}

/// kubectl's output, failing the test when it fails.
fn kubectl(args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Cluster {
    async fn get(test: &str) -> Option<Self> {
        if std::env::var("TOPK_E2E").as_deref() != Ok("1") {
            if std::env::var("TOPK_E2E_LATER").as_deref() == Ok("1") {
                eprintln!("{test}: runs later, on the test environment's node (scripts/test.sh)");
                return None;
            }
            let msg = format!(
                "SKIPPED {test}: needs a cluster prepared by e2e/run.sh (kind) or `e2e/run.sh testenv` (TOPK_E2E=1)"
            );
            let required = ["TOPK_REQUIRE_TESTENV", "TOPK_REQUIRE_KIND"]
                .iter()
                .any(|v| std::env::var(v).as_deref() == Ok("1"));
            assert!(!required, "{msg}");
            eprintln!("\n*** {msg} ***\n");
            return None;
        }
        let client = Client::try_default()
            .await
            .expect("kubeconfig of the cluster");
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

    /// A fresh namespace for one scenario, once its default ServiceAccount exists (the
    /// apiserver admits no Pod before).
    async fn scenario(&self, prefix: &str) -> Scenario {
        let name = topk_testenv::fresh_namespace(&self.client, prefix)
            .await
            .expect("namespace");
        Scenario {
            ns: name,
            system: self.system.clone(),
            release: self.release.clone(),
        }
    }

    /// The usual start of a scenario: its namespace, a 4-partition topic on the dev Kafka, and
    /// a `plays` metric on it with two workers.
    async fn start(&self, prefix: &str) -> (Scenario, String) {
        self.start_with(prefix, "").await
    }

    /// [`Cluster::start`] with more spec fields (YAML lines).
    async fn start_with(&self, prefix: &str, extra_spec: &str) -> (Scenario, String) {
        self.start_on_topic(prefix, &[], extra_spec).await
    }

    /// [`Cluster::start_with`] on a topic created with `topic_config` (`name=value`).
    async fn start_on_topic(
        &self,
        prefix: &str,
        topic_config: &[&str],
        extra_spec: &str,
    ) -> (Scenario, String) {
        let scenario = self.scenario(prefix).await;
        let topic = format!("{}-plays", scenario.ns);
        self.create_topic_with("localhost:9092", &topic, 4, topic_config);
        self.apply_metric_with(
            &self.bootstrap(),
            &scenario.ns,
            "plays",
            &topic,
            2,
            &[],
            extra_spec,
        )
        .await;
        (scenario, topic)
    }

    /// Creates a topic with the broker's own tool, in the dev broker's pod.
    fn create_topic(&self, topic: &str, partitions: u32) {
        self.create_topic_on("localhost:9092", topic, partitions);
    }

    /// Creates a topic on the broker at `bootstrap`, as the dev broker's pod reaches it.
    fn create_topic_on(&self, bootstrap: &str, topic: &str, partitions: u32) {
        self.create_topic_with(bootstrap, topic, partitions, &[]);
    }

    /// [`Cluster::create_topic_on`] with topic settings (`name=value`).
    fn create_topic_with(&self, bootstrap: &str, topic: &str, partitions: u32, config: &[&str]) {
        let partitions = partitions.to_string();
        let mut args = vec![
            "exec",
            "-n",
            &self.system,
            "--",
            "/opt/kafka/bin/kafka-topics.sh",
            "--bootstrap-server",
            bootstrap,
            "--create",
            "--topic",
            topic,
            "--partitions",
            &partitions,
        ];
        let pod = self.kafka_pod();
        args.insert(3, &pod);
        for setting in config {
            args.extend(["--config", setting]);
        }
        kubectl(&args);
    }

    /// Produces `plays` events (one per entry, event time now).
    fn produce(&self, topic: &str, keys: &[String]) {
        let now = now_ms();
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
        self.produce_on(&self.bootstrap(), topic, events);
    }

    /// [`Cluster::produce_at`] to the broker at `bootstrap`.
    fn produce_on(&self, bootstrap: &str, topic: &str, events: &[(i64, String)]) {
        let with_ids: Vec<(i64, String, String)> = events
            .iter()
            .enumerate()
            .map(|(i, (time, key))| (*time, key.clone(), format!("{topic}-{time}-{i}")))
            .collect();
        self.produce_with_ids(bootstrap, topic, &with_ids);
    }

    /// Produces `plays` events (event time, key, event id) through `topk produce` in a pod.
    fn produce_with_ids(&self, bootstrap: &str, topic: &str, events: &[(i64, String, String)]) {
        let lines: Vec<Value> = events
            .iter()
            .map(|(time, key, id)| {
                json!({"event_time": time, "metric": "plays", "key": key, "event_id": id})
            })
            .collect();
        self.produce_events(bootstrap, topic, &lines);
    }

    /// Produces JSON events through `topk produce` in a pod of the image under test: keyed
    /// `metric|scope|key`, each record stamped with its event time.
    fn produce_events(&self, bootstrap: &str, topic: &str, events: &[Value]) {
        let mut lines = String::new();
        for event in events {
            lines.push_str(&format!("{event}\n"));
        }
        let image = std::env::var("TOPK_E2E_IMAGE").expect("TOPK_E2E_IMAGE");
        let pod = format!("produce-{}", std::process::id());
        let out = run_with_input(
            Command::new("kubectl")
                .args(["run", &pod, "-i", "--rm", "--restart=Never", "--quiet"])
                .args([
                    "-n",
                    &self.system,
                    "--image",
                    &image,
                    "--image-pull-policy=Never",
                    "--",
                ])
                .args(["produce", "--bootstrap", bootstrap, "--topic", topic]),
            &lines,
            "topk produce",
        );
        let summary = String::from_utf8_lossy(&out);
        assert!(
            summary.contains(&format!("\"sent\":{}", events.len())),
            "{summary}"
        );
    }

    /// A `plays` metric with `workers` workers on `topic` of the broker at `bootstrap`.
    async fn apply_metric_on(
        &self,
        bootstrap: &str,
        ns: &str,
        name: &str,
        topic: &str,
        workers: u32,
    ) {
        self.apply_metric_with(bootstrap, ns, name, topic, workers, &[], "")
            .await;
    }

    /// [`Cluster::apply_metric_on`] with annotations on the new metric and more spec fields
    /// (YAML lines).
    #[allow(clippy::too_many_arguments)]
    async fn apply_metric_with(
        &self,
        bootstrap: &str,
        ns: &str,
        name: &str,
        topic: &str,
        workers: u32,
        annotations: &[(&str, &str)],
        extra_spec: &str,
    ) {
        // The default windows, unless `extra_spec` has its own.
        let windows = if extra_spec.contains("windows:") {
            ""
        } else {
            "windows:\n  - {name: 1h, length: 1h, bucket: 1m}\n  - {name: all, allTime: true, bucket: 10s}"
        };
        let spec = format!(
            r#"
shards: 4
k: 5
workers: {{replicas: {workers}, idleTimeout: 2s}}
allowedLateness: 2s
{windows}
{extra_spec}
"#
        );
        let source = format!("bootstrapServers: \"{bootstrap}\", topic: {topic}");
        self.create_metric(ns, name, &source, &spec, annotations)
            .await;
    }

    /// Creates metric `name` counting `plays` from `kafka_source` (`spec.source.kafka` as flow
    /// YAML without braces) with the rest of the spec `spec`.
    async fn create_metric(
        &self,
        ns: &str,
        name: &str,
        kafka_source: &str,
        spec: &str,
        annotations: &[(&str, &str)],
    ) {
        let manifest = metric_manifest_from(name, "plays", kafka_source, spec);
        let mut metric: TopKMetric = topk_api::load_manifest(&manifest).expect("manifest");
        for (key, value) in annotations {
            metric
                .annotations_mut()
                .insert((*key).to_owned(), (*value).to_owned());
        }
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

    /// A counter of a worker's `/metrics`, read through the API server's pod proxy.
    async fn worker_counter(&self, ns: &str, pod: &str, series: &str) -> Option<f64> {
        self.pod_metric(ns, pod, 8080, series).await
    }

    /// The value of `series` on `/metrics` at `port` of a pod, through the pod proxy.
    async fn pod_metric(&self, ns: &str, pod: &str, port: u16, series: &str) -> Option<f64> {
        self.pod_metrics(ns, pod, port)
            .await?
            .lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
    }

    /// The metrics the chart's alerts and dashboard name that neither the metric's worker and
    /// reducer pods in `ns` nor the operator's pods export (less [`EXPORTED_AFTER_AN_EVENT`]).
    async fn metrics_not_exported(&self, ns: &str) -> Vec<String> {
        let mut pages: Vec<(String, String, u16)> = data_plane_pods(self, ns)
            .await
            .into_keys()
            .map(|pod| (ns.to_owned(), pod, 8080))
            .collect();
        pages.extend(
            self.operator_pods()
                .await
                .iter()
                .map(|pod| (self.system.clone(), pod.name_any(), 9090)),
        );
        let mut exported = BTreeSet::new();
        for (pod_ns, pod, port) in &pages {
            if let Some(page) = self.pod_metrics(pod_ns, pod, *port).await {
                exported.extend(exported_names(&page));
            }
        }
        chart_metric_names()
            .into_iter()
            .filter(|n| !exported.contains(n) && !EXPORTED_AFTER_AN_EVENT.contains(&n.as_str()))
            .collect()
    }

    /// `/metrics` at `port` of a pod, through the pod proxy.
    async fn pod_metrics(&self, ns: &str, pod: &str, port: u16) -> Option<String> {
        let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics");
        let request = http::Request::get(path).body(Vec::new()).ok()?;
        self.client.request_text(request).await.ok()
    }

    /// Waits until the metric's workers are `replicas`/`replicas` and no rescale is under way.
    async fn await_settled(&self, ns: &str, replicas: u32) {
        await_some(&format!("{replicas} workers, settled"), WAIT, || async {
            let status = self.metric(ns, "plays").await?.status?;
            let settled = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Progressing" && c.status == "False");
            (status.workers?.summary == format!("{replicas}/{replicas}") && settled).then_some(())
        })
        .await;
    }

    /// Waits until `ready` reports two ready pods (of a workload the metric runs besides its
    /// workers and reducers) and metric `plays` is `Ready`.
    async fn await_ready_with<F, Fut>(&self, ns: &str, what: &str, ready: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<i32>>,
    {
        await_some(what, WAIT, || async {
            let pods = ready().await?;
            let status = self.metric(ns, "plays").await?.status?;
            let condition = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (pods == 2 && condition.status == "True").then_some(())
        })
        .await;
    }

    /// Annotates metric `plays` with a new value: a watch event, so the operator reconciles
    /// it now.
    async fn poke(&self, ns: &str) {
        let value = now_ms().to_string();
        Api::<TopKMetric>::namespaced(self.client.clone(), ns)
            .patch(
                "plays",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {"e2e.topk.io/poke": value}}})),
            )
            .await
            .expect("annotate the metric");
    }

    async fn scale(&self, ns: &str, replicas: u32) {
        // `kubectl scale tkm/plays --replicas=N` is a patch of the scale subresource.
        Api::<TopKMetric>::namespaced(self.client.clone(), ns)
            .patch_scale(
                "plays",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scale");
    }

    /// Reconciles the operator's pods have finished (only the leader runs them).
    async fn operator_reconciles(&self) -> f64 {
        let mut total = 0.0;
        for pod in self.operator_pods().await {
            let series = "topk_operator_reconciles_total";
            total += self
                .pod_metric(&self.system, &pod.name_any(), 9090, series)
                .await
                .unwrap_or(0.0);
        }
        total
    }

    /// The operator's pods, as the chart labels them.
    async fn operator_pods(&self) -> Vec<Pod> {
        let selector = format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component=operator",
            self.release
        );
        Api::<Pod>::namespaced(self.client.clone(), &self.system)
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("operator pods")
            .items
    }
}

/// What `e2e/run.sh testenv` sets in `var` for a scenario that only the test environment's
/// node can run; `None` (skipped loudly, or a failure under `TOPK_REQUIRE_TESTENV=1`) elsewhere.
fn node_only(var: &str, what: &str) -> Option<String> {
    if std::env::var("TOPK_E2E_LATER").as_deref() == Ok("1") {
        eprintln!("{what}: runs later, on the test environment's node (scripts/test.sh)");
        return None;
    }
    if let Ok(value) = std::env::var(var) {
        return Some(value);
    }
    let msg = format!("SKIPPED {what}: no {var} (set by `e2e/run.sh testenv`)");
    assert!(
        std::env::var("TOPK_REQUIRE_TESTENV").as_deref() != Ok("1"),
        "{msg}"
    );
    eprintln!("\n*** {msg} ***\n");
    None
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// The shard restore counter of a worker, by source (`local`, `handoff`, `input`).
fn restores(source: &str) -> String {
    format!("topk_worker_shard_restores_total{{source=\"{source}\"}}")
}

/// Asserts that worker `pod` took at least one shard from `source` and none by counting its
/// input again (`topk_worker_shard_restores_total`), so a broken checkpoint or handoff fails.
async fn assert_restored_from(cluster: &Cluster, ns: &str, pod: &str, source: &str) {
    // The series exists (at 0) from the worker's start, before it has taken any shard.
    await_some(
        &format!("{pod} taking a shard from {source}"),
        WAIT,
        || async {
            let from_source = cluster.worker_counter(ns, pod, &restores(source)).await?;
            (from_source >= 1.0).then_some(())
        },
    )
    .await;
    let from_input = cluster.worker_counter(ns, pod, &restores("input")).await;
    assert_eq!(
        from_input,
        Some(0.0),
        "{pod} counted a shard from its input again"
    );
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

/// Every `topk_` name in the chart's alerts and dashboard, their descriptions included.
fn chart_metric_names() -> BTreeSet<String> {
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/topk-operator");
    let mut names = BTreeSet::new();
    for file in ["templates/monitoring.yaml", "dashboards/topk.json"] {
        let text = std::fs::read_to_string(chart.join(file)).expect("a chart file");
        let name_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        let mut rest = text.as_str();
        while let Some(at) = rest.find("topk_") {
            let starts_a_name = !rest[..at].ends_with(name_char);
            let tail = &rest[at..];
            let end = tail.find(|c| !name_char(c)).unwrap_or(tail.len());
            if starts_a_name {
                names.insert(tail[..end].to_owned());
            }
            rest = &tail[end..];
        }
    }
    names
}

/// The series names on a `/metrics` page, and each histogram's and counter's own name (what a
/// description calls it).
fn exported_names(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        for suffix in ["_bucket", "_sum", "_count", "_total"] {
            if let Some(base) = name.strip_suffix(suffix) {
                names.insert(base.to_owned());
            }
        }
        names.insert(name.to_owned());
    }
    names
}

/// Metrics the chart names whose series appear only once something happened, which the
/// known stream's metric need not have seen.
const EXPORTED_AFTER_AN_EVENT: [&str; 3] = [
    // After a failed reconcile, by its reason.
    "topk_operator_reconcile_errors_total",
    // After the first recounted hour, by window.
    "topk_reducer_exact_until_seconds",
    // After the first recount that rejected an event, by reason.
    "topk_reducer_recount_rejected",
];

/// The wall clock in milliseconds: event times the workers take as current.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// `keys` as events played now.
fn played_now(keys: &[String]) -> Vec<(i64, String)> {
    let now = now_ms();
    keys.iter().map(|k| (now, k.clone())).collect()
}

fn add(counts: &mut BTreeMap<String, u64>, keys: &[String]) {
    for key in keys {
        *counts.entry(key.clone()).or_default() += 1;
    }
}

/// Produces round `round` of [`plays`] and waits until the lists count it with the rest.
async fn play_round(
    cluster: &Cluster,
    ns: &str,
    topic: &str,
    counts: &mut BTreeMap<String, u64>,
    round: u64,
) {
    let keys = plays(round);
    cluster.produce(topic, &keys);
    add(counts, &keys);
    await_exact(cluster, ns, "plays", counts).await;
}

async fn await_exact(cluster: &Cluster, ns: &str, name: &str, counts: &BTreeMap<String, u64>) {
    await_exact_in(cluster, ns, name, "all", counts).await;
}

/// Waits until the list of `window` (global scope) of metric `name` ranks `counts` exactly.
async fn await_exact_in(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    window: &str,
    counts: &BTreeMap<String, u64>,
) {
    let want = top5(counts);
    await_some(
        &format!("the {window} list of {ns}/{name} = {want:?}"),
        WAIT,
        || async {
            let list = cluster.list(ns, name, window).await?;
            (items(&list) == want).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn the_chart_runs_the_operator_as_ready_pods() {
    let Some(cluster) = Cluster::get("operator pods").await else {
        return;
    };
    // `helm install` (by e2e/run.sh, from nothing) waited for the Deployment; its pods run on
    // a node, ready by their probes, and one of them holds the leader Lease.
    let pods = await_some("the operator's pods ready on a node", WAIT, || async {
        let pods = cluster.operator_pods().await;
        (!pods.is_empty()
            && pods.iter().all(|p| {
                pod_ready(p) && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            }))
        .then_some(pods)
    })
    .await;
    let deployment = Api::<Deployment>::namespaced(cluster.client.clone(), &cluster.system)
        .get(&format!("{}-topk-operator", cluster.release))
        .await
        .expect("operator Deployment");
    let want = deployment.spec.and_then(|s| s.replicas).unwrap_or(1) as usize;
    assert_eq!(pods.len(), want, "one pod per replica");
    let lease = kubectl(&[
        "get",
        "lease",
        "-n",
        &cluster.system,
        "-o",
        "jsonpath={.items[*].spec.holderIdentity}",
    ]);
    assert!(
        pods.iter().any(|p| lease.contains(&p.name_any())),
        "no operator pod holds a Lease: {lease}"
    );
}

#[tokio::test]
async fn a_known_stream_shows_its_leader_and_exact_lists() {
    let Some(cluster) = Cluster::get("known stream").await else {
        return;
    };
    // Dedupe on: the retries below carry new times, the horizon covers them. A trending list
    // of a 10m window against the hour.
    let spec = "dedupe: {horizon: 10m}
trending: {window: 10m, baseline: 1h, minCount: 1}
windows:
  - {name: 1h, length: 1h, bucket: 1m}
  - {name: all, allTime: true, bucket: 10s}
  - {name: 10m, length: 10m, bucket: 10s}";
    let (scenario, topic) = cluster.start_with("known", spec).await;
    let ns = scenario.ns.as_str();
    let keys = plays(0);
    let played: Vec<(i64, String, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (now_ms(), key.clone(), format!("play-{i}")))
        .collect();
    cluster.produce_with_ids(&cluster.bootstrap(), &topic, &played);
    let mut counts = BTreeMap::new();
    add(&mut counts, &keys);
    await_exact(&cluster, ns, "plays", &counts).await;
    // Every play sent again by a producer that stamps retries anew: the worker pods remember
    // the ids (spec.dedupe reached them through the operator's config) and count none twice.
    let retried: Vec<(i64, String, String)> = played
        .iter()
        .map(|(_, key, id)| (now_ms(), key.clone(), id.clone()))
        .collect();
    cluster.produce_with_ids(&cluster.bootstrap(), &topic, &retried);
    let workers = topk_api::names::Names::of("plays").worker;
    await_some("every retry dropped as a duplicate", WAIT, || async {
        let mut duplicates = 0.0;
        for ordinal in 0..2 {
            let pod = format!("{workers}-{ordinal}");
            let series = r#"topk_worker_dedupe_total{outcome="duplicate"}"#;
            duplicates += cluster.worker_counter(ns, &pod, series).await?;
        }
        (duplicates == retried.len() as f64).then_some(())
    })
    .await;
    await_exact(&cluster, ns, "plays", &counts).await;
    let metric = await_some("leader and ready workers", WAIT, || async {
        let m = cluster.metric(ns, "plays").await?;
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
    // What a user sees: `kubectl get tkm` (the printer columns, from the live reducer's
    // status), then the plugin reaching the reducer pod through the API server.
    let table = kubectl(&["get", "tkm", "-n", ns]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    for column in ["READY", "WORKERS", "LEADER", "WATERMARK", "LAG"] {
        assert!(header.contains(&column), "no {column} column in:\n{table}");
    }
    let row = table.lines().nth(1).unwrap_or_default();
    for value in ["plays", "True", "2/2", "song-11"] {
        assert!(
            row.split_whitespace().any(|v| v == value),
            "{value} missing in:\n{table}"
        );
    }
    let list = kubectl(&[
        "topk", "get", "plays", "-n", ns, "--window", "all", "-o", "json",
    ]);
    let list: Value = serde_json::from_str(&list).expect("kubectl topk get -o json");
    assert_eq!(items(&list), top5(&counts), "kubectl topk get");
    // Point counts of every key, on the list or not, and of one never played: the reducer pod
    // asks the worker pods that own them, by their names under the workers' headless Service.
    let mut asked: Vec<&str> = counts.keys().map(String::as_str).collect();
    asked.push("never-played");
    let mut args = vec![
        "topk", "count", "plays", "-n", ns, "--window", "all", "-o", "json",
    ];
    args.extend(&asked);
    let answer: Value = serde_json::from_str(&kubectl(&args)).expect("kubectl topk count -o json");
    let answered: BTreeMap<String, u64> = answer["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["key"].as_str().unwrap_or_default().to_owned(),
                i["count"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    let mut expected = counts.clone();
    expected.insert("never-played".into(), 0);
    assert_eq!(answered, expected, "kubectl topk count: {answer}");
    let table = kubectl(&[
        "topk", "count", "plays", "-n", ns, "--window", "all", "song-3",
    ]);
    assert!(
        table
            .lines()
            .last()
            .is_some_and(|row| row.starts_with(&format!("{:>5}", counts["song-3"]))
                && row.ends_with("song-3")),
        "{table}"
    );
    // The trending list, made by the worker pods from the operator's config: every play is in
    // both windows once the hour's minute closes, so the scores rise with the count and the
    // list is the count list, each key against its own count.
    let trending = await_some("the trending list with its baselines", WAIT, || async {
        // Not served until the first 10m boundary after the plays.
        let out = Command::new("kubectl")
            .args([
                "topk", "get", "plays", "-n", ns, "--window", "trending", "-o", "json",
            ])
            .output()
            .ok()
            .filter(|out| out.status.success())?;
        let list: Value = serde_json::from_slice(&out.stdout).ok()?;
        let settled = list["items"]
            .as_array()?
            .iter()
            .all(|i| i["baseline"] == i["count"]);
        (settled && items(&list) == top5(&counts)).then_some(list)
    })
    .await;
    for item in trending["items"].as_array().expect("items") {
        assert!(
            item["score"].as_f64().is_some_and(|s| s > 1.0),
            "{trending}"
        );
    }
    let table = kubectl(&["topk", "get", "plays", "-n", ns, "--window", "trending"]);
    assert!(
        table.contains("SCORE") && table.contains("BASELINE"),
        "{table}"
    );
    // `status` reads the metric and its assignment table: two workers, four shards.
    let status = kubectl(&["topk", "status", "plays", "-n", ns]);
    assert!(status.contains("WORKERS 2/2 ready"), "{status}");
    assert!(status.contains("leader song-11"), "{status}");
    let shards = status
        .lines()
        .skip_while(|l| l.split_whitespace().next() != Some("SHARD"))
        .skip(1)
        .take_while(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() == 3 && fields.iter().all(|f| f.parse::<u64>().is_ok())
        })
        .count();
    assert_eq!(shards, 4, "{status}");

    // The chart's alerts and dashboard name only metrics that these pods (workers, reducer,
    // operator) export: a metric renamed or an alert mistyped fails here, not silently in a
    // user's Prometheus. Awaited: some series appear at a worker's first lag check.
    let patience = tokio::time::Instant::now() + Duration::from_secs(60);
    let unknown = await_some("the chart's metrics on the pods", WAIT, || async {
        let unknown = cluster.metrics_not_exported(ns).await;
        (unknown.is_empty() || tokio::time::Instant::now() > patience).then_some(unknown)
    })
    .await;
    assert!(
        unknown.is_empty(),
        "the chart names metrics no pod exports: {unknown:?}"
    );
}

/// Uid and restart count of every pod of the metric's workers and reducers.
async fn data_plane_pods(cluster: &Cluster, ns: &str) -> BTreeMap<String, (String, i32)> {
    let selector = "app.kubernetes.io/name=topk,app.kubernetes.io/instance=plays";
    Api::<Pod>::namespaced(cluster.client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|p| {
            let component = p.labels().get("app.kubernetes.io/component");
            component.is_some_and(|c| c == "worker" || c == "reducer")
        })
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

#[tokio::test]
async fn a_takedown_leaves_the_lists_live_and_lifting_it_brings_the_key_back() {
    let Some(cluster) = Cluster::get("takedown").await else {
        return;
    };
    // Two reducer replicas: what one serves, the other serves too.
    let (scenario, topic) = cluster
        .start_with("takedown", "reducers: {replicas: 2}")
        .await;
    let ns = scenario.ns.as_str();
    let mut counts = BTreeMap::new();
    play_round(&cluster, ns, &topic, &mut counts, 0).await;
    let pods = data_plane_pods(&cluster, ns).await;
    assert_eq!(pods.len(), 4, "two workers and two reducers: {pods:?}");
    let metrics: Api<TopKMetric> = Api::namespaced(cluster.client.clone(), ns);
    let patch = |spec: Value| {
        let metrics = metrics.clone();
        async move {
            metrics
                .patch(
                    "plays",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": spec})),
                )
                .await
                .expect("patch the metric");
        }
    };
    let without = |denied: &[&str]| {
        let mut left = counts.clone();
        left.retain(|key, _| !denied.contains(&key.as_str()));
        left
    };
    // The leader taken down in the spec: gone from the list, no new event needed.
    patch(json!({"denyKeys": ["song-11"]})).await;
    await_exact(&cluster, ns, "plays", &without(&["song-11"])).await;
    // More keys from a ConfigMap the spec points at, and that ConfigMap edited.
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ns);
    let takedowns = |keys: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "takedowns"},
            "data": {"keys": keys},
        }))
        .expect("ConfigMap")
    };
    configmaps
        .create(&PostParams::default(), &takedowns("# legal\nsong-10\n"))
        .await
        .expect("create the takedowns ConfigMap");
    patch(json!({"denyKeysFrom": {"configMapKeyRef": {"name": "takedowns", "key": "keys"}}})).await;
    await_exact(&cluster, ns, "plays", &without(&["song-11", "song-10"])).await;
    configmaps
        .patch(
            "takedowns",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"keys": "song-9\n"}})),
        )
        .await
        .expect("edit the takedowns");
    await_exact(&cluster, ns, "plays", &without(&["song-11", "song-9"])).await;
    // Lifted: every key back with its true count.
    patch(json!({"denyKeys": null, "denyKeysFrom": null})).await;
    await_exact(&cluster, ns, "plays", &counts).await;
    assert_eq!(
        data_plane_pods(&cluster, ns).await,
        pods,
        "takedowns restart no pod"
    );
    let reducer_set = topk_api::names::Names::of("plays").reducer;
    let reducer = format!("{reducer_set}-0");
    let denied = cluster
        .pod_metric(ns, &reducer, 8080, "topk_reducer_denied_keys")
        .await;
    assert_eq!(denied, Some(0.0), "keys denied after the lift");

    // A rollback through the API: the reducer pod watches its metric, points the list back
    // and reports in the status (the plugin waits for it) and an Event.
    let current = cluster.list(ns, "plays", "all").await.expect("the list");
    let back = current["version"].as_u64().expect("a version") - 1;
    let answer = kubectl(&[
        "topk",
        "rollback",
        "plays",
        "-n",
        ns,
        "--window",
        "all",
        "--version",
        &back.to_string(),
    ]);
    assert!(
        answer.contains(&format!("points at version {back}")),
        "{answer}"
    );
    let rollbacks = cluster
        .pod_metric(
            ns,
            &reducer,
            8080,
            "topk_reducer_rollbacks_total{result=\"applied\"}",
        )
        .await;
    assert_eq!(rollbacks, Some(1.0));
    let events = kubectl(&[
        "get",
        "events.events.k8s.io",
        "-n",
        ns,
        "--field-selector",
        "reason=RolledBack",
        "-o",
        "name",
    ]);
    assert!(!events.trim().is_empty(), "no RolledBack Event");
    // The versions are kept: the history lists both, and the earlier one reads back by number.
    let history = kubectl(&["topk", "history", "plays", "-n", ns, "--window", "all"]);
    for version in [back, back + 1] {
        assert!(
            history
                .lines()
                .any(|l| l.trim_start().starts_with(&version.to_string())),
            "version {version} not in:\n{history}"
        );
    }
    let earlier = kubectl(&[
        "topk",
        "get",
        "plays",
        "-n",
        ns,
        "--window",
        "all",
        "--version",
        &back.to_string(),
        "-o",
        "json",
    ]);
    let earlier: Value = serde_json::from_str(&earlier).expect("kubectl topk get --version");
    assert_eq!(earlier["version"], back);

    // Both replicas know the rollback and both versions alike: replica 1 took them from
    // replica 0's ranking log.
    let replicas = [format!("{reducer_set}-0"), format!("{reducer_set}-1")];
    let both = |query: String| {
        let replicas = replicas.clone();
        let cluster = &cluster;
        async move {
            let mut answers = Vec::new();
            for pod in &replicas {
                answers.push(replica_list(cluster, ns, pod, &query).await?);
            }
            (answers[0] == answers[1]).then(|| answers.swap_remove(0))
        }
    };
    for version in [back, back + 1] {
        let query = format!("window=all&version={version}");
        let answer = await_some(
            &format!("version {version} alike on both replicas"),
            WAIT,
            || both(query.clone()),
        )
        .await;
        assert_eq!(answer["version"], version);
    }
    // The served pointer alike on both (the rollback's, or a publication since).
    await_some("the served list alike on both replicas", WAIT, || {
        both("window=all".to_owned())
    })
    .await;
    assert!(
        replica_history(&cluster, ns, &replicas[1]).await.is_some(),
        "replica 1 serves the history"
    );

    // Replica 0 killed under queries: the Service keeps answering (from replica 1), and every
    // version answered reads back the same from both replicas once replica 0 is back.
    let reducer_pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let old = reducer_pods.get(&replicas[0]).await.expect("replica 0");
    reducer_pods
        .delete(&replicas[0], &DeleteParams::default().grace_period(0))
        .await
        .expect("kill replica 0");
    let mut answered = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(list) = cluster.list(ns, "plays", "all").await
            && let Some(version) = list["version"].as_u64()
        {
            answered.insert(version);
        }
        if let Ok(Some(pod)) = reducer_pods.get_opt(&replicas[0]).await
            && pod.uid() != old.uid()
            && pod_ready(&pod)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for replica 0 back and ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!answered.is_empty(), "no answer while replica 0 was down");
    for version in answered {
        let query = format!("window=all&version={version}");
        await_some(
            &format!("answered version {version} alike on both replicas"),
            WAIT,
            || both(query.clone()),
        )
        .await;
    }
    await_some("one history on both replicas", WAIT, || async {
        let first = replica_history(&cluster, ns, &replicas[0]).await?;
        (Some(&first) == replica_history(&cluster, ns, &replicas[1]).await.as_ref()).then_some(())
    })
    .await;
}

/// `GET /v1/rankings/plays?QUERY` of one reducer pod, through the pod proxy, without its own
/// `stale` flag.
async fn replica_list(cluster: &Cluster, ns: &str, pod: &str, query: &str) -> Option<Value> {
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:8080/proxy/v1/rankings/plays?{query}");
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = cluster.client.request_text(request).await.ok()?;
    let mut list: Value = serde_json::from_str(&text).ok()?;
    list.as_object_mut()?.remove("stale");
    list.get("version")?;
    Some(list)
}

/// The all-time global list's history on one reducer pod.
async fn replica_history(cluster: &Cluster, ns: &str, pod: &str) -> Option<Value> {
    let path = format!(
        "/api/v1/namespaces/{ns}/pods/{pod}:8080/proxy/v1/rankings/plays/history?window=all&scope=&limit=1000"
    );
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = cluster.client.request_text(request).await.ok()?;
    let history: Value = serde_json::from_str(&text).ok()?;
    history.get("versions")?;
    Some(history)
}

#[tokio::test]
async fn a_metric_counts_from_a_broker_outside_the_cluster() {
    let Some(cluster) = Cluster::get("broker outside the cluster").await else {
        return;
    };
    // On the test environment's node: its Kafka on the host, on the address pods route to.
    let Some(bootstrap) = node_only("TOPK_E2E_EXTERNAL_KAFKA", "the outside broker") else {
        return;
    };
    let scenario = cluster.scenario("outside").await;
    let ns = scenario.ns.as_str();
    let topic = format!("{ns}-plays");
    cluster.create_topic_on(&bootstrap, &topic, 4);
    cluster
        .apply_metric_on(&bootstrap, ns, "plays", &topic, 2)
        .await;
    let keys = plays(9);
    let events = played_now(&keys);
    cluster.produce_on(&bootstrap, &topic, &events);
    let mut counts = BTreeMap::new();
    add(&mut counts, &keys);
    await_exact(&cluster, ns, "plays", &counts).await;
}

#[tokio::test]
async fn a_metric_on_a_sasl_ssl_listener_counts_exactly_with_secrets_mounted() {
    let Some(cluster) = Cluster::get("SASL_SSL broker").await else {
        return;
    };
    // The test environment's broker: its SASL_SSL listener for the metric, its plaintext one
    // for the test's own topic and events.
    let Some(sasl) = node_only("TOPK_E2E_SASL_KAFKA", "the SASL_SSL broker") else {
        return;
    };
    let Some(plain) = node_only("TOPK_E2E_EXTERNAL_KAFKA", "the SASL_SSL broker") else {
        return;
    };
    let secure = SecureKafka {
        tls_bootstrap: String::new(),
        sasl_bootstrap: sasl.clone(),
        tls_dir: std::env::var("TOPK_E2E_KAFKA_TLS_DIR")
            .expect("TOPK_E2E_KAFKA_TLS_DIR")
            .into(),
        user: std::env::var("TOPK_E2E_SASL_USER").expect("TOPK_E2E_SASL_USER"),
        oauth_client_id: std::env::var("TOPK_E2E_OAUTH_CLIENT_ID")
            .expect("TOPK_E2E_OAUTH_CLIENT_ID"),
        oauth_token_url: std::env::var("TOPK_E2E_OAUTH_TOKEN_URL")
            .expect("TOPK_E2E_OAUTH_TOKEN_URL"),
    };
    let scenario = cluster.scenario("sasl").await;
    let ns = scenario.ns.as_str();
    let topic = format!("{ns}-plays");
    cluster.create_topic_on(&plain, &topic, 4);
    let mut secrets: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for (secret, key, value) in secure.secret_data() {
        secrets
            .entry(secret)
            .or_default()
            .insert(key.to_owned(), value);
    }
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    for (name, data) in secrets {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name}, "stringData": data,
        }))
        .expect("a Secret");
        api.create(&PostParams::default(), &secret)
            .await
            .expect("create Secret");
    }
    // The internal topics through the same listener with OAUTHBEARER: tokens from the test
    // environment's token endpoint, which expire after a minute, so the pods renew them.
    let spec = format!(
        "internalKafka: {{{}}}\nshards: 4\nk: 5\nworkers: {{replicas: 2, idleTimeout: 2s}}\n\
         allowedLateness: 2s\nwindows:\n  - {{name: all, allTime: true, bucket: 10s}}",
        secure.oauth_cluster(&sasl, &secure.oauth_token_url)
    );
    cluster
        .create_metric(ns, "plays", &secure.scram_source(&sasl, &topic), &spec, &[])
        .await;
    let keys = plays(5);
    let events = played_now(&keys);
    cluster.produce_on(&plain, &topic, &events);
    let mut counts = BTreeMap::new();
    add(&mut counts, &keys);
    await_exact(&cluster, ns, "plays", &counts).await;

    // A rotated Secret rolls the pods (they read credentials at start): a new worker pod
    // comes up on the new template, and counting goes on exactly.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let before = pods.get("plays-worker-0").await.expect("worker 0");
    api.patch(
        topk_testenv::KAFKA_USER_SECRET,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"rotated": "once"}}})),
    )
    .await
    .expect("rotate the Secret");
    // The operator looks at Secrets on its next reconcile; a change to the metric asks now.
    cluster.poke(ns).await;
    await_some("worker 0 rolled onto the rotated Secret", WAIT, || async {
        let pod = pods.get_opt("plays-worker-0").await.ok()??;
        (pod.uid() != before.uid() && pod_ready(&pod)).then_some(())
    })
    .await;
    let keys = plays(6);
    let events = played_now(&keys);
    cluster.produce_on(&plain, &topic, &events);
    add(&mut counts, &keys);
    await_exact(&cluster, ns, "plays", &counts).await;
}

#[tokio::test]
async fn a_worker_pod_killed_mid_stream_loses_nothing_and_keeps_its_volume() {
    let Some(cluster) = Cluster::get("killed worker").await else {
        return;
    };
    let (scenario, topic) = cluster.start("kill").await;
    let ns = scenario.ns.as_str();
    let mut counts = BTreeMap::new();
    play_round(&cluster, ns, &topic, &mut counts, 1).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let claim = claims
        .get("state-plays-worker-1")
        .await
        .expect("worker 1's claim");
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
    assert!(volume.is_some(), "the claim is bound");
    let old = pods.get("plays-worker-1").await.expect("worker 1");
    pods.delete("plays-worker-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("kill worker 1");
    play_round(&cluster, ns, &topic, &mut counts, 2).await;
    // The StatefulSet's new pod is another pod on the same claim and volume, and took its
    // shards from the checkpoint on that volume, not from a snapshot or the input.
    let new = await_some("worker 1 back and ready", WAIT, || async {
        let pod = pods.get_opt("plays-worker-1").await.ok()??;
        (pod.uid() != old.uid() && pod_ready(&pod)).then_some(pod)
    })
    .await;
    let again = claims.get("state-plays-worker-1").await.expect("claim");
    assert_eq!(again.uid(), claim.uid(), "the claim was recreated");
    assert_eq!(
        again.spec.and_then(|s| s.volume_name),
        volume,
        "another volume"
    );
    assert_restored_from(&cluster, ns, &new.name_any(), "local").await;
}

#[tokio::test]
async fn scaling_out_and_back_keeps_the_lists_exact_through_handoff_snapshots() {
    let Some(cluster) = Cluster::get("scale").await else {
        return;
    };
    let (scenario, topic) = cluster.start("scale").await;
    let ns = scenario.ns.as_str();
    let mut counts = BTreeMap::new();
    for (round, replicas) in [(3u64, 3), (4, 2), (5, 2)] {
        let keys = plays(round);
        cluster.produce(&topic, &keys);
        add(&mut counts, &keys);
        cluster.scale(ns, replicas).await;
        cluster.await_settled(ns, replicas).await;
        await_exact(&cluster, ns, "plays", &counts).await;
        if replicas == 3 {
            // The new worker's shards came from their previous owners' release snapshots.
            assert_restored_from(&cluster, ns, "plays-worker-2", "handoff").await;
        }
    }
}

#[tokio::test]
async fn the_operator_killed_mid_rescale_resumes_it() {
    let Some(cluster) = Cluster::get("operator killed").await else {
        return;
    };
    let (scenario, topic) = cluster.start("opkill").await;
    let ns = scenario.ns.as_str();
    let mut counts = BTreeMap::new();
    play_round(&cluster, ns, &topic, &mut counts, 7).await;
    cluster.scale(ns, 3).await;
    // Kill every operator pod once the rescale is under way; the Deployment brings new ones,
    // one takes the Lease and finishes the step the status recorded.
    await_some("the rescale under way", WAIT, || async {
        let status = cluster.metric(ns, "plays").await?.status?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.status == "True")
            .then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.system);
    for pod in cluster.operator_pods().await {
        pods.delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
            .await
            .expect("kill an operator pod");
    }
    let more = plays(8);
    cluster.produce(&topic, &more);
    add(&mut counts, &more);
    cluster.await_settled(ns, 3).await;
    await_exact(&cluster, ns, "plays", &counts).await;
}
#[tokio::test]
async fn an_hourly_recount_advances_exact_until() {
    let Some(cluster) = Cluster::get("hourly recount").await else {
        return;
    };
    let scenario = cluster.scenario("recount").await;
    let ns = scenario.ns.clone();
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    // Events of an hour two hours back, and a metric that recounts from that hour on
    // (`topk.io/recount-from`), so closed hours exist without waiting for one to close.
    let now = now_ms();
    let hour = now.div_euclid(3_600_000) * 3_600_000 - 2 * 3_600_000;
    let keys = plays(6);
    let events: Vec<(i64, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (hour + 60_000 + i as i64 * 1_000, key.clone()))
        .collect();
    cluster.produce_at(&topic, &events);
    let from = k8s_openapi::jiff::Timestamp::from_millisecond(hour)
        .expect("hour")
        .to_string();
    // The annotation counts when the metric is created (the operator's first plan).
    cluster
        .apply_metric_with(
            &cluster.bootstrap(),
            &ns,
            "plays",
            &topic,
            2,
            &[("topk.io/recount-from", from.as_str())],
            // Not the defaults (5m, 1000000): the Jobs must run with these.
            "recount: {grace: 7m, maxInMemory: 5000}\nwindows:\n  - {name: 1h, length: 1h, bucket: 1m}\n  - {name: 24h, length: 24h, bucket: 1h, refresh: 1m}",
        )
        .await;
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
    // The Job's own report: it read the metric's recount settings from the mounted config.
    assert_eq!(
        (last.grace_ms, last.max_in_memory),
        (420_000, 5_000),
        "{last:?}"
    );
    // The refreshed 24h list: once both past hours are known (the second one is recounted a
    // grace after the current hour began, unless its streaming list came first), it is
    // published every minute; the window's own ends are on the hour.
    let refreshed = |after: Option<String>| {
        let (cluster, ns) = (&cluster, &ns);
        async move {
            let list = cluster.list(ns, "plays", "24h").await?;
            let end = list["windowEnd"].as_str()?.to_owned();
            let between_hours =
                topk_engine::event::parse_rfc3339_ms(&end).is_some_and(|ms| ms % 3_600_000 != 0);
            (between_hours && after.is_none_or(|a| end > a)).then_some(list)
        }
    };
    let first = await_some(
        "a 24h list ending between hours",
        WAIT + Duration::from_secs(480),
        || refreshed(None),
    )
    .await;
    // Every event of the window, counted exactly.
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for key in &keys {
        *counts.entry(key.clone()).or_default() += 1;
    }
    assert_eq!(items(&first), top5(&counts), "{first}");
    let first_end = first["windowEnd"].as_str().map(str::to_owned);
    await_some("the 24h list's head a minute later", WAIT, || {
        refreshed(first_end.clone())
    })
    .await;
}

#[tokio::test]
async fn an_unchanged_helm_upgrade_rolls_nothing() {
    let Some(cluster) = Cluster::get("helm upgrade").await else {
        return;
    };
    let (scenario, _topic) = cluster.start("upgrade").await;
    let ns = scenario.ns.clone();
    // Every pod there before the upgrade: the workers settled and the reducer's pod created.
    cluster.await_settled(&ns, 2).await;
    let before = await_some("the worker and reducer pods", WAIT, || async {
        let pods = data_plane_pods(&cluster, &ns).await;
        (pods.len() == 3).then_some(pods)
    })
    .await;
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), &ns);
    let generations = |sets: &Api<StatefulSet>| {
        let sets = sets.clone();
        async move {
            let mut out: Vec<(String, Option<i64>)> = sets
                .list(&ListParams::default())
                .await
                .expect("StatefulSets")
                .items
                .iter()
                .map(|s| (s.name_any(), s.metadata.generation))
                .collect();
            out.sort();
            out
        }
    };
    let set_generations = generations(&sets).await;
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
    // A reconcile after the upgrade, made to happen (an annotation is a watch event) and seen
    // finished (the counter moves after the objects are applied): it would roll what an
    // upgraded operator renders differently.
    let reconciles = cluster.operator_reconciles().await;
    cluster.poke(&ns).await;
    await_some("a reconcile after the upgrade", WAIT, || async {
        (cluster.operator_reconciles().await > reconciles).then_some(())
    })
    .await;
    assert_eq!(
        generations(&sets).await,
        set_generations,
        "an unchanged upgrade changed a StatefulSet"
    );
    let after = data_plane_pods(&cluster, &ns).await;
    assert_eq!(
        before, after,
        "pods were replaced or restarted by an unchanged upgrade"
    );
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
async fn events_posted_to_the_ingest_gateway_are_counted_and_removing_it_deletes_it() {
    let Some(cluster) = Cluster::get("ingest gateway").await else {
        return;
    };
    let scenario = cluster.scenario("ingest").await;
    let ns = scenario.ns.as_str();
    let topic = format!("{ns}-plays");
    cluster.create_topic(&topic, 4);
    cluster
        .apply_metric_with(
            &cluster.bootstrap(),
            ns,
            "plays",
            &topic,
            2,
            &[],
            // Small requests: the node's two cores also hold the workers and the reducer.
            "ingest: {replicas: 2, maxEventsPerRequest: 200, resources: {requests: {cpu: 100m}}}",
        )
        .await;
    let names = topk_api::names::Names::of("plays");
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), ns);
    cluster
        .await_ready_with(
            ns,
            "two ready ingest gateways, and the metric Ready",
            || async {
                deployments
                    .get(&names.ingest)
                    .await
                    .ok()?
                    .status?
                    .ready_replicas
            },
        )
        .await;

    // Producers with no Kafka client POST JSON lines to the Service (here through the API
    // server's proxy); one bad event is rejected at its index, the others counted exactly.
    let keys = plays(4);
    let now = now_ms();
    let mut body = String::new();
    for (i, key) in keys.iter().enumerate() {
        let event = json!({"event_time": now, "metric": "plays", "key": key,
            "event_id": format!("ingest-{i}")});
        body.push_str(&format!("{event}\n"));
        if i == 3 {
            body.push_str("{\"event_time\": 1, \"metric\": \"plays\"}\n");
        }
    }
    let path = format!(
        "/api/v1/namespaces/{ns}/services/{}:http/proxy/v1/events",
        names.ingest
    );
    let answer: Value = await_some("the gateway's answer", WAIT, || async {
        let request = http::Request::post(&path)
            .header("content-type", "application/x-ndjson")
            .body(body.clone().into_bytes())
            .ok()?;
        let text = cluster.client.request_text(request).await.ok()?;
        serde_json::from_str(&text).ok()
    })
    .await;
    assert_eq!(answer["accepted"], keys.len(), "{answer}");
    assert_eq!(answer["rejected"], 1, "{answer}");
    assert_eq!(answer["errors"][0]["index"], 4, "{answer}");
    let mut counts = BTreeMap::new();
    add(&mut counts, &keys);
    await_exact(&cluster, ns, "plays", &counts).await;
    // Over the spec's limit: refused whole, nothing produced.
    let too_many = body.repeat(3);
    let request = http::Request::post(&path)
        .header("content-type", "application/x-ndjson")
        .body(kube::client::Body::from(too_many.into_bytes()))
        .expect("request");
    let refused = cluster.client.send(request).await.expect("an answer");
    assert_eq!(refused.status(), http::StatusCode::PAYLOAD_TOO_LARGE);

    // Dropped from the spec: the Deployment, Service and budget go; the lists stay.
    Api::<TopKMetric>::namespaced(cluster.client.clone(), ns)
        .patch(
            "plays",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"ingest": null}})),
        )
        .await
        .expect("remove spec.ingest");
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), ns);
    await_some("the ingest gateway's objects deleted", WAIT, || async {
        let gone = deployments.get_opt(&names.ingest).await.ok()?.is_none()
            && services.get_opt(&names.ingest).await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    await_exact(&cluster, ns, "plays", &counts).await;
}

/// Writes `lines` to `topic` with Kafka's own console producer in the dev broker's pod: no key,
/// so records land wherever that producer puts them, as a producer that knows nothing of topk
/// writes them.
/// A TopKMetric from `yaml` (with `NS` replaced by the scenario's namespace), created.
async fn create_manifest(cluster: &Cluster, ns: &str, yaml: &str) {
    let metric = topk_api::load_manifest(&yaml.replace("NS", ns)).expect("manifest");
    Api::<TopKMetric>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
}

/// A regional metric counting `plays` on its own topic, small enough that two regions and
/// their global metric fit the node: one shard, one worker, one reducer; 10s buckets.
const REGION: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: plays-REGION, namespace: NS}
spec:
  metric: plays
  source: {kafka: {bootstrapServers: "BOOTSTRAP", topic: NS-REGION}}
  shards: 1
  k: 5
  allowedLateness: 2s
  recount: {enabled: false}
  workers: {replicas: 1, idleTimeout: 2s, resources: {requests: {cpu: 100m, memory: 128Mi}}}
  reducers: {resources: {requests: {cpu: 100m, memory: 128Mi}}}
  windows: [{name: 1h, length: 1h, bucket: 10s}]
  region: {name: REGION, global: {name: plays-global}}
"#;

/// The global metric adding up regions `eu` and `us`, on the same broker.
const GLOBAL: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: plays-global, namespace: NS}
spec:
  metric: plays
  regions: {names: [eu, us], wait: 5s}
  internalKafka: {bootstrapServers: "BOOTSTRAP"}
  k: 5
  reducers: {resources: {requests: {cpu: 100m, memory: 128Mi}}}
  windows: [{name: 1h, length: 1h, bucket: 10s}]
"#;

/// The global metric's 1h list (`version`: that stored version), through the service proxy.
async fn global_list(cluster: &Cluster, ns: &str, version: Option<u64>) -> Option<Value> {
    let mut path = format!(
        "/api/v1/namespaces/{ns}/services/{}:http/proxy/v1/rankings/plays?window=1h&k=5",
        topk_api::names::Names::of("plays-global").reducer
    );
    if let Some(version) = version {
        path.push_str(&format!("&version={version}"));
    }
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = cluster.client.request_text(request).await.ok()?;
    serde_json::from_str(&text).ok()
}

fn names_of(list: &Value, field: &str) -> Vec<String> {
    list[field]
        .as_array()
        .map(|names| {
            (names.iter())
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for a global list with exactly `want`, covering `complete` and missing `missing`.
async fn await_global(
    cluster: &Cluster,
    ns: &str,
    want: &[(String, u64)],
    complete: &[&str],
    missing: &[&str],
) -> Value {
    await_some(
        &format!("the global list = {want:?}, complete {complete:?}, missing {missing:?}"),
        WAIT,
        || async {
            let list = global_list(cluster, ns, None).await?;
            (items(&list) == want
                && names_of(&list, "completeRegions") == complete
                && names_of(&list, "missingRegions") == missing)
                .then_some(list)
        },
    )
    .await
}

/// The StatefulSet `name`'s replicas, set by hand (the metric is paused meanwhile).
async fn set_replicas(cluster: &Cluster, ns: &str, name: &str, replicas: i32) {
    Api::<StatefulSet>::namespaced(cluster.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale the StatefulSet");
}

async fn set_paused(cluster: &Cluster, ns: &str, name: &str, paused: bool) {
    Api::<TopKMetric>::namespaced(cluster.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": paused}})),
        )
        .await
        .expect("pause the metric");
}

#[tokio::test]
async fn a_global_metric_adds_up_its_regions_and_names_a_missing_one_until_it_is_back() {
    let Some(cluster) = Cluster::get("regions").await else {
        return;
    };
    let scenario = cluster.scenario("regions").await;
    let ns = scenario.ns.as_str();
    let bootstrap = cluster.bootstrap();
    for region in ["eu", "us"] {
        cluster.create_topic(&format!("{ns}-{region}"), 1);
        let yaml = REGION
            .replace("REGION", region)
            .replace("BOOTSTRAP", &bootstrap);
        create_manifest(&cluster, ns, &yaml).await;
    }
    create_manifest(&cluster, ns, &GLOBAL.replace("BOOTSTRAP", &bootstrap)).await;
    // The operator gives the global metric reducers only, and says so when they are ready.
    await_some("the global metric Ready", WAIT, || async {
        let status = cluster.metric(ns, "plays-global").await?.status?;
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "True" && ready.message == "1 reducers ready").then_some(())
    })
    .await;
    let workers = Api::<StatefulSet>::namespaced(cluster.client.clone(), ns);
    let global_names = topk_api::names::Names::of("plays-global");
    assert!(
        workers
            .get_opt(&global_names.worker)
            .await
            .expect("get")
            .is_none(),
        "a global metric has no workers"
    );

    // Per region, what it was sent; the global list is their sum.
    let mut counts: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    let mut play = |region: &'static str, key: &str, times: usize| {
        let keys = vec![key.to_owned(); times];
        cluster.produce(&format!("{ns}-{region}"), &keys);
        add(counts.entry(region).or_default(), &keys);
        let mut sum = BTreeMap::new();
        for (key, count) in counts.values().flatten() {
            *sum.entry(key.clone()).or_default() += count;
        }
        (top5(&counts["eu"]), top5(&sum))
    };
    play("eu", "song-1", 5);
    play("eu", "song-2", 3);
    play("us", "song-1", 2);
    let (_, want) = play("us", "song-3", 4);
    let complete = await_global(&cluster, ns, &want, &["eu", "us"], &[]).await;
    assert_eq!(complete["mode"], "exact", "{complete}");

    // Region us stops: its metric paused (the operator leaves it alone), its reducer gone.
    set_paused(&cluster, ns, "plays-us", true).await;
    let us_reducer = topk_api::names::Names::of("plays-us").reducer;
    set_replicas(&cluster, ns, &us_reducer, 0).await;
    let (eu, _) = play("eu", "song-4", 9);
    let partial = await_global(&cluster, ns, &eu, &["eu"], &["us"]).await;
    // Its window end was published on time: the version before it is the end one bucket
    // earlier, so no end waited for the missing region longer than `wait`.
    let version = partial["version"].as_u64().expect("version");
    let before = global_list(&cluster, ns, Some(version - 1))
        .await
        .expect("the version before");
    let end = |list: &Value| {
        let text = list["windowEnd"].as_str().unwrap_or_default();
        text.parse::<k8s_openapi::jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .unwrap_or_default()
    };
    assert_eq!(
        end(&partial) - end(&before),
        10_000,
        "{before}
{partial}"
    );
    let shown = kubectl(&["topk", "get", "plays-global", "-n", ns, "--window", "1h"]);
    assert!(shown.contains("missing us  INCOMPLETE"), "{shown}");
    let status = kubectl(&["topk", "status", "plays-global", "-n", ns]);
    assert!(status.contains("global of regions eu, us"), "{status}");

    // Back: its next list completes the global one again, with what us counted meanwhile.
    let (_, want) = play("us", "song-5", 11);
    set_replicas(&cluster, ns, &us_reducer, 1).await;
    set_paused(&cluster, ns, "plays-us", false).await;
    let back = await_global(&cluster, ns, &want, &["eu", "us"], &[]).await;
    assert_eq!(back["mode"], "exact", "{back}");
}

/// Produces `lines` with Kafka's console producer in the dev broker's pod: no key, stamped
/// with the time of sending, records up to 4 MiB.
fn produce_unkeyed(cluster: &Cluster, topic: &str, lines: &str) {
    run_with_input(
        Command::new("kubectl")
            .args([
                "exec",
                "-i",
                "-n",
                &cluster.system,
                &cluster.kafka_pod(),
                "--",
            ])
            .args([
                "/opt/kafka/bin/kafka-console-producer.sh",
                "--bootstrap-server",
            ])
            .args(["localhost:9092", "--topic", topic])
            .args(["--producer-property", "max.request.size=4194304"]),
        lines,
        "the console producer",
    );
}

/// Runs `command` with `lines` on its standard input and returns its standard output, once it
/// has exited successfully.
fn run_with_input(command: &mut Command, lines: &str, what: &str) -> Vec<u8> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    // Written from a thread of its own, so that a command printing as it reads cannot fill its
    // output pipe while its input is still being written; dropped at the end, closing it.
    let mut stdin = child.stdin.take().expect("stdin");
    let lines = lines.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(lines.as_bytes()));
    let out = child.wait_with_output().expect(what);
    let written = writer.join().expect("the input writer");
    assert!(out.status.success(), "{what} failed");
    written.expect("write events");
    out.stdout
}

#[tokio::test]
async fn a_topic_keyed_by_anything_is_combined_and_counted_exactly() {
    let Some(cluster) = Cluster::get("combiners").await else {
        return;
    };
    let scenario = cluster.scenario("combine").await;
    let ns = scenario.ns.as_str();
    let topic = format!("{ns}-plays");
    // Not one partition per shard: combiners read any layout.
    cluster.create_topic(&topic, 3);
    // The combiners hold sums for a flush interval and commit them in a transaction, so a
    // sum reaches its worker seconds after its events' time (more on a loaded node); an idle
    // shard's watermark moves on with the clock, and a sum behind it would be late.
    let spec = r#"
shards: 4
k: 5
workers: {replicas: 2, idleTimeout: 2s}
allowedLateness: 15s
combiners: {replicas: 2, flushInterval: 1s, resources: {requests: {cpu: 100m}}}
windows:
  - {name: 1h, length: 1h, bucket: 1m}
  - {name: all, allTime: true, bucket: 10s}
"#;
    let source = format!(
        "bootstrapServers: \"{}\", topic: {topic}",
        cluster.bootstrap()
    );
    let mut metric: TopKMetric =
        topk_api::load_manifest(&metric_manifest_from("plays", "plays", &source, spec))
            .expect("manifest");
    if let Some(source) = metric.spec.source.as_mut() {
        source.partitioned_by = topk_api::manifest::PartitionedBy::Any;
    }
    Api::<TopKMetric>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
    let names = topk_api::names::Names::of("plays");
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), ns);
    cluster
        .await_ready_with(ns, "two ready combiners, and the metric Ready", || async {
            sets.get(&names.combiner).await.ok()?.status?.ready_replicas
        })
        .await;

    let mut counts = BTreeMap::new();
    for round in [3, 6] {
        let keys = plays(round);
        let now = now_ms();
        let lines: String = keys
            .iter()
            .map(|key| {
                format!(
                    "{}\n",
                    json!({"event_time": now, "metric": "plays", "key": key})
                )
            })
            .collect();
        produce_unkeyed(&cluster, &topic, &lines);
        add(&mut counts, &keys);
        await_exact(&cluster, ns, "plays", &counts).await;
    }
    // Fewer sums than events reached the workers.
    let events: u64 = counts.values().sum();
    let mut partials = 0.0;
    for ordinal in 0..2 {
        let pod = format!("{}-{ordinal}", names.combiner);
        partials += cluster
            .pod_metric(ns, &pod, 8080, "topk_combiner_partials_total")
            .await
            .expect("a combiner's metrics");
    }
    assert!(
        partials > 0.0 && partials < events as f64,
        "{partials} sums for {events} events"
    );
}

#[tokio::test]
async fn deleting_the_metric_removes_what_it_created() {
    let Some(cluster) = Cluster::get("delete").await else {
        return;
    };
    let (scenario, _topic) = cluster.start("delete").await;
    let ns = scenario.ns.clone();
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

/// The runtime settings of the Dockerfile's last stage, read here independently of the
/// node's image builder: (entrypoint, user, env, exposed ports, copy destinations).
fn dockerfile_runtime(text: &str) -> (Value, String, Vec<String>, Vec<String>, Vec<String>) {
    let joined = text.replace("\\\n", " ");
    let lines: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let last = lines
        .iter()
        .rposition(|l| l.to_uppercase().starts_with("FROM "))
        .expect("a FROM line");
    let (mut entrypoint, mut user) = (Value::Null, String::new());
    let (mut env, mut ports, mut dests) = (Vec::new(), Vec::new(), Vec::new());
    for line in &lines[last + 1..] {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word.to_uppercase().as_str() {
            "ENTRYPOINT" => entrypoint = serde_json::from_str(rest).expect("exec-form ENTRYPOINT"),
            "USER" => user = rest.trim().to_owned(),
            "ENV" => env.push(rest.trim().to_owned()),
            "EXPOSE" => ports.extend(rest.split_whitespace().map(|p| format!("{p}/tcp"))),
            "COPY" => dests.push(
                rest.split_whitespace()
                    .last()
                    .expect("COPY dest")
                    .to_owned(),
            ),
            _ => {}
        }
    }
    (entrypoint, user, env, ports, dests)
}

#[test]
fn the_node_image_matches_the_dockerfile() {
    // Only where the image was made without Docker (`e2e/run.sh testenv`); on kind the image
    // is the Dockerfile's own build.
    let Some(archive) = node_only("TOPK_E2E_IMAGE_ARCHIVE", "the node image check") else {
        return;
    };
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile"))
        .expect("Dockerfile");
    let (entrypoint, user, env, ports, dests) = dockerfile_runtime(&dockerfile);
    let member = |name: &str| -> Vec<u8> {
        let out = Command::new("tar")
            .args(["-xOf", &archive, name])
            .output()
            .expect("tar");
        assert!(out.status.success(), "{name} not in {archive}");
        out.stdout
    };
    let manifest: Value = serde_json::from_slice(&member("manifest.json")).expect("manifest");
    let config: Value = serde_json::from_slice(&member(
        manifest[0]["Config"].as_str().expect("config name"),
    ))
    .expect("image config");
    let config = &config["config"];
    assert_eq!(config["Entrypoint"], entrypoint);
    assert_eq!(config["User"].as_str(), Some(user.as_str()));
    let image_env: Vec<&str> = config["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for var in &env {
        assert!(
            image_env.contains(&var.as_str()),
            "{var} not in {image_env:?}"
        );
    }
    let mut image_ports: Vec<String> = config["ExposedPorts"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    image_ports.sort();
    let mut ports = ports;
    ports.sort();
    assert_eq!(image_ports, ports);
    // The layer holds the binaries and libraries where the Dockerfile copies them.
    let layer = manifest[0]["Layers"][0].as_str().expect("layer").to_owned();
    let files = Command::new("sh")
        .arg("-c")
        .arg(format!("tar -xOf '{archive}' '{layer}' | tar -t"))
        .output()
        .expect("tar");
    let files = String::from_utf8_lossy(&files.stdout);
    let bin = dests
        .first()
        .expect("binaries' COPY")
        .trim_start_matches('/');
    let lib = dests
        .get(1)
        .expect("libraries' COPY")
        .trim_start_matches('/');
    for file in [
        format!("{bin}topk"),
        format!("{bin}topk-operator"),
        format!("{lib}libz.so.1"),
    ] {
        assert!(
            files.lines().any(|f| f == file),
            "{file} not in the image's layer"
        );
    }
}

#[test]
fn metric_names_are_read_from_the_chart_and_from_a_metrics_page() {
    let used = chart_metric_names();
    for name in [
        "topk_worker_input_gaps_total",
        "topk_reducer_publication_delay_seconds_bucket",
        "topk_operator_reconcile_errors_total",
    ] {
        assert!(used.contains(name), "{name} not in {used:?}");
    }
    assert!(used.iter().all(|n| n.len() > "topk_".len()), "{used:?}");
    let page = "# HELP topk_worker_events Events read.\n# TYPE topk_worker_events counter\n\
                topk_worker_events_total{shard=\"0\"} 3\n\
                topk_reducer_publish_seconds_bucket{le=\"0.1\"} 1\ntopk_worker_state_bytes 10\n";
    let exported = exported_names(page);
    for name in [
        "topk_worker_events_total",
        "topk_worker_events",
        "topk_reducer_publish_seconds_bucket",
        "topk_reducer_publish_seconds",
        "topk_worker_state_bytes",
    ] {
        assert!(exported.contains(name), "{name} not in {exported:?}");
    }
    assert!(!exported.iter().any(|n| n.starts_with('#')), "{exported:?}");
}

#[tokio::test]
async fn a_hostile_stream_neither_stops_nor_skews_a_list() {
    let Some(cluster) = Cluster::get("a hostile stream").await else {
        return;
    };
    // As topics that predate Kafka 4's bound on record timestamps, or were configured past it,
    // are: any timestamp; records up to 4 MiB.
    let (scenario, topic) = cluster
        .start_on_topic(
            "hostile",
            &[
                "message.timestamp.after.max.ms=9223372036854775807",
                "max.message.bytes=4194304",
            ],
            "maxScopes: 100",
        )
        .await;
    let ns = scenario.ns.as_str();
    let mut counts = BTreeMap::new();
    play_round(&cluster, ns, &topic, &mut counts, 1).await;
    for window in ["1h", "all"] {
        await_exact_in(&cluster, ns, "plays", window, &counts).await;
    }

    // Every hostile event carries a cost that would put its key on top of the lists, were it
    // counted.
    let now = now_ms();
    let heavy = |time: i64, key: &str| json!({"event_time": time, "metric": "plays", "key": key, "cost": 1000});
    // Stamped as CreateTime with their event time, as Kafka Streams and Flink sinks do: 50
    // minutes ahead (inside Kafka 4's default one-hour bound) and a year ahead.
    cluster.produce_events(
        &cluster.bootstrap(),
        &topic,
        &[
            heavy(now + 50 * 60_000, "ahead-50m"),
            heavy(now + 365 * 86_400_000, "ahead-1y"),
        ],
    );
    // Not keyed, from Kafka's own console producer: invalid JSON, a JSON array of the
    // fields in order, an array around an event, a 1 MB scope and a 2 MB record.
    // Each batch stamped as it is sent, as a live producer's events are.
    let now = now_ms();
    let mut wrapped = heavy(now, "wrapped");
    let mut big_scope = heavy(now, "big-scope");
    big_scope["scope"] = json!("s".repeat(1_000_000));
    let big_record = heavy(now, &"k".repeat(2_000_000));
    wrapped = json!([wrapped]);
    let lines = [
        "{\"event_time\": ".to_owned(),
        json!([null, now, "plays", "", "array", 1000]).to_string(),
        wrapped.to_string(),
        big_scope.to_string(),
        big_record.to_string(),
    ];
    produce_unkeyed(&cluster, &topic, &(lines.join("\n") + "\n"));
    // A flood of 50,000 new scopes, keyed as topk expects: each shard counts 100 of them and
    // rejects the rest.
    let now = now_ms();
    let flood: Vec<Value> = (0..50_000)
        .map(|i| json!({"event_time": now, "metric": "plays", "scope": format!("flood-{i}"), "key": "song-0"}))
        .collect();
    cluster.produce_events(&cluster.bootstrap(), &topic, &flood);

    // Honest events after all that: the lists keep publishing, and count only honest events.
    play_round(&cluster, ns, &topic, &mut counts, 2).await;
    for window in ["1h", "all"] {
        await_exact_in(&cluster, ns, "plays", window, &counts).await;
    }
    let rejected = |reason: &'static str| {
        let cluster = &cluster;
        async move {
            let series = format!("topk_worker_events_rejected_total{{reason=\"{reason}\"}}");
            let mut total = 0.0;
            for pod in ["plays-worker-0", "plays-worker-1"] {
                total += cluster
                    .worker_counter(ns, pod, &series)
                    .await
                    .unwrap_or(0.0);
            }
            total
        }
    };
    assert_eq!(rejected("future_time").await, 2.0);
    assert_eq!(rejected("late").await, 0.0, "no honest event taken as late");
    assert!(rejected("too_many_scopes").await >= 49_000.0);
    let turned_away = [
        "invalid_json",
        "oversize_scope",
        "oversize_key",
        "oversize_event",
        "wrong_shard",
    ];
    let mut unkeyed = 0.0;
    for reason in turned_away {
        unkeyed += rejected(reason).await;
    }
    assert_eq!(unkeyed, 5.0, "each unkeyed hostile record rejected once");
}

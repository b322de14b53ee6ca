//! Test support for the real services of `scripts/testenv.sh`: Apache Kafka (KRaft),
//! kube-apiserver with etcd and kube-controller-manager, and Helm.
//!
//! Tests call [`TestEnv::get`] first. When the environment is not up it prints a loud skip
//! message and returns `None`, unless `TOPK_REQUIRE_TESTENV=1` (set by CI), where it panics:
//! a CI run can never pass by skipping.

// Test support: a failed unwrap fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka;

pub use kafka::PrivateKafka;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TestEnvError {
    #[error("cannot read the test environment file {path}: {source}")]
    EnvFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the test environment file {path} lacks {key}")]
    Missing { path: PathBuf, key: &'static str },
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
}

/// Where the services of a running test environment are.
#[derive(Debug, Clone)]
pub struct TestEnv {
    pub env_file: PathBuf,
    pub kafka_bootstrap: String,
    /// The Kafka jars, for tests that run a broker of their own (see [`PrivateKafka`]).
    pub kafka_libs: PathBuf,
    pub kubeconfig: PathBuf,
    pub kube_version: String,
    pub helm: PathBuf,
    /// The Prometheus operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule) as YAML
    /// files; `None` in an environment written by an older script.
    pub monitoring_crds: Option<PathBuf>,
    /// The address the test environment gave this machine on an interface of its own (as
    /// root), which the apiserver can proxy to; `None` without one.
    pub host_address: Option<String>,
    /// The broker's TLS and SASL_SSL listeners.
    pub secure_kafka: SecureKafka,
}

/// The broker's secured listeners: mutual TLS, and SASL_SSL with SCRAM-SHA-512,
/// SCRAM-SHA-256 and PLAIN for one user and OAUTHBEARER with tokens from the test
/// environment's token endpoint; certificates from the test environment's own CA.
#[derive(Debug, Clone)]
pub struct SecureKafka {
    /// Mutual TLS: a client certificate signed by the CA is required.
    pub tls_bootstrap: String,
    pub sasl_bootstrap: String,
    /// `ca.crt`, `client.crt`, `client.key`, `sasl-password` and `oauth-client-secret`.
    pub tls_dir: PathBuf,
    pub user: String,
    /// The OAuth client the token endpoint knows.
    pub oauth_client_id: String,
    /// The token endpoint (HTTPS, its certificate from the same CA) as the host reaches it.
    pub oauth_token_url: String,
}

/// Secret names the secured sources below reference.
pub const KAFKA_CA_SECRET: &str = "kafka-ca";
pub const KAFKA_USER_SECRET: &str = "topk-user";

impl SecureKafka {
    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.tls_dir.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", self.tls_dir.join(name).display()))
    }

    pub fn password(&self) -> String {
        self.file("sasl-password").trim().to_owned()
    }

    /// The Secrets' data as (Secret, key, value): the CA, the user's password (`password`),
    /// client certificate and key (`user.crt`, `user.key`) and OAuth client secret
    /// (`oauth-client-secret`).
    pub fn secret_data(&self) -> Vec<(&'static str, &'static str, String)> {
        vec![
            (KAFKA_CA_SECRET, "ca.crt", self.file("ca.crt")),
            (KAFKA_USER_SECRET, "password", self.password()),
            (
                KAFKA_USER_SECRET,
                "oauth-client-secret",
                self.file("oauth-client-secret"),
            ),
            (KAFKA_USER_SECRET, "user.crt", self.file("client.crt")),
            (KAFKA_USER_SECRET, "user.key", self.file("client.key")),
        ]
    }

    /// Writes the Secrets' keys under `dir` as the operator mounts them (`SECRET/KEY`).
    pub fn write_secret_files(&self, dir: &Path) {
        for (secret, key, value) in self.secret_data() {
            std::fs::create_dir_all(dir.join(secret)).expect("secret dir");
            std::fs::write(dir.join(secret).join(key), value).expect("secret file");
        }
    }

    /// `spec.source.kafka`'s settings (flow YAML, without braces) for SCRAM-SHA-512 over TLS
    /// on `bootstrap` (the SASL_SSL listener, as the client reaches it).
    pub fn scram_source(&self, bootstrap: &str, topic: &str) -> String {
        format!(
            "bootstrapServers: \"{bootstrap}\", topic: {topic}, \
             tls: {{trustedCertificates: [{{secretName: {KAFKA_CA_SECRET}, certificate: ca.crt}}]}}, \
             authentication: {{type: scram-sha-512, username: {}, \
             passwordSecret: {{secretName: {KAFKA_USER_SECRET}, password: password}}}}",
            self.user
        )
    }

    /// A cluster's connection settings (flow YAML, without braces: `spec.internalKafka`, or
    /// `spec.source.kafka` with a topic added) for OAUTHBEARER over TLS on `bootstrap` (the
    /// SASL_SSL listener), with tokens from `token_url` (the endpoint as the client reaches it),
    /// whose certificate the same CA signed.
    pub fn oauth_cluster(&self, bootstrap: &str, token_url: &str) -> String {
        format!(
            "bootstrapServers: \"{bootstrap}\", \
             tls: {{trustedCertificates: [{{secretName: {KAFKA_CA_SECRET}, certificate: ca.crt}}]}}, \
             authentication: {{type: oauth, clientId: {}, tokenEndpointUri: \"{token_url}\", \
             clientSecret: {{secretName: {KAFKA_USER_SECRET}, key: oauth-client-secret}}, \
             scope: kafka, \
             tlsTrustedCertificates: [{{secretName: {KAFKA_CA_SECRET}, certificate: ca.crt}}]}}",
            self.oauth_client_id
        )
    }

    /// `spec.source.kafka`'s settings for mutual TLS on the TLS listener.
    pub fn mutual_tls_source(&self, topic: &str) -> String {
        format!(
            "bootstrapServers: \"{}\", topic: {topic}, \
             tls: {{trustedCertificates: [{{secretName: {KAFKA_CA_SECRET}, certificate: ca.crt}}]}}, \
             authentication: {{type: tls, certificateAndKey: {{secretName: {KAFKA_USER_SECRET}, \
             certificate: user.crt, key: user.key}}}}",
            self.tls_bootstrap
        )
    }
}

/// The env file `scripts/testenv.sh up` writes.
pub fn env_file_path() -> PathBuf {
    if let Some(path) = std::env::var_os("TOPK_TESTENV_ENV_FILE") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("TOPK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            home.join(".cache").join("topk")
        });
    cache.join("testenv").join("run").join("env")
}

/// Whether a missing environment fails the test instead of skipping it.
pub fn required() -> bool {
    std::env::var("TOPK_REQUIRE_TESTENV").is_ok_and(|v| v == "1")
}

impl TestEnv {
    /// The running environment, or `None` (with a loud message) to skip `test`.
    pub fn get(test: &str) -> Option<TestEnv> {
        let path = env_file_path();
        match TestEnv::load(&path) {
            Ok(env) => Some(env),
            Err(err) if required() => {
                panic!(
                    "{test}: the test environment is required (TOPK_REQUIRE_TESTENV=1) but unusable: {err}"
                )
            }
            Err(err) => {
                eprintln!(
                    "\n*** SKIPPED {test}: no test environment ({err}).\n*** Start one with `scripts/testenv.sh up`; CI sets TOPK_REQUIRE_TESTENV=1 so this cannot pass by skipping.\n"
                );
                None
            }
        }
    }

    pub fn load(path: &Path) -> Result<TestEnv, TestEnvError> {
        let text = std::fs::read_to_string(path).map_err(|source| TestEnvError::EnvFile {
            path: path.to_owned(),
            source,
        })?;
        let vars: HashMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .collect();
        let get = |key: &'static str| {
            vars.get(key)
                .map(|v| v.to_string())
                .ok_or_else(|| TestEnvError::Missing {
                    path: path.to_owned(),
                    key,
                })
        };
        Ok(TestEnv {
            env_file: path.to_owned(),
            kafka_bootstrap: get("TOPK_KAFKA_BOOTSTRAP")?,
            kafka_libs: PathBuf::from(get("TOPK_KAFKA_LIBS")?),
            kubeconfig: PathBuf::from(get("TOPK_KUBECONFIG")?),
            kube_version: get("TOPK_KUBE_VERSION")?,
            helm: PathBuf::from(get("TOPK_HELM")?),
            monitoring_crds: vars.get("TOPK_MONITORING_CRDS").map(PathBuf::from),
            host_address: vars.get("TOPK_TESTENV_NODE_IP").map(|v| v.to_string()),
            secure_kafka: SecureKafka {
                tls_bootstrap: get("TOPK_KAFKA_TLS_BOOTSTRAP")?,
                sasl_bootstrap: get("TOPK_KAFKA_SASL_BOOTSTRAP")?,
                tls_dir: PathBuf::from(get("TOPK_KAFKA_TLS_DIR")?),
                user: get("TOPK_KAFKA_SASL_USER")?,
                oauth_client_id: get("TOPK_KAFKA_OAUTH_CLIENT_ID")?,
                oauth_token_url: get("TOPK_KAFKA_OAUTH_TOKEN_URL")?,
            },
        })
    }

    /// A Kafka client configuration pointing at the broker.
    pub fn kafka_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.kafka_bootstrap);
        config
    }

    /// A transactional producer of any kind (with a unique `transactional.id`), its
    /// transactions initialised; panics on failure, as a test setup step.
    pub fn transactional_producer<C, Part, P>(&self) -> P
    where
        C: rdkafka::producer::ProducerContext<Part>,
        Part: rdkafka::producer::Partitioner,
        P: rdkafka::config::FromClientConfig + rdkafka::producer::Producer<C, Part>,
    {
        let producer: P = self
            .kafka_config()
            .set("transactional.id", unique_name("tx"))
            .create()
            .expect("transactional producer");
        producer
            .init_transactions(Duration::from_secs(30))
            .expect("init transactions");
        producer
    }

    /// Creates topic `name` with `partitions` partitions and topic `config` (e.g.
    /// `cleanup.policy=compact`); panics on failure, as a test setup step.
    pub async fn create_topic(&self, name: &str, partitions: i32, config: &[(&str, &str)]) {
        create_topic(&self.kafka_config(), name, partitions, config).await;
    }

    /// [`create_metric_topics`] on the environment's broker.
    pub async fn create_metric_topics(
        &self,
        namespace: &str,
        name: &str,
        input: &str,
        shards: u32,
    ) {
        create_metric_topics(&self.kafka_config(), namespace, name, input, shards).await;
    }

    /// Deletes what [`TestEnv::create_metric_topics`] created, so that a benchmark's bulk
    /// input does not pile up on the broker's disk run after run; panics on failure.
    pub async fn delete_metric_topics(
        &self,
        namespace: &str,
        name: &str,
        input: &str,
        shards: u32,
    ) {
        let mut topics = vec![input.to_owned()];
        topics.extend(
            topk_api::topics::internal_topics(
                namespace,
                name,
                shards,
                false,
                topk_api::record::DEFAULT_SUMMARY_RECORD_BYTES,
            )
            .into_iter()
            .map(|t| t.name),
        );
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        self.delete_topics(&names).await;
    }

    /// Deletes topics `names`; panics on failure (a benchmark's clean-up).
    pub async fn delete_topics(&self, names: &[&str]) {
        let admin: AdminClient<DefaultClientContext> =
            self.kafka_config().create().expect("Kafka admin client");
        let results = admin
            .delete_topics(names, &AdminOptions::new())
            .await
            .expect("delete topics");
        for r in results {
            r.expect("topic deleted");
        }
    }
}

/// Creates the input topic with `shards` partitions and the internal topics of TopKMetric
/// `name` in `namespace`, as the operator does; panics on failure (a setup step).
pub async fn create_metric_topics(
    kafka: &ClientConfig,
    namespace: &str,
    name: &str,
    input: &str,
    shards: u32,
) {
    // Records larger than the default 1 MB limit, as a topic may allow, reach the workers.
    create_topic(
        kafka,
        input,
        shards as i32,
        &[("max.message.bytes", "4194304")],
    )
    .await;
    create_internal_topics(kafka, namespace, name, shards).await;
}

/// Creates the internal topics of TopKMetric `name` in `namespace` (with `shards`), as the
/// operator does, on the broker `kafka` points at; panics on failure (a setup step).
pub async fn create_internal_topics(
    kafka: &ClientConfig,
    namespace: &str,
    name: &str,
    shards: u32,
) {
    let record_bytes = topk_api::record::DEFAULT_SUMMARY_RECORD_BYTES;
    for topic in topk_api::topics::internal_topics(namespace, name, shards, false, record_bytes) {
        let config = topic.config();
        let config: Vec<(&str, &str)> = config.iter().map(|(k, v)| (*k, v.as_str())).collect();
        create_topic(kafka, &topic.name, topic.partitions, &config).await;
    }
}

/// Creates a topic through the broker `kafka` points at; panics on failure (a setup step).
pub async fn create_topic(
    kafka: &ClientConfig,
    name: &str,
    partitions: i32,
    config: &[(&str, &str)],
) {
    {
        let admin: AdminClient<DefaultClientContext> = kafka.create().expect("Kafka admin client");
        let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        for (k, v) in config {
            topic = topic.set(k, v);
        }
        let results = admin
            .create_topics([&topic], &AdminOptions::new())
            .await
            .expect("create topics");
        for r in results {
            r.expect("topic created");
        }
    }
}

impl TestEnv {
    /// A kube client authenticated as the environment's admin.
    pub async fn kube_client(&self) -> Result<Client, TestEnvError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// A client that acts as `user` (impersonation, e.g. `system:serviceaccount:NS:NAME`), to
    /// check what RBAC lets that identity do.
    pub async fn kube_client_as(&self, user: &str) -> Result<Client, TestEnvError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.auth_info.impersonate = Some(user.to_owned());
        Ok(Client::try_from(config)?)
    }

    /// Creates a fresh namespace for one test (see [`fresh_namespace`]).
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<String, TestEnvError> {
        fresh_namespace(client, prefix).await
    }
}

/// Creates a namespace named after `prefix` and waits for its default ServiceAccount: the
/// apiserver admits a Pod only once its ServiceAccount exists, and the controller manager
/// creates a namespace's `default` one just after the namespace.
pub async fn fresh_namespace(client: &Client, prefix: &str) -> Result<String, TestEnvError> {
    let name = unique_name(prefix);
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .map_err(|e| TestEnvError::Kube(kube::Error::SerdeError(e)))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    await_some(
        &format!("the default ServiceAccount of {name}"),
        Duration::from_secs(30),
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await;
    Ok(name)
}

/// Server-side applies a CRD and waits until the apiserver serves it.
pub async fn install_crd(
    client: &Client,
    crd: &CustomResourceDefinition,
) -> Result<(), TestEnvError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().ok_or(TestEnvError::Missing {
        path: PathBuf::from("crd"),
        key: "metadata.name",
    })?;
    crds.patch(
        &name,
        &PatchParams::apply("topk-testenv").force(),
        &Patch::Apply(crd),
    )
    .await?;
    await_some(
        "the CRD to be established",
        Duration::from_secs(60),
        || async {
            let status = crds.get(&name).await.ok()?.status?;
            status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
    // Discovery lags a moment behind Established: wait until the resource can be listed.
    let gvk = kube::api::GroupVersionKind::gvk(
        &crd.spec.group,
        &crd.spec.versions[0].name,
        &crd.spec.names.kind,
    );
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let objects: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    await_some(
        "the CRD's resource to be served",
        Duration::from_secs(30),
        || async {
            objects
                .list(&ListParams::default().limit(1))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    Ok(())
}

/// A name unique across tests and processes: `prefix-<pid>-<seq>-<time>`, lower case, short
/// enough for Kubernetes object names and Kafka topics.
pub fn unique_name(prefix: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{seq}-{:x}",
        std::process::id(),
        nanos % 0xfffff
    )
}

/// A consumer for reading back with `assign` on the broker `kafka` points at: a fresh group id
/// (librdkafka requires one even without a group) and no offset commits.
pub fn reading_consumer(kafka: &ClientConfig, prefix: &str) -> BaseConsumer {
    kafka
        .clone()
        .set("group.id", unique_name(prefix))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// Where `consumer` reads `topic`/`partition` next (0 before it has read).
fn position(consumer: &BaseConsumer, topic: &str, partition: i32) -> i64 {
    consumer
        .position()
        .ok()
        .and_then(
            |list| match list.find_partition(topic, partition)?.offset() {
                Offset::Offset(at) => Some(at),
                _ => None,
            },
        )
        .unwrap_or(0)
}

/// A record as read back by [`read_partition`].
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub offset: i64,
    pub key: String,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

/// Every record in `partition` of `topic` right now (from its low to its high watermark),
/// read with [`reading_consumer`]; panics after a minute without reaching the end.
pub fn read_partition(kafka: &ClientConfig, topic: &str, partition: i32) -> Vec<ReadRecord> {
    let consumer = reading_consumer(kafka, "read");
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .expect("watermarks");
    let mut out = Vec::new();
    if high <= low {
        return out;
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))
        .expect("offset");
    consumer.assign(&tpl).expect("assign");
    let mut next = low;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while next < high {
        assert!(
            std::time::Instant::now() < deadline,
            "reading {topic}/{partition}: stuck at {next} of {high}"
        );
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            // Transaction markers and aborted records are never delivered: the position
            // moves past them (only committed records are read, librdkafka's default).
            next = next.max(position(&consumer, topic, partition));
            continue;
        };
        let msg = msg.expect("message");
        next = (msg.offset() + 1).max(position(&consumer, topic, partition));
        let headers = msg
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let value = h.value.unwrap_or_default();
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(value).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ReadRecord {
            offset: msg.offset(),
            key: String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned(),
            payload: msg.payload().unwrap_or_default().to_vec(),
            headers,
        });
    }
    out
}

/// A TopKMetric manifest (YAML) named `name` that counts `metric` from `topic` on `bootstrap`;
/// `spec` holds the rest of the spec, one field per line, unindented.
pub fn metric_manifest(
    name: &str,
    metric: &str,
    bootstrap: &str,
    topic: &str,
    spec: &str,
) -> String {
    let source = format!("bootstrapServers: \"{bootstrap}\", topic: {topic}");
    metric_manifest_from(name, metric, &source, spec)
}

/// [`metric_manifest`] with `spec.source.kafka` given as flow YAML without braces.
pub fn metric_manifest_from(name: &str, metric: &str, kafka_source: &str, spec: &str) -> String {
    let mut out = format!(
        "apiVersion: topk.io/v1alpha1\nkind: TopKMetric\nmetadata: {{name: {name}}}\nspec:\n  \
         metric: {metric}\n  source: {{kafka: {{{kafka_source}}}}}\n"
    );
    for line in spec.trim_matches('\n').lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The (key, count) pairs of a served ranking (`GET /v1/topk` JSON); empty when it has none.
pub fn list_items(list: &serde_json::Value) -> Vec<(String, u64)> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| {
                    (
                        i["key"].as_str().unwrap_or_default().to_owned(),
                        i["count"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `check` until it yields `Some`, panicking with `what` after `timeout`.
pub async fn await_some<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// There is no kubelet: Pods stay Pending. This marks the Pods matching `selector` as
/// Running and Ready (as a kubelet would) so that controllers waiting for readiness proceed.
pub async fn mark_pods_ready(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<usize, TestEnvError> {
    set_pod_phase(client, namespace, selector, "Running", true, None).await
}

/// Plays the kubelet for StatefulSet `name` until its status reports `replicas` ready: marks
/// its Pods (matching `selector`) ready as the controller manager creates them.
pub async fn ready_statefulset(
    client: &Client,
    namespace: &str,
    name: &str,
    selector: &str,
    replicas: i32,
    timeout: Duration,
) {
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    await_some(
        &format!("{replicas} ready in StatefulSet {name}"),
        timeout,
        || async {
            mark_pods_ready(client, namespace, selector).await.ok()?;
            let ready = statefulsets.get(name).await.ok()?.status?.ready_replicas?;
            (ready == replicas).then_some(())
        },
    )
    .await;
}

/// Marks the Pods matching `selector` as Succeeded (a finished Job's Pods).
pub async fn mark_pods_succeeded(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<usize, TestEnvError> {
    set_pod_phase(client, namespace, selector, "Succeeded", false, None).await
}

/// [`mark_pods_succeeded`] with `message` as each container's termination message, as a
/// kubelet reports what the container wrote to `/dev/termination-log`.
pub async fn mark_pods_succeeded_with(
    client: &Client,
    namespace: &str,
    selector: &str,
    message: &str,
) -> Result<usize, TestEnvError> {
    set_pod_phase(
        client,
        namespace,
        selector,
        "Succeeded",
        false,
        Some(message),
    )
    .await
}

/// Marks the Pods matching `selector` as Failed (exit code 1), as a crashed Job Pod.
pub async fn mark_pods_failed(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<usize, TestEnvError> {
    set_pod_phase(client, namespace, selector, "Failed", false, None).await
}

async fn set_pod_phase(
    client: &Client,
    namespace: &str,
    selector: &str,
    phase: &str,
    ready: bool,
    message: Option<&str>,
) -> Result<usize, TestEnvError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = if ready { "True" } else { "False" };
    for pod in &list.items {
        let Some(name) = pod.metadata.name.as_deref() else {
            continue;
        };
        let containers: Vec<_> = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        let container_statuses: Vec<_> = containers
            .iter()
            .map(|c| {
                let state = if phase == "Succeeded" {
                    serde_json::json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now, "message": message}})
                } else if phase == "Failed" {
                    serde_json::json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}})
                } else {
                    serde_json::json!({"running": {"startedAt": now}})
                };
                serde_json::json!({"name": c, "ready": ready, "restartCount": 0, "image": "testenv", "imageID": "", "state": state, "started": ready})
            })
            .collect();
        let patch = serde_json::json!({
            "status": {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "startTime": now,
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
                    {"type": "Ready", "status": status, "lastTransitionTime": now},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                ],
                "containerStatuses": container_statuses,
            }
        });
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(list.items.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_manifest_loads_with_its_spec_lines_in_place() {
        let spec = "shards: 3\nk: 7\nwindows:\n  - {name: 1h, length: 1h, bucket: 1m}\n";
        let manifest = metric_manifest("m", "plays", "kafka:9092", "input", spec);
        let metric = topk_api::load_manifest(&manifest).expect("manifest");
        assert_eq!(metric.metadata.name.as_deref(), Some("m"));
        assert_eq!(metric.spec.metric, "plays");
        assert_eq!(
            metric.spec.source.as_ref().expect("source").kafka.topic,
            "input"
        );
        assert_eq!((metric.spec.shards, metric.spec.k), (Some(3), 7));
        assert_eq!(metric.spec.windows.len(), 1);
    }
}

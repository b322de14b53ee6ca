//! Internal topics on another Kafka cluster than the input's, on the real apiserver and two
//! real brokers: `spec.internalKafka` puts them there, the operator's default does so for a
//! metric that does not say and records it on the metric, a later change of the default moves
//! no deployed metric, and the apiserver refuses to point a metric's internal topics elsewhere.

use std::time::Duration;

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use topk_api::TopKMetric;
use topk_api::manifest::{INTERNAL_KAFKA_ANNOTATION, INTERNAL_ON_SOURCE, KafkaCluster};
use topk_operator::builders::Settings;
use topk_operator::reconcile::{self, Context};
use topk_testenv::{PrivateKafka, await_some, metric_manifest, unique_name};

const WAIT: Duration = Duration::from_secs(90);
const SPEC: &str =
    "shards: 2\nk: 5\nwindows:\n  - {name: 1m, length: 1m, bucket: 10s}\nrecount: {enabled: false}";

async fn create_metric(
    client: &Client,
    ns: &str,
    name: &str,
    bootstrap: &str,
    topic: &str,
    spec: &str,
) {
    let manifest = metric_manifest(name, "plays", bootstrap, topic, spec);
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    Api::<TopKMetric>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
}

/// The controller of namespace `ns` only, with `internal_kafka` as its default.
fn controller(
    client: &Client,
    ns: &str,
    internal_kafka: Option<KafkaCluster>,
) -> tokio::task::JoinHandle<()> {
    let settings = Settings {
        drain: Duration::from_secs(600),
        watch_namespaces: vec![ns.to_owned()],
        internal_kafka,
        ..Settings::default()
    };
    tokio::spawn(reconcile::run(Context::new(client.clone(), settings)))
}

/// Names of the topics on the broker `kafka` points at.
fn topics_on(kafka: &ClientConfig) -> Vec<String> {
    let client: BaseConsumer = kafka.create().expect("metadata client");
    let metadata = client
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .collect()
}

/// The rendered config of metric `name`, once the operator has written it.
async fn rendered(configmaps: &Api<ConfigMap>, name: &str) -> String {
    let data = await_some(&format!("{name}'s config"), WAIT, || async {
        configmaps
            .get_opt(&format!("{name}-config"))
            .await
            .ok()??
            .data
    })
    .await;
    data[topk_api::CONFIG_KEY].clone()
}

#[tokio::test]
async fn internal_topics_go_where_the_spec_or_the_default_says_and_stay_there() {
    let Some((env, client, ns)) =
        common::setup("internal topics on another cluster", "internal").await
    else {
        return;
    };
    let internal = tokio::task::spawn_blocking({
        let env = env.clone();
        move || PrivateKafka::start(&env)
    })
    .await
    .expect("the internal cluster");
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let input = unique_name("plays");
    common::create_topic(&env, &input, 2).await;
    let own_spec = format!(
        "internalKafka: {{bootstrapServers: \"{}\"}}\n{SPEC}",
        internal.bootstrap()
    );
    create_metric(&client, &ns, "own", &env.kafka_bootstrap, &input, &own_spec).await;
    create_metric(
        &client,
        &ns,
        "defaulted",
        &env.kafka_bootstrap,
        &input,
        SPEC,
    )
    .await;
    let default = KafkaCluster {
        bootstrap_servers: internal.bootstrap(),
        tls: None,
        authentication: None,
        config: Default::default(),
    };
    let running = controller(&client, &ns, Some(default));

    // Both metrics' internal topics are created on the internal cluster, none on the input's.
    common::await_internal_topics_on(&internal.config(), &ns, "own", 2).await;
    common::await_internal_topics_on(&internal.config(), &ns, "defaulted", 2).await;
    let on_input = topics_on(&env.kafka_config());
    for name in ["own", "defaulted"] {
        for topic in topk_api::topics::internal_topics(&ns, name, 2, false) {
            assert!(
                !on_input.contains(&topic.name),
                "{} on the input's cluster",
                topic.name
            );
        }
        let config = rendered(&configmaps, name).await;
        assert!(config.contains(&internal.bootstrap()), "{config}");
    }
    // The default is recorded on the metric that took it; the spec speaks for the other.
    let recorded = metrics.get("defaulted").await.expect("defaulted");
    let pin = &recorded.annotations()[INTERNAL_KAFKA_ANNOTATION];
    let pinned: KafkaCluster = serde_json::from_str(pin).expect("a cluster");
    assert_eq!(pinned.bootstrap_servers, internal.bootstrap());
    let own = metrics.get("own").await.expect("own");
    assert!(!own.annotations().contains_key(INTERNAL_KAFKA_ANNOTATION));

    // The internal topics hold the metric's state: the apiserver refuses to move them.
    for (name, patch) in [
        (
            "own",
            serde_json::json!({"spec": {"internalKafka": {"bootstrapServers": "elsewhere:9092"}}}),
        ),
        ("own", serde_json::json!({"spec": {"internalKafka": null}})),
        (
            "defaulted",
            serde_json::json!({"spec": {"internalKafka": {"bootstrapServers": "elsewhere:9092"}}}),
        ),
    ] {
        let refused = metrics
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err("moving the internal topics is refused");
        assert!(
            refused
                .to_string()
                .contains("internalKafka cannot be added, removed or pointed"),
            "{refused}"
        );
    }

    // Without a default, a new metric keeps its internal topics on the input's cluster, and
    // the metric that took the earlier default stays where it is.
    running.abort();
    let _running = controller(&client, &ns, None);
    create_metric(&client, &ns, "later", &env.kafka_bootstrap, &input, SPEC).await;
    common::await_internal_topics(&env, &ns, "later", 2).await;
    let later = await_some("later's record", WAIT, || async {
        metrics
            .get("later")
            .await
            .ok()?
            .annotations()
            .get(INTERNAL_KAFKA_ANNOTATION)
            .cloned()
    })
    .await;
    assert_eq!(later, INTERNAL_ON_SOURCE);
    // A spec change makes the new controller render it again: still on the internal cluster.
    let changed = metrics
        .patch(
            "defaulted",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"k": 6}})),
        )
        .await
        .expect("change k");
    let config = await_some("defaulted rendered again", WAIT, || async {
        let metric = metrics.get("defaulted").await.ok()?;
        let seen = metric.status?.observed_generation;
        (seen == changed.metadata.generation).then_some(())?;
        Some(rendered(&configmaps, "defaulted").await)
    })
    .await;
    assert!(config.contains("\"k\": 6"), "{config}");
    assert!(config.contains(&internal.bootstrap()), "{config}");
}

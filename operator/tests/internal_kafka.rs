//! Internal topics, on the real apiserver and real brokers. On another Kafka cluster than the
//! input's: `spec.internalKafka` puts them there, the operator's default does so for a metric
//! that does not say and records it on the metric, a later change of the default moves no
//! deployed metric, and the apiserver refuses to point a metric's internal topics elsewhere.
//! As topk needs them: created with their settings, and a topic found otherwise (made by hand
//! or by a broker that creates topics on first use) makes the metric `Degraded` until fixed.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
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
        for topic in topk_api::topics::internal_topics(
            &ns,
            name,
            2,
            false,
            topk_api::record::DEFAULT_SUMMARY_RECORD_BYTES,
        ) {
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

/// The condition `Degraded` of metric `name` once its reason is `reason`.
async fn degraded_for(metrics: &Api<TopKMetric>, name: &str, reason: &str) -> String {
    await_some(&format!("{name} Degraded {reason}"), WAIT, || async {
        let degraded = common::condition(metrics, name, "Degraded").await?;
        (degraded.reason == reason).then_some(degraded.message)
    })
    .await
}

#[tokio::test]
async fn internal_topics_found_misconfigured_make_the_metric_degraded_until_fixed() {
    let Some((env, client, ns)) = common::setup("internal topics misconfigured", "topicconf").await
    else {
        return;
    };
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let input = unique_name("plays");
    common::create_topic(&env, &input, 2).await;
    let spec = format!("workers: {{maxSummaryRecordBytes: {}}}\n{SPEC}", 2 << 20);
    let names = topk_api::topics::TopicNames::of(&ns, "handmade");
    // As a broker that creates topics on first use leaves them: one partition, `delete`, the
    // default size limit.
    env.create_topic(&names.snapshots, 1, &[]).await;
    env.create_topic(&names.summaries, 1, &[]).await;
    create_metric(
        &client,
        &ns,
        "handmade",
        &env.kafka_bootstrap,
        &input,
        &spec,
    )
    .await;
    create_metric(&client, &ns, "fresh", &env.kafka_bootstrap, &input, &spec).await;
    let _running = controller(&client, &ns, None);

    // What the operator creates has the settings topk relies on, including room for the
    // larger summaries.
    let fresh = topk_api::topics::internal_topics(&ns, "fresh", 2, false, 2 << 20);
    common::await_topics_as_created(&env.kafka_config(), &fresh).await;
    assert!(
        fresh[0]
            .config()
            .contains(&("max.message.bytes", "2162688".to_owned()))
    );

    let message = degraded_for(&metrics, "handmade", "InternalTopicMisconfigured").await;
    for expected in [
        format!("{}: 1 partitions, needs 2", names.snapshots),
        "cleanup.policy is \"delete\", needs \"compact\"".to_owned(),
        format!(
            "{}: max.message.bytes is 1048588, below the 2162688 bytes",
            names.summaries
        ),
    ] {
        assert!(message.contains(&expected), "{expected:?} in {message}");
    }
    let ready = common::condition(&metrics, "handmade", "Ready").await;
    assert_eq!(ready.map(|c| c.status), Some("False".to_owned()));

    // Fixed as the message says: the size limit raised, the snapshots topic deleted (its
    // partitions cannot be removed); the operator creates it again and the metric recovers.
    let admin: AdminClient<DefaultClientContext> =
        env.kafka_config().create().expect("admin client");
    let raised = AlterConfig::new(ResourceSpecifier::Topic(&names.summaries))
        .set("max.message.bytes", "4194304");
    for result in admin
        .alter_configs([&raised], &AdminOptions::new())
        .await
        .expect("alter configs")
    {
        result.expect("max.message.bytes raised");
    }
    env.delete_topics(&[&names.snapshots]).await;
    degraded_for(&metrics, "handmade", "AsExpected").await;
    let handmade = topk_api::topics::internal_topics(&ns, "handmade", 2, false, 2 << 20);
    common::await_topics_as_created(&env.kafka_config(), &handmade[1..2]).await;
    assert_eq!(
        common::condition(&metrics, "fresh", "Degraded")
            .await
            .map(|c| c.reason),
        Some("AsExpected".to_owned())
    );
}

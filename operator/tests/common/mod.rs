//! Setup shared by the operator's tests against the real test environment.
#![allow(dead_code)] // each test binary uses its own subset

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, Client};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use topk_api::TopKMetric;
use topk_api::topics::InternalTopic;
use topk_testenv::{TestEnv, install_crd};

/// The test environment, a client, the CRD installed and a fresh namespace; None (after a loud
/// message) when the environment is absent on a developer's machine.
pub async fn setup(test: &str, ns_prefix: &str) -> Option<(TestEnv, Client, String)> {
    let env = TestEnv::get(test)?;
    let client = env.kube_client().await.expect("client");
    install_crd(&client, &topk_api::crd::crd())
        .await
        .expect("CRD");
    let ns = env.namespace(&client, ns_prefix).await.expect("namespace");
    Some((env, client, ns))
}

pub async fn create_topic(env: &TestEnv, name: &str, partitions: i32) {
    env.create_topic(name, partitions, &[]).await;
}

/// Waits until every internal topic of metric `name` (with `shards`) exists on the broker
/// with the partitions and settings topk relies on.
pub async fn await_internal_topics(env: &TestEnv, ns: &str, name: &str, shards: u32) {
    await_internal_topics_on(&env.kafka_config(), ns, name, shards).await;
}

/// [`await_internal_topics`] on the broker `kafka` points at.
pub async fn await_internal_topics_on(kafka: &ClientConfig, ns: &str, name: &str, shards: u32) {
    let record_bytes = topk_api::record::DEFAULT_SUMMARY_RECORD_BYTES;
    let internal = topk_api::topics::internal_topics(ns, name, shards, false, record_bytes);
    await_topics_as_created(kafka, &internal).await;
}

/// Waits until `topics` exist on the broker `kafka` points at, and asserts that each has the
/// partitions and settings it is created with.
pub async fn await_topics_as_created(kafka: &ClientConfig, topics: &[InternalTopic]) {
    let admin: AdminClient<DefaultClientContext> = kafka.create().expect("admin");
    let found =
        topk_testenv::await_some("the internal topics", Duration::from_secs(90), || async {
            let md = admin
                .inner()
                .fetch_metadata(None, Duration::from_secs(5))
                .ok()?;
            let partitions: Option<Vec<usize>> = topics
                .iter()
                .map(|t| {
                    let found = md.topics().iter().find(|m| m.name() == t.name)?;
                    Some(found.partitions().len())
                })
                .collect();
            partitions
        })
        .await;
    let specifiers: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(&t.name))
        .collect();
    let configs = admin
        .describe_configs(specifiers.iter(), &AdminOptions::new())
        .await
        .expect("describe the topics' configs");
    for ((topic, partitions), config) in topics.iter().zip(found).zip(configs) {
        let config = config.expect("the topic's config");
        let value = |name: &str| config.get(name).and_then(|e| e.value.as_deref());
        assert_eq!(topic.problems(partitions, value), Vec::<String>::new());
        for (key, wanted) in topic.config() {
            assert_eq!(value(key), Some(wanted.as_str()), "{}: {key}", topic.name);
        }
    }
}

/// The TopKMetric's condition of `type_`, if it has one yet.
pub async fn condition(api: &Api<TopKMetric>, name: &str, type_: &str) -> Option<Condition> {
    let status = api.get(name).await.ok()?.status?;
    status.conditions.into_iter().find(|c| c.type_ == type_)
}

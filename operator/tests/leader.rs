//! Two operator replicas on the real apiserver: only the lease holder reconciles, and the
//! other takes over when the holder stops.

mod common;

use std::sync::Arc;
use std::time::Duration;

use kube::api::PostParams;
use kube::{Api, Client};
use topk_api::TopKMetric;
use topk_operator::builders::Settings;
use topk_operator::leader::LeaderElector;
use topk_operator::reconcile::{self, Context};
use topk_testenv::{await_some, unique_name};

fn replica(client: &Client) -> Arc<Context> {
    Context::new(client.clone(), Settings::default())
}

#[tokio::test]
async fn two_replicas_never_both_act_and_the_follower_takes_over() {
    let Some((env, client, ns)) = common::setup("operator leader election", "lead").await else {
        return;
    };
    let manifest = format!(
        r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {{name: votes}}
spec:
  metric: votes
  source: {{kafka: {{bootstrapServers: "{}", topic: {}}}}}
  shards: 2
  k: 5
  windows: [{{name: 1m, length: 1m, bucket: 10s}}]
"#,
        env.kafka_bootstrap,
        unique_name("votes")
    );
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    Api::<TopKMetric>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &metric)
        .await
        .expect("create");

    let lease = unique_name("lease");
    let (a, b) = (replica(&client), replica(&client));
    let elector =
        |id: &str| LeaderElector::new(client.clone(), &ns, &lease, id, Duration::from_secs(2));
    let tick = Duration::from_millis(300);
    let task_a = tokio::spawn(reconcile::run_when_leader(
        a.clone(),
        elector("replica-a"),
        tick,
    ));
    // Give replica a the lease before b starts competing, so the roles are known.
    await_some(
        "replica a to reconcile",
        Duration::from_secs(30),
        || async { (a.metrics.reconciles() > 0).then_some(()) },
    )
    .await;
    let task_b = tokio::spawn(reconcile::run_when_leader(
        b.clone(),
        elector("replica-b"),
        tick,
    ));

    // For several lease periods, b never acts while a renews.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < deadline {
        assert_eq!(
            b.metrics.reconciles(),
            0,
            "the follower reconciled while the leader was alive"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The leader stops; after the lease expires the follower takes over.
    task_a.abort();
    let stopped_at = a.metrics.reconciles();
    await_some(
        "replica b to take over",
        Duration::from_secs(30),
        || async { (b.metrics.reconciles() > 0).then_some(()) },
    )
    .await;
    assert_eq!(
        a.metrics.reconciles(),
        stopped_at,
        "the stopped leader does not act"
    );
    task_b.abort();
}

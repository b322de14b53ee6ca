//! Two operator replicas on the real apiserver: only the lease holder reconciles, and the
//! other takes over when the holder stops; a leader whose renewals hang stops acting before a
//! follower takes over; a leader stopped with SIGTERM hands the lease over at once.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;

use kube::api::PostParams;
use kube::{Api, Client};
use topk_api::TopKMetric;
use topk_operator::builders::Settings;
use topk_operator::leader::LeaderElector;
use topk_operator::reconcile::{self, Context};
use topk_testenv::{await_some, unique_name};

async fn create_metric(env: &topk_testenv::TestEnv, client: &Client, ns: &str) {
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
    Api::<TopKMetric>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &metric)
        .await
        .expect("create");
}

/// Replica `id`'s elector over Lease `lease` in `ns`.
fn elector(
    client: Client,
    ns: &str,
    lease: &str,
    id: &str,
    duration: Duration,
) -> Arc<LeaderElector> {
    Arc::new(LeaderElector::new(client, ns, lease, id, duration))
}

fn replica(client: &Client) -> Arc<Context> {
    Context::new(client.clone(), Settings::default())
}

#[tokio::test]
async fn two_replicas_never_both_act_and_the_follower_takes_over() {
    let Some((env, client, ns)) = common::setup("operator leader election", "lead").await else {
        return;
    };
    create_metric(&env, &client, &ns).await;

    let lease = unique_name("lease");
    let (a, b) = (replica(&client), replica(&client));
    let elector = |id: &str| elector(client.clone(), &ns, &lease, id, Duration::from_secs(2));
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

/// A client that answers through `client` until `frozen`, and from then on never answers (a
/// network partition between the replica and the apiserver).
fn freezable(client: Client, frozen: Arc<AtomicBool>) -> Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, frozen) = (client.clone(), frozen.clone());
        async move {
            if frozen.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            client.send(request).await
        }
    });
    Client::new(service, "default")
}

#[tokio::test]
async fn a_leader_whose_renewals_hang_stops_acting_before_a_follower_takes_over() {
    let Some((_env, client, ns)) = common::setup("operator leader partitioned", "hang").await
    else {
        return;
    };
    let lease = unique_name("lease");
    let duration = Duration::from_secs(3);
    let frozen = Arc::new(AtomicBool::new(false));
    let elector = |client: Client, id: &str| elector(client, &ns, &lease, id, duration);
    let tick = Duration::from_millis(300);
    let (a, b) = (replica(&client), replica(&client));
    let a_elector = elector(freezable(client.clone(), frozen.clone()), "replica-a");
    let task_a = tokio::spawn(reconcile::run_when_leader(a.clone(), a_elector, tick));
    await_some("replica a to lead", Duration::from_secs(30), || async {
        a.metrics.is_leading().then_some(())
    })
    .await;
    let task_b = tokio::spawn(reconcile::run_when_leader(
        b.clone(),
        elector(client.clone(), "replica-b"),
        tick,
    ));

    // a's requests to the apiserver hang from now on: it cannot renew, and must stop acting
    // before b can see the lease expire. Never do both act.
    frozen.store(true, Ordering::SeqCst);
    let frozen_at = Instant::now();
    let deadline = frozen_at + Duration::from_secs(30);
    let mut a_stopped = None;
    while !b.metrics.is_leading() {
        assert!(Instant::now() < deadline, "replica b never took over");
        if a_stopped.is_none() && !a.metrics.is_leading() {
            a_stopped = Some(frozen_at.elapsed());
        }
        assert!(
            !(a.metrics.is_leading() && b.metrics.is_leading()),
            "both replicas act"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!a.metrics.is_leading(), "both replicas act");
    let a_stopped = a_stopped.expect("a stopped before b led");
    assert!(
        a_stopped < duration,
        "a acted {a_stopped:?} without a renewal"
    );
    task_a.abort();
    task_b.abort();
}

/// The holder of Lease `name` in `ns`, if any.
async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    let lease = leases.get_opt(name).await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// The operator's binary as replica `identity`, electing over Lease `lease` in `ns`.
fn operator_process(env: &topk_testenv::TestEnv, ns: &str, lease: &str, identity: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_topk-operator"))
        .args(["--listen", "127.0.0.1:0", "--lease-namespace", ns])
        .args(["--lease-name", lease, "--identity", identity])
        .args(["--watch-namespaces", ns])
        .env("KUBECONFIG", &env.kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start topk-operator")
}

#[tokio::test]
async fn a_leader_stopped_with_sigterm_hands_the_lease_over_at_once() {
    let Some((env, client, ns)) = common::setup("operator leader SIGTERM", "sigterm").await else {
        return;
    };
    create_metric(&env, &client, &ns).await;
    let lease = unique_name("lease");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut a = operator_process(&env, &ns, &lease, "replica-a");
    await_some("replica a to lead", Duration::from_secs(30), || async {
        (holder(&leases, &lease).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let mut b = operator_process(&env, &ns, &lease, "replica-b");

    // A rollout stops the leader with SIGTERM: b leads well before the 15 s lease would
    // expire.
    let stopped = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let exit = tokio::task::spawn_blocking(move || a.wait())
        .await
        .expect("join")
        .expect("wait for a");
    assert!(exit.success(), "a exits cleanly on SIGTERM: {exit}");
    await_some("replica b to lead", Duration::from_secs(30), || async {
        (holder(&leases, &lease).await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    let handed_over = stopped.elapsed();
    let _ = b.kill();
    let _ = b.wait();
    assert!(
        handed_over < Duration::from_secs(5),
        "b took {handed_over:?} to lead after a stopped"
    );
}

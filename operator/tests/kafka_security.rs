//! The operator's Kafka client on the test broker's secured listeners, with credentials from
//! Secrets read through the real apiserver: SCRAM-SHA-512 over TLS, mutual TLS and
//! OAUTHBEARER (tokens from the test environment's OAuth token endpoint) create the internal
//! topics; a wrong password, a wrong OAuth client secret and a missing Secret are `Degraded`
//! reasons that say what to fix, and fixing the Secret recovers without a restart. What the pods get is checked
//! on the rendered objects: Secret references in the config, never a secret, and the keys
//! projected where the data plane reads them, and a rotated Secret rolls the pods.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

mod common;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use topk_api::TopKMetric;
use topk_operator::builders::{CREDENTIALS_ANNOTATION, Settings};
use topk_operator::reconcile::{self, Context};
use topk_testenv::{KAFKA_USER_SECRET, await_some, metric_manifest_from, unique_name};

const WAIT: Duration = Duration::from_secs(90);
const SPEC: &str =
    "shards: 2\nk: 5\nwindows:\n  - {name: 1m, length: 1m, bucket: 10s}\nrecount: {enabled: false}";

async fn create_secret(client: &Client, ns: &str, name: &str, data: &[(&str, String)]) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.clone().into_bytes())))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create Secret");
}

async fn create_metric(client: &Client, ns: &str, name: &str, kafka_source: &str) {
    create_metric_with(client, ns, name, kafka_source, SPEC).await;
}

async fn create_metric_with(client: &Client, ns: &str, name: &str, kafka_source: &str, spec: &str) {
    let manifest = metric_manifest_from(name, "plays", kafka_source, spec);
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    Api::<TopKMetric>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
}

/// The message of the metric's `Degraded=True` condition, once its reason is `reason`.
async fn await_degraded(metrics: &Api<TopKMetric>, name: &str, reason: &str) -> String {
    await_some(&format!("{name} Degraded with {reason}"), WAIT, || async {
        let c = common::condition(metrics, name, "Degraded").await?;
        (c.status == "True" && c.reason == reason).then_some(c.message)
    })
    .await
}

#[tokio::test]
async fn secured_brokers_work_and_refused_credentials_say_why() {
    let Some((env, client, ns)) = common::setup("operator on secured Kafka", "sec").await else {
        return;
    };
    let secure = env.secure_kafka.clone();
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let input = unique_name("secure-plays");
    common::create_topic(&env, &input, 2).await;
    let mut by_secret: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::new();
    for (secret, key, value) in secure.secret_data() {
        by_secret.entry(secret).or_default().push((key, value));
    }
    for (secret, data) in &by_secret {
        create_secret(&client, &ns, secret, data).await;
    }
    create_secret(&client, &ns, "wrong-user", &[("password", "wrong".into())]).await;
    create_secret(
        &client,
        &ns,
        "wrong-client",
        &[("oauth-client-secret", "wrong".into())],
    )
    .await;

    let scram = secure.scram_source(&secure.sasl_bootstrap, &input);
    create_metric(&client, &ns, "scram", &scram).await;
    create_metric(&client, &ns, "mtls", &secure.mutual_tls_source(&input)).await;
    let oauth = format!(
        "{}, topic: {input}",
        secure.oauth_cluster(&secure.sasl_bootstrap, &secure.oauth_token_url)
    );
    create_metric(&client, &ns, "oauth", &oauth).await;
    let oauth_refused = oauth.replace(
        &format!("secretName: {KAFKA_USER_SECRET}, key: oauth-client-secret"),
        "secretName: wrong-client, key: oauth-client-secret",
    );
    assert_ne!(oauth_refused, oauth);
    create_metric(&client, &ns, "oauth-refused", &oauth_refused).await;
    let refused = scram.replace(
        &format!("secretName: {KAFKA_USER_SECRET}, password"),
        "secretName: wrong-user, password",
    );
    assert_ne!(refused, scram);
    create_metric(&client, &ns, "refused", &refused).await;
    let absent = scram.replace(
        &format!("secretName: {KAFKA_USER_SECRET}, password"),
        "secretName: absent, password",
    );
    create_metric(&client, &ns, "unreadable", &absent).await;
    // A regional metric whose global metric's cluster names a Secret that is not there.
    let region_absent = format!(
        "{SPEC}\nregion: {{name: eu, global: {{name: global, kafka: {{bootstrapServers: \"global:9093\", authentication: {{type: scram-sha-512, username: topk, passwordSecret: {{secretName: absent-global, password: password}}}}}}}}}}"
    );
    create_metric_with(&client, &ns, "region-unreadable", &scram, &region_absent).await;
    let settings = Settings {
        drain: Duration::from_secs(600),
        ..Settings::default()
    };
    let controller = tokio::spawn(reconcile::run(Context::new(client.clone(), settings)));

    // SCRAM-SHA-512 over TLS, mutual TLS and OAUTHBEARER reach the broker: the topics are
    // created.
    common::await_internal_topics(&env, &ns, "scram", 2).await;
    common::await_internal_topics(&env, &ns, "mtls", 2).await;
    common::await_internal_topics(&env, &ns, "oauth", 2).await;

    // The token endpoint refuses a wrong client secret: no token, no connection, and the
    // reason says so.
    let message = await_degraded(&metrics, "oauth-refused", "KafkaAuthenticationFailed").await;
    assert!(message.contains("OAUTHBEARER token"), "{message}");

    // A wrong password and a missing Secret are told apart, each with what to fix.
    let message = await_degraded(&metrics, "refused", "KafkaAuthenticationFailed").await;
    assert!(message.contains("Authentication"), "{message}");
    let message = await_degraded(&metrics, "unreadable", "KafkaCredentialsUnavailable").await;
    assert!(
        message.contains("\"absent\"") && message.contains("no such Secret"),
        "{message}"
    );

    let message =
        await_degraded(&metrics, "region-unreadable", "KafkaCredentialsUnavailable").await;
    assert!(
        message.contains("spec.region.global.kafka") && message.contains("\"absent-global\""),
        "{message}"
    );

    // The right password in the Secret: the next reconcile connects with it.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .patch(
            "wrong-user",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"stringData": {"password": secure.password()}})),
        )
        .await
        .expect("patch Secret");
    common::await_internal_topics(&env, &ns, "refused", 2).await;

    // The pods get references and files, never a secret.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let config = await_some("scram's config", WAIT, || async {
        configmaps.get_opt("scram-config").await.ok()??.data
    })
    .await;
    let rendered = &config[topk_api::CONFIG_KEY];
    assert!(rendered.contains("scram-sha-512"), "{rendered}");
    assert!(!rendered.contains(&secure.password()), "{rendered}");
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let worker = await_some("scram's workers", WAIT, || async {
        statefulsets.get_opt("scram-worker").await.ok()?
    })
    .await;
    let pod = worker.spec.expect("spec").template.spec.expect("pod");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "kafka-secrets")
        .expect("the Secrets' volume");
    let mut files: Vec<String> = volume
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .into_iter()
        .flatten()
        .flat_map(|s| s.secret.and_then(|s| s.items).unwrap_or_default())
        .map(|item| item.path)
        .collect();
    files.sort();
    assert_eq!(files, ["kafka-ca/ca.crt", "topk-user/password"]);
    let mounted =
        pod.containers[0].volume_mounts.iter().flatten().any(|m| {
            m.name == "kafka-secrets" && m.mount_path == topk_api::kafka::KAFKA_SECRETS_DIR
        });
    assert!(
        mounted,
        "the Secrets are mounted where the data plane reads them"
    );

    // Pods read the credentials at start: a rotated Secret rolls them, on the next reconcile
    // (at most five minutes; here a change to the metric asks for it at once).
    let stamped = template_stamp(&worker_template(&statefulsets, "scram").await);
    let stamped = stamped.expect("a metric with Secrets has its credentials stamped");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .patch(
            KAFKA_USER_SECRET,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": {"rotated": "once"}}})),
        )
        .await
        .expect("rotate Secret");
    metrics
        .patch(
            "scram",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .expect("touch the metric");
    let rotated = await_some("the rotated Secret's stamp", WAIT, || async {
        let stamp = template_stamp(&worker_template(&statefulsets, "scram").await)?;
        (stamp != stamped).then_some(stamp)
    })
    .await;
    assert!(!rotated.is_empty());
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    await_some("the rotation's Event", WAIT, || async {
        let listed = events.list(&Default::default()).await.ok()?.items;
        listed
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("KafkaCredentialsRotated")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("scram")
            })
            .then_some(())
    })
    .await;
    controller.abort();
}

async fn worker_template(statefulsets: &Api<StatefulSet>, metric: &str) -> PodTemplateSpec {
    await_some("the workers' pod template", WAIT, || async {
        let sts = statefulsets
            .get_opt(&format!("{metric}-worker"))
            .await
            .ok()??;
        Some(sts.spec?.template)
    })
    .await
}

fn template_stamp(template: &PodTemplateSpec) -> Option<String> {
    let annotations = template.metadata.as_ref()?.annotations.as_ref()?;
    annotations.get(CREDENTIALS_ANNOTATION).cloned()
}

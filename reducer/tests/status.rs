//! The ranking summary in the TopKMetric status, on the test environment's apiserver: written
//! by server-side apply under the reducer's field manager, it shows the leaders, and it
//! coexists with the operator's merge-patched status fields in both directions.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use topk_api::{RankingRecord, TopKMetric};
use topk_engine::RankedItem;
use topk_engine::event::format_rfc3339_ms;
use topk_reducer::status::{STATUS_ITEMS, STATUS_MANAGER, status_fields, write};
use topk_testenv::{TestEnv, install_crd, unique_name};

const NOW: i64 = 1_790_000_000_000;

fn list(window: &str, scope: &str, keys: usize) -> RankingRecord {
    RankingRecord {
        retries_may_count: false,
        metric: "plays".into(),
        scope: scope.into(),
        window: window.into(),
        window_start: None,
        window_end: Some(format_rfc3339_ms(NOW - 4_000)),
        items: (0..keys)
            .map(|i| RankedItem {
                rank: i as u32 + 1,
                key: format!("{scope}song-{i}"),
                count: 100 - i as u64,
                baseline: None,
                score: None,
            })
            .collect(),
        mode: "exact".into(),
        max_overcount: 0,
        watermark: format_rfc3339_ms(NOW - 4_000),
        as_of: format_rfc3339_ms(NOW - 1_000),
        version: 3,
        exact_until: None,
        stale: false,
        input_range: Vec::new(),
        regions: None,
    }
}

#[test]
fn status_fields_are_bounded_and_global_only() {
    let (a, b, eu) = (list("1h", "", 20), list("24h", "", 2), list("1h", "eu", 9));
    let fields = status_fields(&[&a, &eu, &b], None, NOW).expect("fields");
    let rankings = fields["rankings"].as_array().expect("rankings");
    assert_eq!(rankings.len(), 2);
    assert_eq!(rankings[0]["window"], "1h");
    assert_eq!(
        rankings[0]["items"].as_array().map(Vec::len),
        Some(STATUS_ITEMS)
    );
    assert_eq!(rankings[1]["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(fields["leader"], "song-0");
    assert_eq!(fields["watermarkLag"], "4s");
    assert!(
        rankings[0].get("missingRegions").is_none(),
        "not a global metric"
    );
    assert!(status_fields(&[&eu], None, NOW).is_none());
}

#[tokio::test]
async fn the_reducer_and_the_operator_share_the_status() {
    let Some(env) = TestEnv::get("reducer status on the apiserver") else {
        return;
    };
    let client = env.kube_client().await.expect("client");
    install_crd(&client, &topk_api::crd::crd())
        .await
        .expect("crd");
    let ns = env
        .namespace(&client, "reducer-status")
        .await
        .expect("namespace");
    let name = unique_name("plays");
    let api: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let metric: TopKMetric = serde_json::from_value(serde_json::json!({
        "apiVersion": "topk.io/v1alpha1", "kind": "TopKMetric",
        "metadata": {"name": name},
        "spec": {
            "metric": "plays",
            "source": {"kafka": {"bootstrapServers": "kafka:9092", "topic": "plays"}},
            "shards": 2, "k": 10,
            "windows": [{"name": "1h", "length": "1h", "bucket": "1m"}],
        },
    }))
    .expect("metric");
    api.create(&PostParams::default(), &metric)
        .await
        .expect("create");

    let first = list("1h", "", 8);
    write(
        &client,
        &ns,
        &name,
        status_fields(&[&first], None, NOW).expect("fields"),
    )
    .await
    .expect("reducer status");
    // The operator writes its own fields the way it does: a merge patch.
    let operator = serde_json::json!({"status": {"observedGeneration": 1, "assignmentVersion": 4}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&operator))
        .await
        .expect("operator status");
    let mut second = list("1h", "", 8);
    second.items.reverse();
    // A global metric's list without one of its regions says so in the status.
    second.regions = Some(topk_api::record::RegionCoverage {
        complete_regions: vec!["eu".into()],
        missing_regions: vec!["us".into()],
    });
    write(
        &client,
        &ns,
        &name,
        status_fields(&[&second], None, NOW).expect("fields"),
    )
    .await
    .expect("reducer status again");

    let got = api.get(&name).await.expect("get");
    let status = got.status.expect("status");
    assert_eq!(status.assignment_version, Some(4), "operator field kept");
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        status.leader.as_deref(),
        Some("song-7"),
        "reducer field updated"
    );
    assert_eq!(status.watermark_lag.as_deref(), Some("4s"));
    assert_eq!(status.rankings.len(), 1);
    assert_eq!(status.rankings[0].items.len(), STATUS_ITEMS);
    assert_eq!(status.rankings[0].items[0].key, "song-7");
    assert_eq!(status.rankings[0].missing_regions, ["us"]);
    let managers: Vec<String> = got
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.iter().any(|m| m == STATUS_MANAGER), "{managers:?}");
}

//! The real kube-apiserver (with etcd) and kube-controller-manager of the test environment.

// Test support: a failed unwrap fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Client};
use serde_json::json;
use topk_testenv::{TestEnv, await_some, mark_pods_ready, unique_name};

const TIMEOUT: Duration = Duration::from_secs(60);
const MANAGER: &str = "topk-testenv";

async fn client(env: &TestEnv) -> Client {
    env.kube_client().await.expect("kube client")
}

/// A CRD with a structural schema, a status subresource and a CEL rule, unique per test run.
fn crd(group: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size", "max"],
                            "properties": {"size": {"type": "integer"}, "max": {"type": "integer"}},
                            "x-kubernetes-validations": [{
                                "rule": "self.size <= self.max",
                                "message": "size must not exceed max; lower size or raise max"
                            }]
                        },
                        "status": {"type": "object", "properties": {"observed": {"type": "integer"}}}
                    }
                }}
            }]
        }
    }))
    .expect("crd json")
}

#[tokio::test]
async fn crd_with_cel_server_side_apply_status_and_watch() {
    let Some(env) = TestEnv::get("apiserver CRD") else {
        return;
    };
    let client = client(&env).await;
    let version = client.apiserver_version().await.expect("version");
    assert_eq!(
        version.git_version, env.kube_version,
        "the stamped version is what clients see"
    );

    let group = format!("{}.topk.test", unique_name("g"));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let definition = crd(&group);
    let name = definition.metadata.name.clone().expect("name");
    crds.patch(
        &name,
        &PatchParams::apply(MANAGER),
        &Patch::Apply(&definition),
    )
    .await
    .expect("apply crd");
    await_some("the CRD to be established", TIMEOUT, || async {
        let crd = crds.get(&name).await.ok()?;
        let established = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await;

    let ns = env.namespace(&client, "crd").await.expect("namespace");
    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let object = |size: i64| json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": size, "max": 3}});

    // The CEL rule rejects a bad object with its message. Discovery of a new CRD takes a
    // moment, so retry until the apiserver answers with a validation error.
    let rejection = await_some("the CEL rejection", TIMEOUT, || async {
        match widgets
            .patch("w", &PatchParams::apply(MANAGER), &Patch::Apply(&object(5)))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 422 => Some(status.message),
            _ => None,
        }
    })
    .await;
    assert!(
        rejection.contains("size must not exceed max"),
        "{rejection}"
    );

    let applied = widgets
        .patch("w", &PatchParams::apply(MANAGER), &Patch::Apply(&object(2)))
        .await
        .expect("apply");
    let rv = applied
        .metadata
        .resource_version
        .clone()
        .expect("resource version");
    let mut events = widgets
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();

    let status = json!({"status": {"observed": 2}});
    widgets
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch status");
    let seen = tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = events.try_next().await.expect("watch event") {
            if let WatchEvent::Modified(obj) = event {
                return obj.data["status"]["observed"].as_i64();
            }
        }
        None
    })
    .await
    .expect("a watch event in time");
    assert_eq!(seen, Some(2));
    let spec = widgets.get("w").await.expect("get").data["spec"]["size"].as_i64();
    assert_eq!(spec, Some(2), "the status patch leaves the spec alone");

    crds.delete(&name, &DeleteParams::default())
        .await
        .expect("delete crd");
}

#[tokio::test]
async fn the_controller_manager_runs_statefulsets_and_garbage_collects_dependents() {
    let Some(env) = TestEnv::get("controller manager") else {
        return;
    };
    let client = client(&env).await;
    let ns = env.namespace(&client, "ctrl").await.expect("namespace");

    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "counter"},
        "spec": {
            "replicas": 2, "serviceName": "counter",
            "selector": {"matchLabels": {"app": "counter"}},
            "template": {
                "metadata": {"labels": {"app": "counter"}},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/counter:1"}]}
            }
        }
    }))
    .expect("statefulset json");
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    statefulsets
        .create(&PostParams::default(), &sts)
        .await
        .expect("create statefulset");

    // OrderedReady: pod 1 is created only after pod 0 is ready; there is no kubelet, so the
    // test plays its part.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    await_some("both pods", TIMEOUT, || async {
        mark_pods_ready(&client, &ns, "app=counter").await.ok()?;
        let names: Vec<String> = pods
            .list(&ListParams::default().labels("app=counter"))
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    topk_testenv::ready_statefulset(&client, &ns, "counter", "app=counter", 2, TIMEOUT).await;

    // Owner references: deleting the owner removes its dependent.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).expect("cm"),
        )
        .await
        .expect("owner");
    let uid = owner.metadata.uid.clone().expect("uid");
    let dependent: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "dependent",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]
    }}))
    .expect("dependent");
    configmaps
        .create(&PostParams::default(), &dependent)
        .await
        .expect("dependent");
    configmaps
        .delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    await_some("the dependent to be garbage collected", TIMEOUT, || async {
        configmaps
            .get_opt("dependent")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

//! Labels, selectors, owner and metadata every object carries.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use topk_api::TopKMetric;

use crate::error::Error;

pub fn labels(metric: &TopKMetric, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(metric, component);
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        "topk-operator".to_owned(),
    );
    labels
}

/// Label selector of a component's pods, as `kubectl` and the scale subresource take it.
pub fn selector(metric: &TopKMetric, component: &str) -> String {
    format!(
        "app.kubernetes.io/name=topk,app.kubernetes.io/instance={},app.kubernetes.io/component={component}",
        metric.name_any()
    )
}

pub(super) fn selector_labels(metric: &TopKMetric, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "topk".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), metric.name_any()),
        (
            "app.kubernetes.io/component".to_owned(),
            component.to_owned(),
        ),
    ])
}

pub(super) fn label_selector(metric: &TopKMetric, component: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector_labels(metric, component)),
        match_expressions: None,
    }
}

pub(super) fn owner(metric: &TopKMetric) -> Result<OwnerReference, Error> {
    metric
        .controller_owner_ref(&())
        .ok_or(Error::MissingObjectKey("metadata.uid"))
}

pub(super) fn meta(metric: &TopKMetric, name: &str, component: &str) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name.to_owned()),
        namespace: metric.namespace(),
        labels: Some(labels(metric, component)),
        owner_references: Some(vec![owner(metric)?]),
        ..Default::default()
    })
}

pub(super) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

//! ConfigMaps, headless Services and disruption budgets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use topk_api::TopKMetric;

use crate::error::Error;

use super::*;

pub(super) fn config_map(meta: ObjectMeta, data: Option<(&str, String)>) -> ConfigMap {
    ConfigMap {
        metadata: meta,
        data: data.map(|(key, value)| BTreeMap::from([(key.to_owned(), value)])),
        ..Default::default()
    }
}

pub(super) fn headless_service(
    metric: &TopKMetric,
    name: &str,
    component: &str,
) -> Result<Service, Error> {
    Ok(Service {
        metadata: meta(metric, name, component)?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(metric, component)),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port: API_PORT,
                target_port: Some(IntOrString::String("http".to_owned())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

pub(super) fn pdb(
    metric: &TopKMetric,
    name: &str,
    component: &str,
) -> Result<PodDisruptionBudget, Error> {
    Ok(PodDisruptionBudget {
        metadata: meta(metric, name, component)?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(label_selector(metric, component)),
            ..Default::default()
        }),
        status: None,
    })
}

//! The data plane's Role rules.

use k8s_openapi::api::rbac::v1::PolicyRule;
use topk_api::DataPlaneConfig;

use super::*;

/// A Role rule; no `names` means every object of the resource (`create` cannot be limited
/// by name).
pub(super) fn rule(
    api_group: &str,
    resource: &str,
    names: Vec<String>,
    verbs: &[&str],
) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![api_group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: (!names.is_empty()).then_some(names),
        verbs: strings(verbs),
        non_resource_urls: None,
    }
}

/// The ConfigMaps the data plane reads: its config, the assignment and the deny list's.
pub(super) fn readable_config_maps(config: &DataPlaneConfig, workers: bool) -> Vec<String> {
    let names = config.names();
    let mut readable = vec![names.config];
    if workers {
        readable.push(names.assignment);
    }
    readable.extend(config.deny.config_map.as_ref().map(|r| r.name.clone()));
    readable.sort();
    readable.dedup();
    readable
}

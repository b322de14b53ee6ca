//! The `TopKMetric` CustomResourceDefinition, generated from the Rust types. The committed
//! copies are `crds/topkmetrics.topk.io.yaml` and the Helm chart's template; a test fails when
//! either is stale (regenerate with `TOPK_UPDATE_CRDS=1 cargo test -p topk-api`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::error::ApiError;
use crate::manifest::TopKMetric;

/// Path of the committed CRD, relative to the repository root.
pub const CRD_PATH: &str = "crds/topkmetrics.topk.io.yaml";
/// Path of the Helm chart's copy, relative to the repository root.
pub const CHART_CRD_PATH: &str = "charts/topk-operator/templates/crd.yaml";

pub fn crd() -> CustomResourceDefinition {
    TopKMetric::crd()
}

/// The CRD as the YAML document committed under `crds/`.
pub fn crd_yaml() -> Result<String, ApiError> {
    let body = serde_saphyr::to_string(&crd()).map_err(|e| ApiError::Parse(e.to_string()))?;
    Ok(format!(
        "# Generated from the Rust types in api/src/manifest/ by `topk crd`; do not edit.\n{body}"
    ))
}

/// The CRD as the Helm chart's template: installed and upgraded only with
/// `crds.install`, and kept on uninstall (deleting a CRD deletes every TopKMetric).
pub fn crd_helm_template() -> Result<String, ApiError> {
    let mut crd = crd();
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("helm.sh/resource-policy".into(), "keep".into());
    let body = serde_saphyr::to_string(&crd).map_err(|e| ApiError::Parse(e.to_string()))?;
    Ok(format!(
        "# Generated from the Rust types in api/src/manifest/ by `topk crd --helm`; do not edit.\n\
         {{{{- if .Values.crds.install }}}}\n{body}{{{{- end }}}}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(CRD_PATH);
        let want = crd_yaml().unwrap();
        if std::env::var("TOPK_UPDATE_CRDS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &want).unwrap();
        }
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == want,
            "{CRD_PATH} is stale: regenerate it with `TOPK_UPDATE_CRDS=1 cargo test -p topk-api` or `topk crd > {CRD_PATH}`"
        );
    }

    #[test]
    fn chart_crd_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(CHART_CRD_PATH);
        let want = crd_helm_template().unwrap();
        if std::env::var("TOPK_UPDATE_CRDS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &want).unwrap();
        }
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == want,
            "{CHART_CRD_PATH} is stale: regenerate it with `TOPK_UPDATE_CRDS=1 cargo test -p topk-api` or `topk crd --helm > {CHART_CRD_PATH}`"
        );
    }

    #[test]
    fn crd_has_the_promised_shape() {
        let crd = crd();
        let names = &crd.spec.names;
        assert_eq!(names.short_names.as_deref(), Some(&["tkm".to_owned()][..]));
        assert_eq!(names.categories.as_deref(), Some(&["topk".to_owned()][..]));
        let version = &crd.spec.versions[0];
        let sub = version.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        assert_eq!(
            sub.scale.as_ref().unwrap().spec_replicas_path,
            ".spec.workers.replicas"
        );
        let columns: Vec<_> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Ready",
                "Workers",
                "Shards",
                "Mode",
                "Leader",
                "Watermark lag",
                "Exact until",
                "Age"
            ]
        );
        let yaml = crd_yaml().unwrap();
        for rule in [
            "self == oldSelf",
            "duration(self.length)",
            "self.mode == 'approximate'",
        ] {
            assert!(yaml.contains(rule), "missing CEL rule {rule}");
        }
    }
}

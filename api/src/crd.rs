//! The `TopKMetric` CustomResourceDefinition, generated from the Rust types. The committed
//! copies are `crds/topkmetrics.topk.io.yaml` and the Helm chart's template; a test fails when
//! either is stale (regenerate with `TOPK_UPDATE_CRDS=1 cargo test -p topk-api`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::CustomResourceExt;

use crate::error::ApiError;
use crate::manifest::TopKMetric;

/// Path of the committed CRD, relative to the repository root.
pub const CRD_PATH: &str = "crds/topkmetrics.topk.io.yaml";
/// Path of the Helm chart's copy, relative to the repository root.
pub const CHART_CRD_PATH: &str = "charts/topk-operator/templates/crd.yaml";
/// Path of the spec's field reference, relative to the repository root.
pub const FIELD_REFERENCE_PATH: &str = "docs/manifest.md";

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

/// `docs/manifest.md`: every field of the spec as the CRD's schema states it (type, limits,
/// description, CEL rules), so that the reference cannot drift from what the apiserver takes.
pub fn field_reference() -> String {
    let mut out = String::from(
        "# The TopKMetric spec, field by field\n\n\
         Generated from the CRD's schema (`api/src/manifest/spec.rs`) by\n\
         `TOPK_UPDATE_CRDS=1 cargo test -p topk-api`; do not edit. What the fields do, with\n\
         examples: [usage.md](usage.md#the-manifest). Limits are inclusive; a rule is a CEL\n\
         expression the apiserver checks, with the message it refuses with.\n\n\
         | field | type | limits | description |\n|---|---|---|---|\n",
    );
    let spec = crd()
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref()?.open_api_v3_schema.as_ref())
        .and_then(|root| root.properties.as_ref()?.get("spec").cloned());
    let mut rules = Vec::new();
    if let Some(spec) = spec {
        describe_fields("spec", &spec, &mut out, &mut rules);
    }
    if !rules.is_empty() {
        out.push_str("\n## Rules across fields\n\n| on | rule | message |\n|---|---|---|\n");
        for (path, rule, message) in rules {
            out.push_str(&format!(
                "| `{path}` | `{}` | {} |\n",
                cell(&rule).replace('`', "'"),
                cell(&message)
            ));
        }
    }
    out
}

/// A table row per field below `path`, depth first in the schema's (alphabetical) order; the
/// CEL rules found on the way go to `rules`.
fn describe_fields(
    path: &str,
    schema: &JSONSchemaProps,
    out: &mut String,
    rules: &mut Vec<(String, String, String)>,
) {
    for rule in schema.x_kubernetes_validations.iter().flatten() {
        rules.push((
            path.to_owned(),
            rule.rule.clone(),
            rule.message.clone().unwrap_or_default(),
        ));
    }
    let required = schema.required.clone().unwrap_or_default();
    for (name, field) in schema.properties.iter().flatten() {
        let field_path = format!("{path}.{name}");
        let mut kind = type_of(field);
        if required.contains(name) {
            kind.push_str(", required");
        }
        out.push_str(&format!(
            "| `{field_path}` | {kind} | {} | {} |\n",
            limits(field),
            cell(field.description.as_deref().unwrap_or(""))
        ));
        match &field.items {
            Some(JSONSchemaPropsOrArray::Schema(items)) => {
                describe_fields(&format!("{field_path}[]"), items, out, rules)
            }
            _ => describe_fields(&field_path, field, out, rules),
        }
    }
}

fn type_of(schema: &JSONSchemaProps) -> String {
    if schema.x_kubernetes_int_or_string == Some(true) {
        return "int or string".to_owned();
    }
    let base = schema.type_.clone().unwrap_or_else(|| "any".to_owned());
    match (&schema.items, &schema.additional_properties) {
        (Some(JSONSchemaPropsOrArray::Schema(items)), _) => format!("{} list", type_of(items)),
        (_, Some(_)) => "map".to_owned(),
        _ => match &schema.format {
            Some(format) => format!("{base} ({format})"),
            None => base,
        },
    }
}

fn limits(schema: &JSONSchemaProps) -> String {
    let mut out = Vec::new();
    let range = |low: Option<String>, high: Option<String>| match (low, high) {
        (Some(low), Some(high)) => Some(format!("{low} to {high}")),
        (Some(low), None) => Some(format!("at least {low}")),
        (None, Some(high)) => Some(format!("at most {high}")),
        (None, None) => None,
    };
    out.extend(range(
        schema.minimum.map(|v| v.to_string()),
        schema.maximum.map(|v| v.to_string()),
    ));
    out.extend(
        range(
            schema.min_length.map(|v| v.to_string()),
            schema.max_length.map(|v| v.to_string()),
        )
        .map(|r| format!("{r} characters")),
    );
    out.extend(
        range(
            schema.min_items.map(|v| v.to_string()),
            schema.max_items.map(|v| v.to_string()),
        )
        .map(|r| format!("{r} items")),
    );
    if let Some(values) = &schema.enum_ {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", v.0)).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    if let Some(pattern) = &schema.pattern {
        out.push(format!("matches `{pattern}`"));
    }
    cell(&out.join("; "))
}

/// Text fit for one cell of a Markdown table.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails unless the committed file at `path` (from the repository root) is `want`;
    /// under `TOPK_UPDATE_CRDS=1` it writes it first. `also` names another way to make it.
    fn assert_current(path: &str, want: &str, also: &str) {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        if std::env::var("TOPK_UPDATE_CRDS").is_ok_and(|v| v == "1") {
            std::fs::write(&file, want).unwrap();
        }
        let got = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            got == want,
            "{path} is stale: regenerate it with `TOPK_UPDATE_CRDS=1 cargo test -p topk-api`{also}"
        );
    }

    #[test]
    fn committed_crd_is_current() {
        let also = format!(" or `topk crd > {CRD_PATH}`");
        assert_current(CRD_PATH, &crd_yaml().unwrap(), &also);
    }

    #[test]
    fn chart_crd_is_current() {
        let also = format!(" or `topk crd --helm > {CHART_CRD_PATH}`");
        assert_current(CHART_CRD_PATH, &crd_helm_template().unwrap(), &also);
    }

    #[test]
    fn committed_field_reference_is_current() {
        let want = field_reference();
        assert_current(FIELD_REFERENCE_PATH, &want, "");
        // Every spec field has a row, nested ones by their path.
        for field in [
            "`spec.k`",
            "`spec.windows[].length`",
            "`spec.sketch.epsilon`",
        ] {
            assert!(want.contains(field), "no row for {field}");
        }
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

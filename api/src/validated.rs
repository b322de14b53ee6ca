//! A `TopKMetric` whose spec passed validation, with everything the operator builds from it
//! resolved once per reconcile: the pods' config and, per kind of pod, its count, resources
//! and volume. The operator's builders read this, never the raw spec.

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::dataplane::DataPlaneConfig;
use crate::error::ApiError;
use crate::manifest::{StorageSpec, TopKMetric, VolumeRetention};

/// One kind of pod as the spec asks for it (`None`: the operator's default).
#[derive(Debug, Clone, PartialEq)]
pub struct Pods {
    pub replicas: u32,
    pub resources: Option<ResourceRequirements>,
    pub storage: Option<StorageSpec>,
}

#[derive(Debug, Clone)]
pub struct ValidatedMetric<'a> {
    pub metric: &'a TopKMetric,
    /// What the pods run by (rendered into the metric's ConfigMap).
    pub config: DataPlaneConfig,
    /// The workers; `None` for a global metric, which counts nothing itself.
    pub workers: Option<Pods>,
    pub reducers: Pods,
    /// The combiners (their count is `config.combine`'s), when the input is not keyed for
    /// topk.
    pub combiners: Option<Pods>,
    /// The ingest gateway, when the spec asks for one.
    pub ingest: Option<Pods>,
    pub volume_retention: VolumeRetention,
}

impl<'a> ValidatedMetric<'a> {
    /// Validates `metric`'s spec (as [`DataPlaneConfig::from_metric`] does) and resolves it.
    pub fn of(metric: &'a TopKMetric) -> Result<Self, ApiError> {
        let config = DataPlaneConfig::from_metric(metric)?;
        let spec = &metric.spec;
        let workers = (!spec.is_global()).then(|| {
            let workers = spec.workers.as_ref();
            Pods {
                replicas: workers.map_or(1, |w| w.replicas),
                resources: workers.and_then(|w| w.resources.clone()),
                storage: workers.and_then(|w| w.storage.clone()),
            }
        });
        let reducers = spec.reducers.as_ref();
        let combiners = config.combine.as_ref().map(|combine| Pods {
            replicas: combine.replicas,
            resources: spec.combiners.as_ref().and_then(|c| c.resources.clone()),
            storage: None,
        });
        Ok(Self {
            metric,
            workers,
            reducers: Pods {
                replicas: reducers.map_or(1, |r| r.replicas),
                resources: reducers.and_then(|r| r.resources.clone()),
                storage: reducers.and_then(|r| r.storage.clone()),
            },
            combiners,
            ingest: spec.ingest.as_ref().map(|ingest| Pods {
                replicas: ingest.replicas,
                resources: ingest.resources.clone(),
                storage: None,
            }),
            volume_retention: spec.volume_retention.unwrap_or_default(),
            config,
        })
    }
}

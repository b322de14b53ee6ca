//! What `topk worker` and `topk reducer` share: the config they load, the names they derive,
//! where they listen and how they reach the control plane.

use std::path::PathBuf;

use clap::Args;
use topk_api::TopKMetricSpec;
use topk_worker::ControlPlane;

use crate::error::CliError;

/// Which metric, under which config, on which broker: what every data-plane command reads.
#[derive(Args)]
pub struct ConfigArgs {
    /// The rendered config (`metric.json` from the operator) or a TopKMetric manifest.
    #[arg(long)]
    pub config: PathBuf,
    /// The TopKMetric's name (default: the one in the config).
    #[arg(long)]
    pub metric_name: Option<String>,
    /// Namespace of the TopKMetric (names the internal topics and ConfigMaps).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Overrides the config's Kafka bootstrap servers.
    #[arg(long)]
    pub bootstrap: Option<String>,
}

impl ConfigArgs {
    pub fn load(&self) -> Result<Loaded, CliError> {
        let (config_name, spec, version) = topk_worker::load_config(&self.config)?;
        Ok(Loaded {
            name: self.metric_name.clone().unwrap_or(config_name),
            spec,
            version,
        })
    }
}

#[derive(Args)]
pub struct DataPlaneArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// This pod's ordinal (default: the suffix of POD_NAME, as in a StatefulSet).
    #[arg(long)]
    pub ordinal: Option<u32>,
    /// Read the assignment table from this file instead of the API (outside a cluster).
    #[arg(long)]
    pub assignment_file: Option<PathBuf>,
    /// RocksDB state lives here.
    #[arg(long, default_value = "/var/lib/topk")]
    pub state_dir: PathBuf,
    /// Address of the HTTP endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
}

/// The loaded config: object name, spec and config version.
pub struct Loaded {
    pub name: String,
    pub spec: TopKMetricSpec,
    pub version: String,
}

impl DataPlaneArgs {
    pub fn ordinal(&self) -> Result<u32, CliError> {
        match self.ordinal {
            Some(o) => Ok(o),
            None => std::env::var("POD_NAME")
                .ok()
                .and_then(|pod| pod.rsplit('-').next()?.parse().ok())
                .ok_or_else(|| {
                    CliError::Usage("set --ordinal or POD_NAME (NAME-COMPONENT-N)".to_owned())
                }),
        }
    }

    pub async fn client(&self) -> Result<kube::Client, CliError> {
        kube::Client::try_default().await.map_err(|e| {
            CliError::Usage(format!(
                "cannot reach the Kubernetes API ({e}); outside a cluster pass --assignment-file"
            ))
        })
    }

    /// The assignment file if given, else the API; `report` is the worker's report file.
    pub async fn control(&self, report: Option<PathBuf>) -> Result<ControlPlane, CliError> {
        Ok(match &self.assignment_file {
            Some(assignment) => ControlPlane::Files {
                assignment: assignment.clone(),
                report,
            },
            None => ControlPlane::Kubernetes {
                client: self.client().await?,
                namespace: self.config.namespace.clone(),
            },
        })
    }

    pub async fn bind(&self) -> Result<tokio::net::TcpListener, CliError> {
        let (listener, addr) = crate::server::bind(&self.listen).await?;
        tracing::info!("listening on http://{addr}");
        Ok(listener)
    }
}

/// A duration flag as the std type (at least 1 ms).
pub fn millis(d: topk_api::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis().max(1) as u64)
}

//! What `topk worker`, `topk reducer` and `topk recount` share: the config they run by (the
//! one the operator renders), their identity, where they listen and how they reach the control
//! plane.

use std::path::PathBuf;

use clap::Args;
use topk_api::DataPlaneConfig;
use topk_api::KafkaClients;
use topk_api::kafka::KAFKA_SECRETS_DIR;
use topk_runtime::ControlPlane;

use crate::error::CliError;

/// The config every data-plane command runs by.
#[derive(Args)]
pub struct ConfigArgs {
    /// The rendered config (`metric.json`, as the operator mounts it) or a TopKMetric
    /// manifest, which is turned into that config the same way.
    #[arg(long)]
    pub config: PathBuf,
    /// Where the Secret keys the config's Kafka settings reference are, as `SECRET/KEY` files
    /// (the operator mounts them here).
    #[arg(long, env = "TOPK_KAFKA_SECRETS", default_value = KAFKA_SECRETS_DIR)]
    pub kafka_secrets: PathBuf,
}

impl ConfigArgs {
    /// The config, and the properties of its Kafka clients with their credentials.
    pub fn load(&self) -> Result<(DataPlaneConfig, KafkaClients), CliError> {
        let config = topk_runtime::load_config(&self.config)?;
        let kafka = topk_runtime::kafka_properties(&config, &self.kafka_secrets)?;
        Ok((config, kafka))
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

/// `given`, else the suffix of POD_NAME (a StatefulSet pod's ordinal).
pub fn ordinal(given: Option<u32>) -> Result<u32, CliError> {
    match given {
        Some(o) => Ok(o),
        None => std::env::var("POD_NAME")
            .ok()
            .and_then(|pod| pod.rsplit('-').next()?.parse().ok())
            .ok_or_else(|| {
                CliError::Usage("set --ordinal or POD_NAME (NAME-COMPONENT-N)".to_owned())
            }),
    }
}

impl DataPlaneArgs {
    pub fn ordinal(&self) -> Result<u32, CliError> {
        ordinal(self.ordinal)
    }

    pub async fn client(&self) -> Result<kube::Client, CliError> {
        kube::Client::try_default().await.map_err(|e| {
            CliError::Usage(format!(
                "cannot reach the Kubernetes API ({e}); outside a cluster pass --assignment-file"
            ))
        })
    }

    /// The assignment file if given, else the API in the config's namespace; `report` is the
    /// worker's report file.
    pub async fn control(
        &self,
        config: &DataPlaneConfig,
        report: Option<PathBuf>,
    ) -> Result<ControlPlane, CliError> {
        Ok(match &self.assignment_file {
            Some(assignment) => ControlPlane::Files {
                assignment: assignment.clone(),
                report,
            },
            None => ControlPlane::Kubernetes {
                client: self.client().await?,
                namespace: config.namespace.clone(),
            },
        })
    }

    pub async fn bind(&self) -> Result<tokio::net::TcpListener, CliError> {
        let (listener, addr) = crate::server::bind(&self.listen).await?;
        tracing::info!("listening on http://{addr}");
        Ok(listener)
    }
}

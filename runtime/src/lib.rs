//! What every topk data-plane process shares, so that none of them depends on another for
//! plumbing: the batch Kafka consumer ([`input`], the one module with `unsafe`), producers with
//! delivery accounting ([`output`]), the assignment and ConfigMap watches ([`control`]), the
//! probe and metrics endpoints ([`probes`]), local stores set aside when corrupt ([`store`]),
//! config loading and shutdown.

#[cfg(feature = "kafka")]
pub mod clients;
#[cfg(feature = "control")]
pub mod control;
pub mod error;
pub mod harness;
#[cfg(feature = "kafka")]
#[allow(unsafe_code)]
pub mod input;
#[cfg(feature = "kafka")]
pub mod output;
pub mod probes;
#[cfg(feature = "store")]
pub mod store;

use std::path::Path;

#[cfg(feature = "control")]
pub use control::ControlPlane;
pub use error::Error;
use topk_api::DataPlaneConfig;
#[cfg(feature = "kafka")]
use topk_api::KafkaClients;
#[cfg(feature = "kafka")]
use topk_api::kafka::KafkaProperties;

/// Reads the config the operator renders (JSON), or a TopKMetric manifest (YAML), which
/// becomes the same config.
pub fn load_config(path: &Path) -> Result<DataPlaneConfig, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    DataPlaneConfig::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

#[cfg(feature = "kafka")]
/// The properties of the metric's Kafka clients (input and internal topics), with the
/// credentials its settings reference read from `secrets_dir` (where the operator mounts
/// them, as `SECRET/KEY`).
pub fn kafka_properties(
    config: &DataPlaneConfig,
    secrets_dir: &Path,
) -> Result<KafkaClients, Error> {
    let clients = config
        .kafka
        .properties(|key| read_secret(secrets_dir, key))
        .map_err(|e| Error::Config(format!("Kafka credentials: {e}")))?;
    for properties in [&clients.input, &clients.internal] {
        check_client_config(properties)?;
    }
    Ok(clients)
}

#[cfg(feature = "kafka")]
/// The properties of a client of another metric's cluster (a regional reducer's of its global
/// metric's), credentials read as for [`kafka_properties`].
pub fn cluster_properties(
    cluster: &topk_api::dataplane::ClusterConfig,
    secrets_dir: &Path,
) -> Result<KafkaProperties, Error> {
    let properties = cluster
        .security
        .properties(&cluster.bootstrap_servers, |key| {
            read_secret(secrets_dir, key)
        })
        .map_err(|e| Error::Config(format!("Kafka credentials: {e}")))?;
    check_client_config(&properties)?;
    Ok(properties)
}

#[cfg(feature = "kafka")]
fn read_secret(secrets_dir: &Path, key: &topk_api::kafka::SecretKey) -> Result<String, String> {
    let path = secrets_dir.join(key.path());
    std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

#[cfg(feature = "kafka")]
/// Whether librdkafka takes every property (a value it refuses, or a feature this build lacks),
/// said at start with no credential in the message: librdkafka's refusals quote the value.
pub fn check_client_config(properties: &KafkaProperties) -> Result<(), Error> {
    client_config(properties)
        .create_native_config()
        .map(drop)
        .map_err(|e| {
            Error::Config(format!(
                "Kafka client settings: {}",
                properties.redact(&e.to_string())
            ))
        })
}

/// The wall clock in milliseconds since the epoch (0 before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(feature = "kafka")]
/// A librdkafka config with `properties` set: every client of the metric starts from it.
pub fn client_config(properties: &KafkaProperties) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    for (name, value) in properties.iter() {
        config.set(name, value);
    }
    config
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

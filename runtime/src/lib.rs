//! What every topk data-plane process shares, so that none of them depends on another for
//! plumbing: the batch Kafka consumer ([`input`], the one module with `unsafe`), producers with
//! delivery accounting ([`output`]), the assignment and ConfigMap watches ([`control`]), the
//! probe and metrics endpoints ([`probes`]), local stores set aside when corrupt ([`store`]),
//! config loading and shutdown.

pub mod control;
pub mod error;
#[allow(unsafe_code)]
pub mod input;
pub mod output;
pub mod probes;
pub mod store;

use std::path::Path;

pub use control::ControlPlane;
pub use error::Error;
use topk_api::DataPlaneConfig;

/// Reads the config the operator renders (JSON), or a TopKMetric manifest (YAML), which
/// becomes the same config.
pub fn load_config(path: &Path) -> Result<DataPlaneConfig, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    DataPlaneConfig::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
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

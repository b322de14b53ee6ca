use thiserror::Error;

#[derive(Debug, Error)]
pub enum CliError {
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Manifest(#[from] topk_api::ApiError),
    #[error("{0}")]
    Engine(#[from] topk_engine::EngineError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("input error: {0}")]
    Input(std::io::Error),
    #[error("server error: {0}")]
    Serve(std::io::Error),
    #[error("{0}")]
    Usage(String),
    #[error("worker: {0}")]
    Worker(#[from] topk_worker::Error),
    #[error("{0}")]
    Runtime(#[from] topk_runtime::Error),
    #[error("reducer: {0}")]
    Reducer(#[from] topk_reducer::Error),
    #[error("recount: {0}")]
    Recount(#[from] topk_recount::Error),
    #[error("ingest gateway: {0}")]
    Gateway(#[from] topk_gateway::Error),
    #[error("combiner: {0}")]
    Combiner(#[from] topk_combiner::Error),
}

//! Helpers for driving the real `topk` binary over loopback HTTP.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the operator renders for `manifest` in namespace `ns` (its config ConfigMap's
/// `metric.json`), written into `dir`: the data-plane tests run what the pods run.
pub fn rendered_config(dir: &Path, manifest: &str, ns: &str) -> PathBuf {
    let mut metric = topk_api::load_manifest(manifest).expect("manifest");
    metric.metadata.namespace = Some(ns.to_owned());
    metric.metadata.uid = Some("00000000-0000-0000-0000-000000000000".to_owned());
    let rollout = (!metric.spec.is_global()).then(|| {
        let table = topk_api::assignment::planner::plan(metric.spec.shards(), None, 1);
        topk_operator::builders::RescaleStep::settled(&metric, table)
    });
    let validated = topk_api::ValidatedMetric::of(&metric).expect("a valid metric");
    let desired =
        topk_operator::builders::desired(&validated, rollout.as_ref(), &Default::default())
            .expect("the operator's objects");
    let rendered = desired.config.data.expect("config data")[topk_api::CONFIG_KEY].clone();
    let path = dir.join(topk_api::CONFIG_KEY);
    std::fs::write(&path, rendered).expect("write the rendered config");
    path
}

/// The value of an unlabelled sample `name` on a Prometheus text page.
pub fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

pub fn topk() -> Command {
    Command::new(env!("CARGO_BIN_EXE_topk"))
}

/// A running `topk` process, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `topk` with `--listen 127.0.0.1:0` and waits for the address it logs.
pub fn spawn(args: &[&str]) -> Server {
    spawn_on(args, "127.0.0.1:0")
}

/// [`spawn`] listening on `listen`.
pub fn spawn_on(args: &[&str], listen: &str) -> Server {
    start(args, listen, Stdio::null())
}

/// [`spawn`] with a pipe to its stdin.
pub fn spawn_piped(args: &[&str]) -> (Server, std::process::ChildStdin) {
    let mut server = start(args, "127.0.0.1:0", Stdio::piped());
    let stdin = server.child.stdin.take().expect("stdin piped");
    (server, stdin)
}

fn start(args: &[&str], listen: &str, stdin: Stdio) -> Server {
    let mut child = topk()
        .args(args)
        .args(["--listen", listen])
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start topk");
    let stderr: ChildStderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    // `TOPK_TEST_LOGS=1` shows the process's log (otherwise read only for its address).
    let show = std::env::var("TOPK_TEST_LOGS").is_ok_and(|v| v == "1");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if show {
                eprintln!("{line}");
            }
            if let Some(at) = line.find("http://") {
                let addr = line[at..]
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = tx.send(addr);
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("topk logged its address");
    Server { child, base }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// GET returning (status, body).
pub fn get(url: &str) -> (u16, String) {
    let mut resp = agent().get(url).call().expect("request");
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().expect("body");
    (status, body)
}

/// Polls `check` until it returns Some or the deadline passes.
pub fn await_some<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process killed when dropped (also when the test fails).
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `topk reducer` on `config`, its state under `dir`, asking `worker_urls` for point counts.
fn spawn_reducer(
    dir: &Path,
    config: &str,
    assignment: &str,
    kafka_secrets: Option<&str>,
    worker_urls: &[String],
) -> Server {
    let state = dir.join("reducer");
    let mut args = vec![
        "reducer",
        "--config",
        config,
        "--assignment-file",
        assignment,
        "--state-dir",
        state.to_str().expect("utf-8 path"),
    ];
    if let Some(secrets) = kafka_secrets {
        args.extend(["--kafka-secrets", secrets]);
    }
    let urls = worker_urls.join(",");
    if !urls.is_empty() {
        args.extend(["--worker-urls", &urls]);
    }
    spawn(&args)
}

/// A reducer and the means to start the two workers, one shard each (epoch 1), on the
/// rendered `config`; each process has its state dir under `dir`.
pub struct Stack {
    dir: PathBuf,
    pub config: String,
    assignment: String,
    /// `--kafka-secrets` of every process, when the config references Secrets.
    kafka_secrets: Option<String>,
    /// The reducer's `--worker-urls` (none: it answers no point counts).
    worker_urls: Vec<String>,
    pub reducer: Server,
}

impl Stack {
    pub fn start(dir: &Path, config: &Path) -> Self {
        Self::start_with(dir, config, None)
    }

    /// [`Self::start`] for a config whose Kafka settings reference Secrets, whose keys are
    /// files under `kafka_secrets` (as the operator mounts them).
    pub fn start_with(dir: &Path, config: &Path, kafka_secrets: Option<&Path>) -> Self {
        let assignment = dir.join("assignment.json");
        let table = serde_json::json!({"version": 1, "shards": [
            {"shard": 0, "worker": 0, "epoch": 1},
            {"shard": 1, "worker": 1, "epoch": 1},
        ]});
        std::fs::write(&assignment, table.to_string()).expect("assignment");
        let config = config.to_str().expect("utf-8 path").to_owned();
        let assignment = assignment.to_str().expect("utf-8 path").to_owned();
        let kafka_secrets = kafka_secrets.map(|p| p.to_str().expect("utf-8 path").to_owned());
        let reducer = spawn_reducer(dir, &config, &assignment, kafka_secrets.as_deref(), &[]);
        Self {
            dir: dir.to_owned(),
            config,
            assignment,
            kafka_secrets,
            worker_urls: Vec::new(),
            reducer,
        }
    }

    /// Restarts the reducer asking `workers` (by ordinal) for point counts.
    pub fn ask_workers(&mut self, workers: &[&Server]) {
        self.worker_urls = workers.iter().map(|w| w.base.clone()).collect();
        self.restart_reducer();
    }

    /// The `--kafka-secrets` arguments every process of the stack takes.
    pub fn secrets_args(&self) -> Vec<String> {
        self.kafka_secrets
            .iter()
            .flat_map(|dir| ["--kafka-secrets".to_owned(), dir.clone()])
            .collect()
    }

    /// SIGKILLs the reducer and starts it again on the same state.
    pub fn restart_reducer(&mut self) {
        let _ = self.reducer.child.kill();
        let _ = self.reducer.child.wait();
        self.reducer = spawn_reducer(
            &self.dir,
            &self.config,
            &self.assignment,
            self.kafka_secrets.as_deref(),
            &self.worker_urls,
        );
    }

    /// SIGKILLs the reducer, runs `meanwhile`, and starts it again on the same state.
    pub fn restart_reducer_after(&mut self, meanwhile: impl FnOnce()) {
        let _ = self.reducer.child.kill();
        let _ = self.reducer.child.wait();
        meanwhile();
        self.restart_reducer();
    }

    /// Another reducer replica, `ordinal` (above 0), with its own state under `dir`.
    pub fn replica(&self, ordinal: u32) -> Server {
        let state = self.dir.join(format!("reducer-{ordinal}"));
        let ordinal = ordinal.to_string();
        let mut args = vec![
            "reducer",
            "--config",
            &self.config,
            "--assignment-file",
            &self.assignment,
            "--state-dir",
            state.to_str().expect("utf-8 path"),
            "--ordinal",
            &ordinal,
        ];
        if let Some(secrets) = &self.kafka_secrets {
            args.extend(["--kafka-secrets", secrets]);
        }
        spawn(&args)
    }

    /// The reducer's ranking store (a RocksDB directory).
    pub fn reducer_store(&self) -> PathBuf {
        self.dir.join("reducer").join("rankings")
    }

    /// Worker `ordinal`'s checkpoint store (a RocksDB directory).
    pub fn worker_store(&self, ordinal: u32) -> PathBuf {
        self.worker_dir(ordinal).join("checkpoints")
    }

    /// Replaces the assignment table the reducer and the workers started by [`Self::worker`]
    /// follow.
    pub fn set_table(&self, table: &serde_json::Value) {
        std::fs::write(&self.assignment, table.to_string()).expect("assignment");
    }

    fn worker_args(&self, ordinal: u32) -> Vec<String> {
        self.worker_args_on(ordinal, &self.assignment)
    }

    fn worker_args_on(&self, ordinal: u32, assignment: &str) -> Vec<String> {
        let state = self.worker_dir(ordinal);
        let mut args = vec![
            "worker".into(),
            "--config".into(),
            self.config.clone(),
            "--ordinal".into(),
            ordinal.to_string(),
            "--assignment-file".into(),
            assignment.to_owned(),
            "--state-dir".into(),
            state.to_str().expect("utf-8 path").to_owned(),
        ];
        args.extend(self.secrets_args());
        args
    }

    pub fn worker(&self, ordinal: u32) -> Process {
        self.spawn_worker(self.worker_args(ordinal))
    }

    /// Worker `ordinal` following its own assignment file instead of the shared one.
    pub fn worker_on(&self, ordinal: u32, assignment: &Path) -> Process {
        self.spawn_worker(self.worker_args_on(ordinal, assignment.to_str().expect("utf-8 path")))
    }

    fn spawn_worker(&self, args: Vec<String>) -> Process {
        Process(
            topk()
                .args(args)
                .args(["--listen", "127.0.0.1:0"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start topk worker"),
        )
    }

    /// [`Self::worker`] with its HTTP address (its log is not shown).
    pub fn served_worker(&self, ordinal: u32) -> Server {
        self.served_worker_with(ordinal, &[])
    }

    /// [`Self::served_worker`] with further arguments (e.g. `--report-file`).
    pub fn served_worker_with(&self, ordinal: u32, extra: &[&str]) -> Server {
        let args = self.worker_args(ordinal);
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(extra);
        spawn(&args)
    }

    /// Worker `ordinal`'s state directory (its checkpoints and nothing else).
    pub fn worker_dir(&self, ordinal: u32) -> PathBuf {
        self.dir.join(format!("worker-{ordinal}"))
    }
}

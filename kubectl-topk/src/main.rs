//! `kubectl topk`: a kubectl plugin (any executable named `kubectl-topk` on the PATH is one).
//!
//!   kubectl topk get NAME [--window W] [--scope S] [-k N] [--version V | --as-of T] [-n NS] [-o table|json]
//!   kubectl topk history NAME [--window W] [--scope S] [--limit N] [-n NS] [-o table|json]
//!   kubectl topk status NAME [-n NS]
//!   kubectl topk rollback NAME --window W [--scope S] --version V [-n NS]
//!
//! `get` reads a list from the metric's reducer through the API server's service proxy (no
//! port-forward, the caller's RBAC applies: `get` on `services/proxy`), the served one or a
//! stored earlier version; `history` lists a list's stored versions the same way; `status` shows the
//! TopKMetric's conditions, shard owners and epochs, lag and exactness; `rollback` writes a
//! request into the TopKMetric's `topk.io/rollback` annotation (the caller needs `patch` on
//! `topkmetrics`) and waits for the reducers' answer in its status.

use std::fmt::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;
use topk_api::TopKMetric;
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
use topk_api::names::Names;
use topk_api::rollback::{ROLLBACK_ANNOTATION, RollbackRequest, RollbackResult};
use topk_engine::trend::TRENDING;

#[derive(Parser)]
#[command(
    name = "kubectl topk",
    version,
    about = "Rankings of TopKMetric resources"
)]
struct Cli {
    /// Namespace of the TopKMetric (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Act as this user (as kubectl's `--as`: the caller needs `impersonate`).
    #[arg(long = "as", global = true)]
    as_user: Option<String>,
    /// Act as a member of this group (repeatable).
    #[arg(long = "as-group", global = true)]
    as_groups: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a ranking as a table, read from the metric's reducer.
    Get {
        name: String,
        /// Window name (default: the first window of the spec).
        #[arg(long)]
        window: Option<String>,
        /// Scope (default: the global list).
        #[arg(long, default_value = "")]
        scope: String,
        /// Show only the top N.
        #[arg(short = 'k', long)]
        k: Option<u32>,
        /// A stored earlier version instead of the served list (see `kubectl topk history`).
        #[arg(long, conflicts_with = "as_of")]
        version: Option<u64>,
        /// The version that was newest at this time (RFC 3339), instead of the served list.
        #[arg(long)]
        as_of: Option<String>,
        /// `table` or `json` (the reducer's answer as is).
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// The stored versions of a list, newest first: when each was published and what input
    /// it covered.
    History {
        name: String,
        /// Window name (default: the first window of the spec).
        #[arg(long)]
        window: Option<String>,
        /// Scope (default: the global list).
        #[arg(long, default_value = "")]
        scope: String,
        /// Show at most this many versions.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// `table` or `json` (the reducer's answer as is).
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// Any keys' counts in a window (listed or not), from the workers owning them.
    Count {
        name: String,
        /// The keys (at most 1000).
        #[arg(required = true)]
        keys: Vec<String>,
        /// Window name (default: the first window of the spec).
        #[arg(long)]
        window: Option<String>,
        /// Scope (default: the global one).
        #[arg(long, default_value = "")]
        scope: String,
        /// `table` or `json` (the reducer's answer as is).
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// Conditions, shard owners and epochs, lag and exactness of a TopKMetric.
    Status { name: String },
    /// Point a list back at a stored version until its next publication.
    Rollback {
        name: String,
        #[arg(long)]
        window: String,
        /// Scope (default: the global list).
        #[arg(long, default_value = "")]
        scope: String,
        /// The version to serve (see `kubectl topk get`).
        #[arg(long)]
        version: u64,
        /// How long to wait for the reducers' answer.
        #[arg(long, default_value = "30s", value_parser = topk_api::Duration::parse)]
        timeout: topk_api::Duration,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("kubectl topk: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String, String> {
    let unreachable = |e: String| format!("cannot reach the Kubernetes API: {e}");
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if cli.as_user.is_some() {
        config.auth_info.impersonate = cli.as_user.clone();
    }
    if !cli.as_groups.is_empty() {
        config.auth_info.impersonate_groups = Some(cli.as_groups.clone());
    }
    let client = Client::try_from(config).map_err(|e| unreachable(e.to_string()))?;
    let ns = cli
        .namespace
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let name = match &cli.command {
        Command::Get { name, .. }
        | Command::History { name, .. }
        | Command::Count { name, .. }
        | Command::Status { name }
        | Command::Rollback { name, .. } => name.clone(),
    };
    let metric = metrics
        .get_opt(&name)
        .await
        .map_err(|e| format!("cannot read TopKMetric {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("TopKMetric {ns}/{name} not found"))?;
    let reducer = Reducer::of(&client, &ns, &name, &metric.spec.metric);
    let window_or_first = |window: Option<String>| {
        window
            .or_else(|| metric.spec.windows.first().map(|w| w.name.clone()))
            .unwrap_or_default()
    };
    match cli.command {
        Command::Get {
            window,
            scope,
            k,
            version,
            as_of,
            output,
            ..
        } => {
            let mut query = vec![("window", window_or_first(window)), ("scope", scope)];
            if let Some(k) = k {
                query.push(("k", k.to_string()));
            }
            if let Some(version) = version {
                query.push(("version", version.to_string()));
            }
            if let Some(as_of) = as_of {
                query.push(("asOf", as_of));
            }
            let text = reducer.get("rankings", "", &query).await?;
            shown(text, &output, "a list", render_list)
        }
        Command::History {
            window,
            scope,
            limit,
            output,
            ..
        } => {
            let query = vec![
                ("window", window_or_first(window)),
                ("scope", scope),
                ("limit", limit.to_string()),
            ];
            let text = reducer.get("rankings", "/history", &query).await?;
            shown(text, &output, "a history", render_history)
        }
        Command::Count {
            keys,
            window,
            scope,
            output,
            ..
        } => {
            let mut query = vec![("window", window_or_first(window)), ("scope", scope)];
            query.extend(keys.into_iter().map(|k| ("key", k)));
            let text = reducer.get("frequency", "", &query).await?;
            shown(text, &output, "counts", render_counts)
        }
        Command::Status { .. } => {
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let table = maps
                .get_opt(&Names::of(&name).assignment)
                .await
                .map_err(|e| format!("cannot read the assignment of {ns}/{name}: {e}"))?
                .and_then(|cm| cm.data?.get(ASSIGNMENT_KEY).cloned())
                .and_then(|text| serde_json::from_str::<AssignmentTable>(&text).ok());
            Ok(render_status(&metric, table.as_ref()))
        }
        Command::Rollback {
            window,
            scope,
            version,
            timeout,
            ..
        } => {
            let request = RollbackRequest::new(window, scope, version, now_ms());
            let text = serde_json::to_string(&request).map_err(|e| e.to_string())?;
            let trending = metric.spec.trending.as_ref().map(|_| TRENDING.to_owned());
            let windows: Vec<String> = metric
                .spec
                .windows
                .iter()
                .map(|w| w.name.clone())
                .chain(trending)
                .collect();
            RollbackRequest::judge(&text, &windows, now_ms()).map_err(|(_, message)| message)?;
            let patch =
                serde_json::json!({"metadata": {"annotations": {ROLLBACK_ANNOTATION: text}}});
            metrics
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("cannot request the rollback of {ns}/{name}: {e}"))?;
            let deadline = std::time::Instant::now() + topk_api::dataplane::std_duration(timeout);
            loop {
                let answered = metrics
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|m| m.status?.last_rollback)
                    .filter(|r| r.requested_at.as_deref() == Some(&request.requested_at));
                match answered {
                    Some(status) if status.result == RollbackResult::Applied => {
                        return Ok(format!("{}\n", status.message));
                    }
                    Some(status) => {
                        return Err(format!(
                            "the reducers refused the rollback ({:?}): {}",
                            status.result, status.message
                        ));
                    }
                    None if std::time::Instant::now() >= deadline => {
                        return Err(format!(
                            "requested; no reducer answered within {timeout} (are they running? \
                             `kubectl topk status {name} -n {ns}` shows the answer when it comes)"
                        ));
                    }
                    None => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
                }
            }
        }
    }
}

/// The reducer's answer as is (`-o json`) or rendered by `render`.
fn shown(
    text: String,
    output: &str,
    what: &str,
    render: fn(&Value) -> String,
) -> Result<String, String> {
    if output == "json" {
        return Ok(format!("{text}\n"));
    }
    let answer: Value = serde_json::from_str(&text)
        .map_err(|e| format!("the reducer answered something else than {what}: {e}"))?;
    Ok(render(&answer))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The query API of a metric's reducers, through the API server's service proxy.
struct Reducer<'a> {
    client: &'a Client,
    ns: &'a str,
    name: &'a str,
    metric: &'a str,
}

impl<'a> Reducer<'a> {
    fn of(client: &'a Client, ns: &'a str, name: &'a str, metric: &'a str) -> Self {
        Self {
            client,
            ns,
            name,
            metric,
        }
    }

    /// `GET /v1/{route}/{metric}{suffix}?query`: the body of a 2xx answer, else why not.
    async fn get(
        &self,
        route: &str,
        suffix: &str,
        query: &[(&str, String)],
    ) -> Result<String, String> {
        let (ns, name) = (self.ns, self.name);
        let path = format!(
            "/api/v1/namespaces/{ns}/services/{}:http/proxy/v1/{route}/{}{suffix}?{}",
            Names::of(name).reducer,
            encode(self.metric),
            query
                .iter()
                .map(|(k, v)| format!("{k}={}", encode(v)))
                .collect::<Vec<_>>()
                .join("&")
        );
        let request = http::Request::get(path)
            .body(kube::client::Body::empty())
            .map_err(|e| e.to_string())?;
        let unreachable = |e: kube::Error| {
            format!(
                "the reducer of {ns}/{name} did not answer (is it ready? `kubectl get tkm {name} -n {ns}`): {e}"
            )
        };
        let response = self.client.send(request).await.map_err(unreachable)?;
        let code = response.status();
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .map_err(unreachable)?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if !code.is_success() {
            return Err(refusal(ns, name, code.as_u16(), &text));
        }
        Ok(text)
    }
}

/// A list's stored versions as a table, the served one marked.
fn render_history(history: &Value) -> String {
    let scope = scope_label(history);
    let mut out = format!(
        "{}  window {}  scope {scope}  served version {}\n",
        str_of(history, "metric"),
        str_of(history, "window"),
        history["served"],
    );
    let _ = writeln!(
        out,
        "{:>8}  {:<24}  {:<24}  {:<24}  {:>5}  INPUT (shard:offset)",
        "VERSION", "AS OF", "WINDOW END", "WATERMARK", "ITEMS"
    );
    let versions = history["versions"].as_array().cloned().unwrap_or_default();
    for v in &versions {
        let input: Vec<String> = v["inputRange"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{}:{}", r["shard"], r["offset"]))
            .collect();
        let served = if v["version"] == history["served"] {
            "*"
        } else {
            " "
        };
        let _ = writeln!(
            out,
            "{:>7}{served}  {:<24}  {:<24}  {:<24}  {:>5}  {}",
            v["version"].to_string(),
            str_of(v, "asOf"),
            str_of(v, "windowEnd"),
            str_of(v, "watermark"),
            v["items"].to_string(),
            if input.is_empty() {
                "-".to_owned()
            } else {
                input.join(" ")
            },
        );
    }
    if versions.is_empty() {
        out.push_str("(no stored versions)\n");
    }
    out
}

/// A non-2xx answer: the reducer's own `{"error": ...}` (bad window, unknown scope), or the
/// API server's Status (no ready reducer, no access to `services/proxy`).
fn refusal(ns: &str, name: &str, code: u16, body: &str) -> String {
    let json: Option<Value> = serde_json::from_str(body).ok();
    let reducer_said = json.as_ref().and_then(|v| v["error"].as_str());
    let apiserver_said = json.as_ref().and_then(|v| v["message"].as_str());
    match (reducer_said, apiserver_said) {
        (Some(error), _) => {
            format!("the reducer of {ns}/{name} refused the request ({code}): {error}")
        }
        (None, Some(message)) => format!(
            "the reducer of {ns}/{name} did not answer ({code}: {message}); is it ready? `kubectl get tkm {name} -n {ns}`"
        ),
        (None, None) => format!("the reducer of {ns}/{name} answered {code}: {body}"),
    }
}

/// Percent-encodes a query or path component.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// An answer's scope as shown: the global scope is `(global)`.
fn scope_label(answer: &Value) -> &str {
    match answer["scope"].as_str() {
        Some("") | None => "(global)",
        Some(s) => s,
    }
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or("-")
}

/// A list as a header and a RANK / COUNT / KEY table (RANK / SCORE / COUNT / BASELINE / KEY
/// for a trending list).
fn render_list(list: &Value) -> String {
    let scope = scope_label(list);
    let mut out = format!(
        "{}  window {}  scope {scope}  version {}  as of {}\n",
        str_of(list, "metric"),
        str_of(list, "window"),
        list["version"],
        str_of(list, "asOf"),
    );
    let _ = writeln!(
        out,
        "ends {}  watermark {}  exact until {}  max over-count {}{}",
        str_of(list, "windowEnd"),
        str_of(list, "watermark"),
        str_of(list, "exactUntil"),
        list["maxOvercount"],
        if list["stale"] == true { "  STALE" } else { "" },
    );
    // A global metric's list: the regions it adds up, and those it had to leave out.
    if let Some(complete) = list["completeRegions"].as_array() {
        let names = |regions: Option<&Vec<Value>>| {
            let names: Vec<&str> = regions
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if names.is_empty() {
                "-".to_owned()
            } else {
                names.join(",")
            }
        };
        let missing = list["missingRegions"].as_array();
        let _ = writeln!(
            out,
            "regions {}  missing {}{}",
            names(Some(complete)),
            names(missing),
            if missing.is_some_and(|m| !m.is_empty()) {
                "  INCOMPLETE"
            } else {
                ""
            },
        );
    }
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let width = items
        .iter()
        .map(|i| i["count"].to_string().len())
        .max()
        .unwrap_or(5)
        .max(5);
    // A trending list is ordered by its score, against the count in its baseline window.
    let trending = items.iter().any(|i| i["score"].is_number());
    let (score_head, baseline_head) = if trending {
        ("   SCORE", format!("  {:>8}", "BASELINE"))
    } else {
        ("", String::new())
    };
    let _ = writeln!(
        out,
        "{:>4}{score_head}  {:>width$}{baseline_head}  KEY",
        "RANK", "COUNT"
    );
    for item in &items {
        let (score, baseline) = if trending {
            (
                format!("  {:>6.2}", item["score"].as_f64().unwrap_or(0.0)),
                format!("  {:>8}", item["baseline"].to_string()),
            )
        } else {
            (String::new(), String::new())
        };
        let _ = writeln!(
            out,
            "{:>4}{score}  {:>width$}{baseline}  {}",
            item["rank"].to_string(),
            item["count"].to_string(),
            str_of(item, "key")
        );
    }
    if items.is_empty() {
        out.push_str("(no keys in this window yet)\n");
    }
    out
}

/// Point counts as a header and a COUNT / KEY table (with the bound in approximate mode).
fn render_counts(counts: &Value) -> String {
    let scope = scope_label(counts);
    let mut out = format!(
        "{}  window {}  scope {scope}  mode {}  watermark {}  as of {}\n",
        str_of(counts, "metric"),
        str_of(counts, "window"),
        str_of(counts, "mode"),
        str_of(counts, "watermark"),
        str_of(counts, "asOf"),
    );
    let items = counts["items"].as_array().cloned().unwrap_or_default();
    let approximate = counts["mode"] == "approximate";
    let width = items
        .iter()
        .map(|i| i["count"].to_string().len())
        .max()
        .unwrap_or(5)
        .max(5);
    let bound = if approximate { "  MAX OVER" } else { "" };
    let _ = writeln!(
        out,
        "{:>width$}{bound}  SHARD  WINDOW END{:15}KEY",
        "COUNT", ""
    );
    for item in &items {
        let bound = if approximate {
            format!("  {:>8}", item["maxOvercount"].to_string())
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{:>width$}{bound}  {:>5}  {:<25}{}",
            item["count"].to_string(),
            item["shard"].to_string(),
            str_of(item, "windowEnd"),
            str_of(item, "key")
        );
    }
    out
}

/// The metric's status as a few aligned sections.
fn render_status(metric: &TopKMetric, table: Option<&AssignmentTable>) -> String {
    let spec = &metric.spec;
    let status = metric.status.clone().unwrap_or_default();
    let inputs = match &spec.regions {
        Some(regions) => format!("global of regions {}", regions.names.join(", ")),
        None => format!("shards {}", spec.shards()),
    };
    let mut out = format!(
        "{}/{}  metric {}  mode {}  {inputs}  k {}\n",
        metric.metadata.namespace.as_deref().unwrap_or("-"),
        metric.metadata.name.as_deref().unwrap_or("-"),
        spec.metric,
        format!("{:?}", spec.mode).to_lowercase(),
        spec.k,
    );
    out.push_str("\nCONDITIONS\n");
    for c in &status.conditions {
        let _ = writeln!(
            out,
            "  {:<12} {:<6} {:<20} {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    if status.conditions.is_empty() {
        out.push_str("  (none yet: is the operator running?)\n");
    }
    if let Some(w) = &status.workers {
        let _ = writeln!(out, "\nWORKERS {} ready", w.summary);
    }
    // A global metric has no shards: its inputs are the regions' lists.
    if !spec.is_global() {
        out.push_str("\nSHARDS\n");
        match table {
            Some(table) => {
                let _ = writeln!(out, "  assignment version {}", table.version);
                let _ = writeln!(out, "  {:>5}  {:>6}  {:>5}", "SHARD", "WORKER", "EPOCH");
                for s in &table.shards {
                    let _ = writeln!(out, "  {:>5}  {:>6}  {:>5}", s.shard, s.worker, s.epoch);
                }
            }
            None => out.push_str("  (no assignment table yet)\n"),
        }
    }
    let _ = writeln!(
        out,
        "\nLAG AND EXACTNESS\n  watermark lag {}  exact until {}  leader {}",
        status.watermark_lag.as_deref().unwrap_or("-"),
        status.exact_until.as_deref().unwrap_or("-"),
        status.leader.as_deref().unwrap_or("-"),
    );
    for r in &status.rankings {
        let _ = writeln!(
            out,
            "  window {:<8} as of {}  watermark {}  exact until {}",
            r.window,
            r.as_of.as_deref().unwrap_or("-"),
            r.watermark.as_deref().unwrap_or("-"),
            r.exact_until.as_deref().unwrap_or("-"),
        );
    }
    if let Some(recount) = &status.recount {
        let _ = writeln!(
            out,
            "\nRECOUNT\n  running {}  exact from {}  waiting {}  failing {}",
            recount.running,
            recount.exact_from.as_deref().unwrap_or("-"),
            recount.succeeded.len(),
            recount.failures.len(),
        );
        if let Some(last) = &recount.last_recount {
            let _ = writeln!(
                out,
                "  last hour {}: {} read, {} counted, {} duplicates, {} keys",
                last.hour, last.events_read, last.counted, last.duplicates, last.keys
            );
        }
    }
    if let Some(g) = &status.grading {
        let _ = writeln!(
            out,
            "\nGRADING (hour {})\n  recall@k {:.3}  over-count {} (bound {})  rank displacement {}",
            g.hour, g.recall_at_k, g.max_overcount, g.overcount_bound, g.max_rank_displacement
        );
    }
    if let Some(r) = &status.last_rollback {
        let _ = writeln!(
            out,
            "\nLAST ROLLBACK (requested {}, handled {})\n  {:?}: {}",
            r.requested_at.as_deref().unwrap_or("-"),
            r.handled_at,
            r.result,
            r.message
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_renders_as_a_table() {
        let list = serde_json::json!({
            "metric": "plays", "scope": "", "window": "1h", "version": 7,
            "asOf": "2026-11-30T10:00:00Z", "windowEnd": "2026-11-30T10:00:00Z",
            "watermark": "2026-11-30T09:59:59Z", "maxOvercount": 0, "stale": true,
            "items": [{"rank": 1, "key": "song-1", "count": 120}, {"rank": 2, "key": "b", "count": 7}],
        });
        let text = render_list(&list);
        assert!(
            text.starts_with("plays  window 1h  scope (global)  version 7"),
            "{text}"
        );
        assert!(
            text.contains("exact until -  max over-count 0  STALE"),
            "{text}"
        );
        assert!(
            text.contains("RANK  COUNT  KEY\n   1    120  song-1\n   2      7  b\n"),
            "{text}"
        );
        assert_eq!(encode("eu west/1"), "eu%20west%2F1");
    }

    #[test]
    fn a_global_list_names_its_regions_and_says_when_one_is_missing() {
        let mut list = serde_json::json!({
            "metric": "plays", "scope": "", "window": "1m", "version": 2,
            "completeRegions": ["eu"], "missingRegions": ["us"], "items": [],
        });
        assert!(render_list(&list).contains("\nregions eu  missing us  INCOMPLETE\n"));
        list["completeRegions"] = serde_json::json!(["eu", "us"]);
        list["missingRegions"] = serde_json::json!([]);
        assert!(render_list(&list).contains("\nregions eu,us  missing -\n"));
        list.as_object_mut().map(|l| l.remove("completeRegions"));
        assert!(!render_list(&list).contains("regions"));
    }

    #[test]
    fn a_global_metrics_status_names_its_regions_and_has_no_shards() {
        let metric = topk_api::load_manifest(
            "apiVersion: topk.io/v1alpha1\nkind: TopKMetric\nmetadata: {name: plays-global, namespace: topk}\n\
             spec: {metric: plays, regions: {names: [eu, us]}, internalKafka: {bootstrapServers: \"g:9092\"}, k: 5, windows: [{name: 1h, length: 1h, bucket: 1m}]}\n",
        )
        .expect("a global metric");
        let text = render_status(&metric, None);
        assert!(
            text.starts_with(
                "topk/plays-global  metric plays  mode exact  global of regions eu, us  k 5\n"
            ),
            "{text}"
        );
        assert!(!text.contains("SHARDS"), "{text}");
    }

    #[test]
    fn a_trending_list_shows_its_scores_and_baselines() {
        let list = serde_json::json!({
            "metric": "plays", "scope": "", "window": "trending", "version": 3,
            "items": [{"rank": 1, "key": "new", "count": 40, "baseline": 40, "score": 9.4615},
                      {"rank": 2, "key": "old", "count": 10, "baseline": 120, "score": 1.0}],
        });
        let text = render_list(&list);
        assert!(
            text.contains("RANK   SCORE  COUNT  BASELINE  KEY\n   1    9.46     40        40  new\n   2    1.00     10       120  old\n"),
            "{text}"
        );
    }

    #[test]
    fn a_history_renders_with_the_served_version_marked() {
        let history = serde_json::json!({
            "metric": "plays", "window": "1h", "scope": "", "served": 7,
            "versions": [
                {"version": 8, "asOf": "2026-12-04T10:01:00Z", "windowEnd": "2026-12-04T10:00:00Z",
                 "watermark": "2026-12-04T10:00:30Z", "items": 5,
                 "inputRange": [{"shard": 0, "epoch": 1, "offset": 40}, {"shard": 1, "epoch": 1, "offset": 12}]},
                {"version": 7, "asOf": "2026-12-04T10:00:00Z", "windowEnd": "2026-12-04T09:59:00Z",
                 "watermark": "2026-12-04T09:59:30Z", "items": 4, "inputRange": []},
            ],
        });
        let text = render_history(&history);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("served version 7"), "{text}");
        assert!(
            lines[2].trim_start().starts_with("8 ") && lines[2].ends_with("0:40 1:12"),
            "{text}"
        );
        assert!(lines[3].trim_start().starts_with("7*"), "{text}");
    }

    #[test]
    fn counts_render_with_their_bound_in_approximate_mode() {
        let counts = serde_json::json!({
            "metric": "plays", "window": "1h", "scope": "", "mode": "approximate",
            "watermark": "2026-12-04T10:00:00.000Z", "asOf": "2026-12-04T10:00:01.000Z",
            "items": [{"key": "song-1", "shard": 3, "count": 1200, "maxOvercount": 40,
                       "windowEnd": "2026-12-04T10:00:00.000Z"}],
        });
        let text = render_counts(&counts);
        assert!(text.contains("mode approximate"), "{text}");
        assert!(text.contains("MAX OVER"), "{text}");
        let row = text.lines().last().unwrap();
        assert!(
            row.contains("1200") && row.contains("40") && row.ends_with("song-1"),
            "{row}"
        );
    }

    #[test]
    fn refusals_say_who_refused() {
        let unready = r#"{"kind":"Status","message":"no endpoints available for service \"plays-reducer\"","code":503}"#;
        assert!(refusal("d", "plays", 503, unready).starts_with(
            "the reducer of d/plays did not answer (503: no endpoints available for service \"plays-reducer\")"
        ));
        let bad = r#"{"error":"unknown window \"9h\""}"#;
        assert_eq!(
            refusal("d", "plays", 400, bad),
            "the reducer of d/plays refused the request (400): unknown window \"9h\""
        );
    }
}

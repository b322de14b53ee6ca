//! `topk produce`: JSON-lines events into a Kafka input topic the way topk expects them: keyed
//! `metric|scope|key` (so the default murmur2 partitioner gives every key one shard) and
//! stamped with the event time (so the hourly recount finds an hour's events by timestamp).
//! For loading test data, replays and the end-to-end tests; any producer that keys and stamps
//! the same way works.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use topk_engine::event::parse_event;
use topk_engine::partition::message_key;
use topk_runtime::output::{DeliveryCounter, send};

use crate::error::CliError;

#[derive(Args)]
pub struct ProduceArgs {
    /// Kafka bootstrap servers.
    #[arg(long)]
    bootstrap: String,
    /// The input topic.
    #[arg(long)]
    topic: String,
    /// JSON-lines events; `-` or absent reads stdin.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Longest key accepted (as `maxKeyBytes` in the spec); longer events are skipped.
    #[arg(long, default_value_t = 1024)]
    max_key_bytes: usize,
    /// librdkafka properties for the connection, one `name=value` per line (`#` comments),
    /// as Kafka's `--producer.config`: `security.protocol`, `sasl.mechanism`,
    /// `sasl.username`, `sasl.password`, `ssl.ca.location`, ...
    #[arg(long)]
    producer_config: Option<PathBuf>,
}

/// Properties `topk produce` sets itself: the keying contract and where to connect.
const FIXED_PROPERTIES: [&str; 3] = ["bootstrap.servers", "partitioner", "enable.idempotence"];

/// The properties of a `--producer-config` file, in order.
fn producer_properties(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut properties = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {}: not name=value", number + 1));
        };
        let name = name.trim();
        if FIXED_PROPERTIES.contains(&name) {
            return Err(format!(
                "line {}: {name} is set by topk produce (use --bootstrap; the partitioner and \
                 idempotence are what topk's keying needs)",
                number + 1
            ));
        }
        properties.push((name.to_owned(), value.trim().to_owned()));
    }
    Ok(properties)
}

pub async fn produce(args: ProduceArgs) -> Result<(), CliError> {
    tokio::task::spawn_blocking(move || produce_blocking(&args))
        .await
        .map_err(|e| CliError::Usage(e.to_string()))?
}

fn produce_blocking(args: &ProduceArgs) -> Result<(), CliError> {
    let reader: Box<dyn BufRead> = match &args.input {
        Some(path) if path.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).map_err(|source| CliError::ReadFile {
                path: path.display().to_string(),
                source,
            })?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.bootstrap)
        .set("partitioner", topk_runtime::clients::KEYED_PARTITIONER)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20");
    if let Some(path) = &args.producer_config {
        let text = std::fs::read_to_string(path).map_err(|source| CliError::ReadFile {
            path: path.display().to_string(),
            source,
        })?;
        let properties = producer_properties(&text)
            .map_err(|e| CliError::Usage(format!("--producer-config {}: {e}", path.display())))?;
        for (name, value) in properties {
            config.set(name, value);
        }
    }
    let delivery = DeliveryCounter::default();
    let producer: ThreadedProducer<DeliveryCounter> = config
        .create_with_context(delivery.clone())
        .map_err(topk_runtime::Error::from)?;
    let (mut sent, mut skipped) = (0u64, 0u64);
    for (number, line) in reader.lines().enumerate() {
        let line = line.map_err(CliError::Input)?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_event(&line, args.max_key_bytes) {
            Ok(event) => {
                let key = message_key(&event.metric, &event.scope, &event.key);
                let record = BaseRecord::to(&args.topic)
                    .key(&key)
                    .payload(&line)
                    .timestamp(event.time_ms);
                send(&producer, record)?;
                sent += 1;
            }
            Err(reason) => {
                skipped += 1;
                tracing::warn!(line = number + 1, reason = reason.as_str(), "event skipped");
            }
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .map_err(topk_runtime::Error::from)?;
    let failed = delivery.failed();
    println!(
        "{}",
        serde_json::json!({"sent": sent - failed.min(sent), "skipped": skipped, "failed": failed})
    );
    if failed > 0 {
        return Err(CliError::Usage(format!(
            "{failed} events were not accepted by the broker"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_config_reads_like_kafkas_and_keeps_the_keying() {
        let text = "# SASL over TLS\nsecurity.protocol=SASL_SSL\n\n sasl.password = a=b \n";
        assert_eq!(
            producer_properties(text),
            Ok(vec![
                ("security.protocol".into(), "SASL_SSL".into()),
                ("sasl.password".into(), "a=b".into()),
            ])
        );
        let refused = producer_properties("linger.ms=5\npartitioner=consistent").unwrap_err();
        assert!(
            refused.starts_with("line 2: partitioner is set by topk produce"),
            "{refused}"
        );
        assert_eq!(
            producer_properties("acks"),
            Err("line 1: not name=value".into())
        );
    }
}

//! `seqline-fed-bench`: a remote join into a large room, timed for the pairs
//! (resident, joiner) of seqline and Synapse (`--mode join`, the default);
//! a fake federation server's PDUs into a large room (`--mode inbound`) and
//! a backfill of a long history (`--mode backfill`), each on seqline and
//! Synapse; a message's and a typing notice's way from one server into a
//! `/sync` long-poll on another (`--mode latency`), and what a server sends
//! to 19 others while its users are active in a room of 500 (`--mode
//! fanout`). See `seqline_bench::federation` and its modules `pdus`,
//! `latency` and `fanout`, and `bench/federation.sh`.

use std::process::ExitCode;

use clap::Parser as _;
use seqline_bench::BenchError;
use seqline_bench::federation::{FedConfig, fanout, latency, pdus, run, table};
use serde_json::{Value, json};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = FedConfig::parse();
    for mode in &config.mode {
        if !matches!(mode.as_str(), "join" | "inbound" | "backfill" | "latency" | "fanout") {
            eprintln!("seqline-fed-bench: unknown mode {mode:?} (join, inbound, backfill, latency, fanout)");
            return ExitCode::FAILURE;
        }
    }
    let wants = |names: &[&str]| config.mode.iter().any(|m| names.contains(&m.as_str()));
    let mut failed = false;
    let mut json_out = json!({});
    // Each part: whether it was asked for, and the key of its JSON when it is not the first.
    for (part, key) in [
        (&["join"][..], "join"),
        (&["inbound", "backfill"][..], "pdu_modes"),
        (&["latency"][..], "latency"),
        (&["fanout"][..], "fanout"),
    ] {
        if !wants(part) {
            continue;
        }
        match run_part(&config, key).await {
            Ok((table, v, part_failed)) => {
                print!("{table}");
                if json_out == json!({}) {
                    json_out = v;
                } else {
                    json_out[key] = v;
                }
                failed |= part_failed;
            }
            Err(e) => {
                eprintln!("seqline-fed-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &config.json_out {
        let text = serde_json::to_string_pretty(&json_out).unwrap_or_else(|_| Value::Null.to_string());
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// Runs one part (`join`, `pdu_modes`, `latency`, `fanout`): its table, its
/// JSON and whether any of it failed.
async fn run_part(config: &FedConfig, part: &str) -> Result<(String, Value, bool), BenchError> {
    Ok(match part {
        "join" => {
            let results = run(config).await?;
            let v = json!({
                "members": config.members,
                "events": config.events,
                "repeats": config.repeats,
                "concurrency": config.concurrency,
                "backend": if config.postgres.is_some() { "postgres" } else { "sqlite" },
                "pairs": results.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
            });
            (table(config, &results), v, results.iter().any(|r| r.error.is_some()))
        }
        "pdu_modes" => {
            let results = pdus::run(config).await?;
            (pdus::table(config, &results), results.to_json(config), results.failed())
        }
        "latency" => {
            let results = latency::run(config).await?;
            let failed = results.iter().any(|r| r.error.is_some());
            (latency::table(config, &results), latency::to_json(config, &results), failed)
        }
        _ => {
            let results = fanout::run(config).await?;
            let failed = results.iter().any(|r| r.error.is_some());
            (fanout::table(config, &results), fanout::to_json(config, &results), failed)
        }
    })
}

//! `seqline-fed-bench`: a remote join into a large room, timed for the pairs
//! (resident, joiner) of seqline and Synapse (`--mode join`, the default);
//! a fake federation server's PDUs into a large room (`--mode inbound`) and
//! a backfill of a long history (`--mode backfill`), each on seqline and
//! Synapse. See `seqline_bench::federation`, `seqline_bench::federation::pdus`
//! and `bench/federation.sh`.

use std::process::ExitCode;

use clap::Parser as _;
use seqline_bench::federation::{FedConfig, pdus, run, table};
use serde_json::{Value, json};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = FedConfig::parse();
    for mode in &config.mode {
        if !matches!(mode.as_str(), "join" | "inbound" | "backfill") {
            eprintln!("seqline-fed-bench: unknown mode {mode:?} (join, inbound, backfill)");
            return ExitCode::FAILURE;
        }
    }
    let mut failed = false;
    let mut json_out = json!({});
    if config.mode.iter().any(|m| m == "join") {
        match run(&config).await {
            Ok(results) => {
                print!("{}", table(&config, &results));
                json_out = json!({
                    "members": config.members,
                    "events": config.events,
                    "repeats": config.repeats,
                    "concurrency": config.concurrency,
                    "backend": if config.postgres.is_some() { "postgres" } else { "sqlite" },
                    "pairs": results.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
                });
                failed |= results.iter().any(|r| r.error.is_some());
            }
            Err(e) => {
                eprintln!("seqline-fed-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if config.mode.iter().any(|m| m == "inbound" || m == "backfill") {
        match pdus::run(&config).await {
            Ok(results) => {
                print!("{}", pdus::table(&config, &results));
                let v = results.to_json(&config);
                if json_out == json!({}) {
                    json_out = v;
                } else {
                    json_out["pdu_modes"] = v;
                }
                failed |= results.failed();
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

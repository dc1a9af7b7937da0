//! `seqline-fed-bench`: a remote join into a large room, timed for the pairs
//! (resident, joiner) of seqline and Synapse; see `seqline_bench::federation`
//! and `bench/federation.sh`.

use std::process::ExitCode;

use clap::Parser as _;
use seqline_bench::federation::{FedConfig, run, table};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = FedConfig::parse();
    match run(&config).await {
        Ok(results) => {
            print!("{}", table(&config, &results));
            if let Some(path) = &config.json_out {
                let v = serde_json::json!({
                    "members": config.members,
                    "events": config.events,
                    "repeats": config.repeats,
                    "concurrency": config.concurrency,
                    "backend": if config.postgres.is_some() { "postgres" } else { "sqlite" },
                    "pairs": results.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
                });
                let text = serde_json::to_string_pretty(&v).expect("results are JSON");
                if let Err(e) = std::fs::write(path, text + "\n") {
                    eprintln!("{}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            if results.iter().any(|r| r.error.is_some()) { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            eprintln!("seqline-fed-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

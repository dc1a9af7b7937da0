//! `seqline-bench`: the chapter's workload against one homeserver, or
//! `--compare A.json,B.json` to put two reports side by side.

use std::process::ExitCode;

use clap::Parser as _;
use seqline_bench::{Config, Report, compare, run};

fn read_report(path: &std::path::Path) -> Result<Report, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Report::from_json(&v).map_err(|e| format!("{}: {e}", path.display()))
}

// One thread: the client should take as little of this machine's CPU from
// the server under test as it can.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = Config::parse();
    if !config.compare.is_empty() {
        let [a, b] = config.compare.as_slice() else {
            eprintln!("--compare takes two reports: A.json,B.json");
            return ExitCode::from(2);
        };
        return match (read_report(a), read_report(b)) {
            (Ok(a), Ok(b)) => {
                print!("{}", compare(&a, &b));
                ExitCode::SUCCESS
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&config).await {
        Ok(report) => {
            print!("{}", report.table());
            if let Some(path) = &config.json_out {
                let text = serde_json::to_string_pretty(&report.to_json()).expect("report is JSON");
                if let Err(e) = std::fs::write(path, text + "\n") {
                    eprintln!("{}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("seqline-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

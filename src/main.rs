//! The `seqline` command: serve, generate-config, register-user, version.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc returns freed memory to the system; glibc's per-thread arenas kept
/// hundreds of MiB after bursts of requests across tokio's threads.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use seqline::config::{self, Config, Settings};

#[derive(Parser)]
#[command(name = "seqline", about = "A Matrix homeserver", version)]
struct Cli {
    /// Configuration file (TOML). Without one, the built-in defaults apply;
    /// SEQLINE_* environment variables override either.
    #[arg(long, short, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the homeserver.
    Serve,
    /// Print an example configuration with every setting documented.
    GenerateConfig,
    /// Create a user account from the command line.
    RegisterUser {
        /// The localpart (the "alice" of @alice:server).
        #[arg(long, short)]
        user: String,
        /// The password; read from SEQLINE_PASSWORD when not given.
        #[arg(long, short, env = "SEQLINE_PASSWORD", hide_env_values = true)]
        password: String,
        /// Make the account a server administrator.
        #[arg(long)]
        admin: bool,
    },
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::GenerateConfig => {
            print!("{}", config::EXAMPLE);
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("seqline {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Serve => run(cli.config, seqline::server::run),
        Command::RegisterUser { user, password, admin } => run(cli.config, |settings| async move {
            let state = seqline::server::open(settings).await?;
            let result = seqline::account::create_user(&state, &user, Some(password), admin).await;
            state.db.close().await;
            let user_id = result?;
            println!("created {user_id}{}", if admin { " (admin)" } else { "" });
            Ok(())
        }),
    }
}

/// Loads and validates the configuration, sets up logging and the runtime, and
/// runs `body`; any failure is one line on stderr and a non-zero exit.
fn run<F, Fut>(config_path: Option<PathBuf>, body: F) -> ExitCode
where
    F: FnOnce(Settings) -> Fut,
    Fut: std::future::Future<Output = seqline::error::Result<()>>,
{
    let settings =
        match Config::load(config_path.as_deref(), |k| std::env::var(k).ok()).and_then(Config::validate) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("seqline: configuration error: {e}");
                return ExitCode::from(2);
            }
        };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(quiet_libraries(&settings.log)))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("seqline: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(body(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seqline: {e}");
            ExitCode::FAILURE
        }
    }
}

/// ruma's auth checks log every passing event at INFO; keep them at WARN unless
/// the filter says otherwise.
fn quiet_libraries(filter: &str) -> String {
    if filter.contains("ruma_state_res") {
        filter.to_owned()
    } else {
        format!("{filter},ruma_state_res=warn")
    }
}

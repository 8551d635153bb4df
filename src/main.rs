use std::process::ExitCode;

use clap::Parser;
use sluicegate::cli::{Cli, Command, RunArgs, init_tracing};
use sluicegate::{config, server};

#[global_allocator]
static ALLOCATOR: sluicegate_allocator::Allocator = sluicegate_allocator::Allocator;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (config, run_args) = match cli.command {
        Some(Command::Schema) => {
            println!("{}", sluicegate::config::schema());
            return ExitCode::SUCCESS;
        }
        Some(Command::Simulate(args)) => return sluicegate::cli::simulate(&args),
        Some(Command::Import(args)) => return sluicegate::cli::import(&args),
        Some(Command::Explain(args)) => return sluicegate::cli::explain(&args),
        Some(Command::Verify(args)) => return sluicegate::cli::verify(&args),
        Some(Command::Check(ref c) | Command::Promote(ref c)) => (c.config.clone(), None),
        Some(Command::Reload(ref r)) => (r.config.config.clone(), None),
        Some(Command::Candidate(ref c)) => (c.config.config.clone(), None),
        Some(Command::Run(ref r)) => (r.config.config.clone(), Some(r.clone())),
        None => (cli.run.config.config.clone(), Some(cli.run.clone())),
    };
    let default = std::path::PathBuf::from(sluicegate::cli::DEFAULT_CONFIG);
    let path = match config {
        Some(path) => path,
        // Where the systemd unit keeps it.
        None if default.exists() => default,
        None => {
            eprintln!(
                "sluicegate: no configuration: {} does not exist; give one with -c FILE (see config.example.yaml)",
                default.display()
            );
            return ExitCode::from(2);
        }
    };
    let path = &path;
    let check = matches!(cli.command, Some(Command::Check(_)));
    let loaded = if check { config::check(path) } else { config::load(path) };
    let config = match loaded {
        Ok(config) => config,
        // A file that cannot be read says so in one line; errors in it, then a summary.
        Err(e @ config::LoadError::Read { .. }) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!("{}: configuration is invalid", path.display());
            return ExitCode::FAILURE;
        }
    };
    if check {
        for warning in &config.warnings {
            eprintln!("warning: {warning}");
        }
        println!("{}: configuration is valid", path.display());
        // The process ends now and its memory with it: taking a large configuration
        // apart first (100,000 routes: tens of milliseconds) would only delay the answer.
        std::mem::forget(config);
        return ExitCode::SUCCESS;
    }
    let candidate_call = cli.command.as_ref().and_then(Command::candidate_call);
    match server::runtime() {
        Ok(runtime) => match candidate_call {
            Some(call) => runtime.block_on(sluicegate::cli::candidate(&config, call)),
            None => runtime.block_on(run(run_args, path.clone(), config)),
        },
        Err(e) => {
            eprintln!("sluicegate: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves `config` (`run_args`: how to log), or, without them, asks the running
/// instance to reload it (`sluicegate reload`).
async fn run(run_args: Option<RunArgs>, path: std::path::PathBuf, config: config::Config) -> ExitCode {
    let Some(run_args) = run_args else {
        return match sluicegate::cli::request_reload(&config, &path).await {
            Ok(reloaded) => {
                println!("{reloaded}: reloaded");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluicegate: {}: reload failed: {e}", path.display());
                ExitCode::FAILURE
            }
        };
    };
    init_tracing(&run_args);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let server = match server::Server::bind(config, Some(path.clone())).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("sluicegate: {}: cannot start: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    for (addr, tls) in server.local_addrs().unwrap_or_default() {
        tracing::info!(%addr, tls, "listening");
    }
    let shutdown = async {
        server::shutdown_signal().await;
        // A second SIGINT or SIGTERM while in-flight requests drain: stop at once.
        tokio::spawn(async {
            server::shutdown_signal().await;
            tracing::warn!("second signal: exiting without waiting for in-flight requests");
            std::process::exit(1);
        });
    };
    server.run(shutdown).await;
    ExitCode::SUCCESS
}

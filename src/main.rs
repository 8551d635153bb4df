use std::process::ExitCode;

use clap::Parser;
use sluicegate::cli::{Cli, Command, init_tracing};
use sluicegate::{config, server};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(path) = &cli.config else {
        eprintln!("sluicegate: no configuration given; use -c FILE (see config.example.yaml)");
        return ExitCode::from(2);
    };
    let check = cli.command == Some(Command::Check);
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
        return ExitCode::SUCCESS;
    }
    init_tracing(&cli);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let server = match server::Server::bind(config).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("sluicegate: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Ok(addr) = server.local_addr() {
        tracing::info!(%addr, "listening");
    }
    server.run(server::shutdown_signal()).await;
    ExitCode::SUCCESS
}

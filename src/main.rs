use std::process::ExitCode;

use clap::Parser;
use sluicegate::cli::{Cli, Command, init_tracing};
use sluicegate::{config, server};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.command == Some(Command::Schema) {
        println!("{}", sluicegate::config::schema());
        return ExitCode::SUCCESS;
    }
    if let Some(Command::Simulate(args)) = &cli.command {
        return sluicegate::cli::simulate(&cli.config, args);
    }
    if let Some(Command::Import(args)) = &cli.command {
        return sluicegate::cli::import(args);
    }
    let default = std::path::PathBuf::from(sluicegate::cli::DEFAULT_CONFIG);
    let path = match &cli.config[..] {
        [path] => path,
        // Where the systemd unit keeps it.
        [] if default.exists() => &default,
        [] => {
            eprintln!(
                "sluicegate: no configuration: {} does not exist; give one with -c FILE (see config.example.yaml)",
                default.display()
            );
            return ExitCode::from(2);
        }
        [..] => {
            eprintln!("sluicegate: one configuration only (-c FILE); simulate alone compares two");
            return ExitCode::from(2);
        }
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
    // The configuration says how many threads serve, so the runtime comes after it.
    match server::runtime(config.workers) {
        Ok(runtime) => {
            let path = path.clone();
            runtime.block_on(run(cli, path, config))
        }
        Err(e) => {
            eprintln!("sluicegate: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, path: std::path::PathBuf, config: config::Config) -> ExitCode {
    match cli.command {
        Some(Command::Reload) => {
            return match sluicegate::cli::request_reload(&config).await {
                Ok(()) => {
                    println!("{}: reloaded", path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sluicegate: {}: reload failed: {e}", path.display());
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Check | Command::Run | Command::Schema | Command::Simulate(_) | Command::Import(_)) | None => {}
    }
    init_tracing(&cli);
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

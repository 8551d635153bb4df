//! The command line: `sluicegate [run] -c FILE`, `sluicegate check -c FILE`,
//! `sluicegate reload -c FILE`.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "sluicegate", version, about = "An HTTP reverse proxy with rate limiting built in")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The YAML configuration file (required by `run`, `check` and `reload`).
    // Not `required = true`: clap would then refuse `--help` and `--version` without it.
    #[arg(short, long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Least severe log level shown (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "info", value_name = "LEVEL")]
    pub log_level: tracing::Level,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, Subcommand, PartialEq, Eq)]
pub enum Command {
    /// Run the proxy (the default).
    Run,
    /// Validate the configuration, print every error, and exit (like `nginx -t`).
    Check,
    /// Validate the configuration, then have the running instance reload it through its
    /// admin listener (`admin.listen`; like `nginx -s reload`, or SIGHUP).
    Reload,
    /// Print the JSON Schema of the configuration file (for editors' YAML support).
    Schema,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sends log lines to stderr in the chosen format. Colours only on a terminal, and never
/// when `NO_COLOR` is set to anything non-empty (https://no-color.org): escape codes in a
/// file or a log collector are noise.
pub fn init_tracing(cli: &Cli) {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = std::io::stderr().is_terminal() && !no_color;
    let builder = tracing_subscriber::fmt().with_max_level(cli.log_level).with_writer(std::io::stderr).with_ansi(ansi);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

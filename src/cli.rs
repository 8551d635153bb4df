//! The command line: `sluicegate [run] -c FILE`, `sluicegate check -c FILE`,
//! `sluicegate reload -c FILE`, `sluicegate simulate -c FILE [-c NEW] LOG...`,
//! `sluicegate import [--out FILE] NGINX_CONF`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use http::StatusCode;

use crate::config::Config;
use crate::wire::http1::BodySource;
use crate::wire::http1::client::exchange;
use crate::wire::http1::parse::Framing;
use crate::wire::http1::write;
use crate::{import, simulate};

/// The configuration file `run`, `check` and `reload` read without `-c`: where the
/// systemd unit (`contrib/sluicegate.service`) keeps it.
pub const DEFAULT_CONFIG: &str = "/etc/sluicegate/config.yaml";

#[derive(Debug, Parser)]
#[command(name = "sluicegate", version, about = "An HTTP reverse proxy with rate limiting built in")]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `sluicegate [OPTIONS]` alone runs the proxy, as `sluicegate run [OPTIONS]`.
    #[command(flatten)]
    pub run: RunArgs,
}

/// What `run` takes: each subcommand has only the options it uses.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Least severe log level shown (error, warn, info, debug, trace).
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    pub log_level: tracing::Level,
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The configuration file of `run`, `check` and `reload`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ConfigArg {
    /// The YAML configuration file [default: /etc/sluicegate/config.yaml]
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Clone, Subcommand, PartialEq, Eq)]
pub enum Command {
    /// Run the proxy (the default).
    Run(RunArgs),
    /// Validate the configuration, print every error, and exit (like `nginx -t`).
    Check(ConfigArg),
    /// Validate the configuration, then have the running instance reload it through its
    /// admin listener (`admin.listen`; like `nginx -s reload`, or SIGHUP) and wait for the outcome.
    Reload(ConfigArg),
    /// Print the JSON Schema of the configuration file (for editors' YAML support).
    Schema,
    /// Replay access logs through the configuration's routes and limits on a virtual
    /// clock, and report what it would have passed, delayed and rejected (with two
    /// configurations, what changes between them).
    Simulate(SimulateArgs),
    /// Convert an nginx configuration (nginx.conf and the files it includes) into a
    /// sluicegate one, then check it. Exit status: 0 converted whole, 3 directives left
    /// out (listed on stderr), 4 written but refused by check, 1 nothing written.
    Import(ImportArgs),
}

#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ImportArgs {
    /// The nginx configuration file.
    #[arg(value_name = "NGINX_CONF")]
    pub nginx_conf: PathBuf,
    /// Write the YAML to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// nginx's prefix (`nginx -p`): a relative NGINX_CONF is taken in it.
    #[arg(short = 'p', long, value_name = "PREFIX")]
    pub prefix: Option<PathBuf>,
}

/// `sluicegate import`: the YAML on stdout or in `--out`, the report on stderr.
pub fn import(args: &ImportArgs) -> ExitCode {
    import::run(&import::Options {
        nginx_conf: args.nginx_conf.clone(),
        prefix: args.prefix.clone(),
        out: args.out.clone(),
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct SimulateArgs {
    /// The configuration to replay the logs through; a second one is compared with it.
    #[arg(short, long = "config", value_name = "FILE", required = true, action = ArgAction::Append)]
    pub configs: Vec<PathBuf>,
    /// Access logs to replay, merged by time (`-`: standard input).
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// A configuration to compare with the first (as a second `-c`).
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,
    /// How the logs are written: `json` (sluicegate's), `combined` (nginx's), or an nginx
    /// `log_format` string; told from the first lines when not given.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// The host of requests whose log lines name none (for routes that match on host).
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// How long after a later request a line may come and still be replayed in order.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub reorder_window: Duration,
    /// How many keys and seconds to list.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Draw admitted and rejected requests per second of each limit into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Write one JSON line per request (and configuration): route, outcome, wait, and
    /// the limit that refused it.
    #[arg(long, value_name = "FILE")]
    pub decisions: Option<PathBuf>,
}

/// `sluicegate simulate`: the report on stdout, errors on stderr.
pub fn simulate(args: &SimulateArgs) -> ExitCode {
    let mut configs = args.configs.clone();
    configs.extend(args.compare.clone());
    if configs.is_empty() {
        eprintln!("sluicegate: no configuration given; use -c FILE (and -c NEW to compare)");
        return ExitCode::from(2);
    }
    let options = simulate::Options {
        configs,
        logs: args.logs.clone(),
        format: args.format.clone(),
        host: args.host.clone(),
        reorder_window: args.reorder_window,
        top: args.top,
        plot: args.plot.clone(),
        decisions: args.decisions.clone(),
    };
    let output = match simulate::run(&options) {
        Ok(output) => output,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let text = if args.json { serde_json::to_string_pretty(&output).unwrap_or_default() + "\n" } else { output.text() };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sends log lines to stderr in the chosen format. Colours only on a terminal, and never
/// when `NO_COLOR` is set to anything non-empty (https://no-color.org): escape codes in a
/// file or a log collector are noise.
pub fn init_tracing(cli: &RunArgs) {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = std::io::stderr().is_terminal() && !no_color;
    let builder = tracing_subscriber::fmt().with_max_level(cli.log_level).with_writer(std::io::stderr).with_ansi(ansi);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// How long `sluicegate reload` waits for the running instance's answer.
const RELOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Asks the instance running `config`, read from `file`, to reload that file: `POST
/// /reload?file=FILE` on its admin listener, with its token, and waits for the outcome.
/// The client side of `sluicegate reload`: `Ok` names the file the instance reloaded;
/// `Err` says why the reload failed, or could not be asked for, or was refused (the
/// instance reads another file: both are named).
pub async fn request_reload(config: &Config, file: &Path) -> Result<String, String> {
    let admin = config.admin.as_ref().ok_or("the configuration has no admin listener (admin.listen)")?;
    tokio::time::timeout(RELOAD_WAIT, ask_reload(config, file))
        .await
        .unwrap_or_else(|_| Err(format!("{} did not answer within {}s", admin.listen, RELOAD_WAIT.as_secs())))
}

async fn ask_reload(config: &Config, file: &Path) -> Result<String, String> {
    let admin = config.admin.as_ref().ok_or("the configuration has no admin listener (admin.listen)")?;
    let mut stream =
        tokio::net::TcpStream::connect(admin.listen).await.map_err(|e| format!("{}: {e}", admin.listen))?;
    // Absolute, for the instance, which may run in another directory.
    let file = file.canonicalize().or_else(|_| std::path::absolute(file)).unwrap_or_else(|_| file.to_owned());
    let target: String =
        form_urlencoded::Serializer::new("/reload?".to_owned()).append_pair("file", &file.to_string_lossy()).finish();
    let mut head = Vec::with_capacity(128);
    let mut writer = write::Head::request(&mut head, &http::Method::POST, &target);
    writer.field(b"host", admin.listen.to_string().as_bytes());
    if let Some(token) = &admin.token {
        writer.field(b"authorization", format!("Bearer {token}").as_bytes());
    }
    writer.content_length(0);
    writer.end();
    let no_body: Option<&mut dyn BodySource> = None;
    let (result, _) = exchange(&mut stream, &head, no_body, Framing::Empty, &http::Method::POST, 64 * 1024).await;
    let (response, read) = result.map_err(|e| e.to_string())?;
    // The answer's body names the file reloaded, or says why not.
    let mut body = crate::wire::http1::client::ResponseBody::new(stream, &response, read);
    let mut why = Vec::new();
    while let Some(piece) = std::future::poll_fn(|cx| body.poll_data(cx)).await {
        why.extend_from_slice(&piece.map_err(|e| e.to_string())?);
    }
    let why = String::from_utf8_lossy(&why);
    match response.status {
        StatusCode::OK => Ok(why.trim_end().strip_prefix("reloaded ").unwrap_or(why.trim_end()).to_owned()),
        status => Err(format!("{} answered {status}: {}", admin.listen, why.trim_end())),
    }
}

//! The command line: `sluicegate [run] -c FILE`, `sluicegate check -c FILE`,
//! `sluicegate reload -c FILE`, `sluicegate simulate -c FILE [-c NEW] LOG...`,
//! `sluicegate import [--out FILE] NGINX_CONF`, `sluicegate explain -c FILE [-X M] [-H F]… URL`.

use std::io::{IsTerminal, Read as _, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use http::{Method, StatusCode};

use crate::clock::{Clock, ManualClock};
use crate::config::{self, Config};
use crate::explain::asked::Asked;
use crate::explain::{self, Explanation};
use crate::gate::Gate;
use crate::router::Scheme;
use crate::server;
use crate::simulate::synthetic::{self, Model, Spec};
use crate::wire::head::RequestHead;
use crate::wire::http1::client::exchange;
use crate::wire::http1::parse::{self, Framing, ParsedHead};
use crate::wire::http1::write;
use crate::wire::http1::{BodyError, BodySource};
use crate::{import, simulate, verify};

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

#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Put this configuration live beside the running one, as a candidate (in place of
    /// the one there was); it must sit in the running configuration's directory.
    #[arg(long, value_name = "FILE", conflicts_with = "drop_candidate")]
    pub candidate: Option<PathBuf>,
    /// Drop the live candidate, saying what it changed.
    #[arg(long)]
    pub drop_candidate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct CandidateArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print it as JSON (`GET /candidate`).
    #[arg(long)]
    pub json: bool,
    /// Keys listed each way.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// What `sluicegate reload --candidate`, `reload --drop-candidate`, `promote` and
/// `candidate` ask the running instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CandidateCall {
    Load(PathBuf),
    Drop,
    Promote,
    Show { json: bool, top: usize },
}

impl Command {
    /// The candidate call this command makes, if it makes one.
    pub fn candidate_call(&self) -> Option<CandidateCall> {
        match self {
            Command::Reload(ReloadArgs { candidate: Some(file), .. }) => Some(CandidateCall::Load(file.clone())),
            Command::Reload(ReloadArgs { drop_candidate: true, .. }) => Some(CandidateCall::Drop),
            Command::Promote(_) => Some(CandidateCall::Promote),
            Command::Candidate(args) => Some(CandidateCall::Show { json: args.json, top: args.top }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Subcommand, PartialEq, Eq)]
pub enum Command {
    /// Run the proxy (the default).
    Run(RunArgs),
    /// Validate the configuration, print every error, and exit (like `nginx -t`).
    Check(ConfigArg),
    /// Validate the configuration, then have the running instance reload it through its
    /// admin listener (`admin.listen`; like `nginx -s reload`, or SIGHUP) and wait for the
    /// outcome; with `--candidate FILE`, put FILE live beside it instead (every request
    /// decided by both, only the running one acting).
    Reload(ReloadArgs),
    /// Make the live candidate the running configuration (refused if its file or the
    /// instance's changed since it was loaded), as a reload does.
    Promote(ConfigArg),
    /// Say what the live candidate changed since it was loaded, in the shape of
    /// `simulate`'s comparison.
    Candidate(CandidateArgs),
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
    /// Explain how the configuration answers one request, given as curl takes it: the
    /// route and why earlier ones did not match, the client address, each limit's key
    /// and decision, and the answer with its status, wait and rate-limit fields.
    Explain(ExplainArgs),
    /// Check a real run against the synthetic model: `--snapshot FILE` before the load
    /// saves `/metrics`; `--since FILE --synthetic SPEC` after it compares what the run
    /// admitted and refused, per route and limit, with what `simulate --synthetic`
    /// predicts for a run of its length and requests, each count with its noise. Exit
    /// status: 0 every count within its noise, 1 some outside it, 2 when it cannot tell.
    Verify(VerifyArgs),
}

#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["snapshot", "since"])))]
pub struct VerifyArgs {
    /// The configuration the instance runs (its admin listener and token; its routes and
    /// limits for the model).
    #[arg(short, long = "config", value_name = "FILE", required = true)]
    pub config: PathBuf,
    /// Where `/metrics` is read [default: http://ADMIN.LISTEN/metrics, from the file].
    #[arg(long, value_name = "URL")]
    pub metrics: Option<String>,
    /// Before the run: save `/metrics` and the time to FILE.
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,
    /// After the run: compare it with the snapshot FILE taken before it.
    #[arg(long, value_name = "FILE", requires = "synthetic")]
    pub since: Option<PathBuf>,
    /// The end of the run: a snapshot FILE taken after it, rather than `/metrics` now (to
    /// check a saved run again, against another configuration say).
    #[arg(long, value_name = "FILE", requires = "since")]
    pub until: Option<PathBuf>,
    /// The load that ran, as `simulate --synthetic` takes it; its duration is the run's,
    /// and an open loop's rate the run's.
    #[arg(long, value_name = "SPEC", conflicts_with = "snapshot")]
    pub synthetic: Option<String>,
    /// How long the load ran (wrk's -d) [default: the span between the scrapes].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, conflicts_with = "snapshot")]
    pub duration: Option<Duration>,
    /// Print the verdict as JSON.
    #[arg(long, conflicts_with = "snapshot")]
    pub json: bool,
}

/// `sluicegate verify`: the snapshot saved, or the verdict on stdout; exit 0 within the
/// noise, 1 outside it, 2 when it cannot tell.
pub fn verify(args: &VerifyArgs) -> ExitCode {
    match verify_run(args) {
        Ok(within) => ExitCode::from(u8::from(!within)),
        Err(e) => {
            eprintln!("sluicegate: verify: {e}");
            ExitCode::from(2)
        }
    }
}

fn verify_run(args: &VerifyArgs) -> Result<bool, String> {
    let config = load_config(&args.config).ok_or_else(|| "the configuration cannot be used".to_owned())?;
    let scraped = match &args.until {
        Some(path) => verify::Snapshot::read(path).map_err(|e| e.to_string())?,
        None => scrape(&config, args.metrics.as_deref())?,
    };
    if let Some(path) = &args.snapshot {
        scraped.write(path).map_err(|e| e.to_string())?;
        println!("{}: /metrics saved; run the load, then verify --since {0}", path.display());
        return Ok(true);
    }
    let (Some(since), Some(spec)) = (&args.since, &args.synthetic) else {
        return Err("give --snapshot FILE before the run, or --since FILE --synthetic SPEC after it".to_owned());
    };
    let before = verify::Snapshot::read(since).map_err(|e| e.to_string())?;
    let spec = Spec::parse(spec).map_err(|e| e.to_string())?;
    let mut model = Model::new(config, args.config.display().to_string(), spec);
    let verdict = verify::verify(&mut model, &before, &scraped, args.duration).map_err(|e| e.to_string())?;
    let text =
        if args.json { serde_json::to_string_pretty(&verdict).unwrap_or_default() + "\n" } else { verdict.text() };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(verdict.within)
}

/// `/metrics` of the instance running `config`, at `url` (default: its admin listener),
/// with its admin token, and the instant it was read.
fn scrape(config: &Config, url: Option<&str>) -> Result<verify::Snapshot, String> {
    let token = config.admin.as_ref().and_then(|a| a.token.clone());
    let (addr, target) = match url {
        None => {
            let admin = config
                .admin
                .as_ref()
                .ok_or("the configuration has no admin listener (admin.listen); give --metrics URL")?;
            (admin.listen, "/metrics".to_owned())
        }
        Some(url) => {
            let bad = || format!("--metrics {url:?}: give http://HOST:PORT/metrics");
            let uri: http::Uri = url.parse().map_err(|_| bad())?;
            let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority()) else { return Err(bad()) };
            let port = authority.port_u16().unwrap_or(80);
            let addr = std::net::ToSocketAddrs::to_socket_addrs(&(authority.host(), port))
                .map_err(|e| format!("--metrics {url:?}: {e}"))?
                .next()
                .ok_or_else(bad)?;
            (addr, uri.path_and_query().map_or("/metrics", |p| p.as_str()).to_owned())
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let call = admin_call(addr, token.as_deref(), &Method::GET, &target, None);
    let (status, metrics) = runtime
        .block_on(async { tokio::time::timeout(ADMIN_WAIT, call).await })
        .map_err(|_| format!("{addr} did not answer within {}s", ADMIN_WAIT.as_secs()))??;
    if status != StatusCode::OK {
        return Err(format!("{addr}{target} answered {status}: {}", metrics.trim_end()));
    }
    Ok(verify::Snapshot { taken_at: Clock::System.now().0, metrics })
}

#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ExplainArgs {
    /// The configuration file.
    #[arg(short, long = "config", value_name = "FILE", required = true)]
    pub config: PathBuf,
    /// The request's method (curl's `-X`) [default: GET].
    #[arg(short = 'X', long = "request", value_name = "METHOD", conflicts_with = "log_line")]
    pub method: Option<String>,
    /// A header field, `'Name: value'` (curl's `-H`); repeat it for more. With
    /// `--log-line`, a field the line does not carry (it replaces one of the same name).
    #[arg(short = 'H', long = "header", value_name = "'NAME: VALUE'", action = ArgAction::Append)]
    pub headers: Vec<String>,
    /// The request's body (curl's `-d`; `@FILE` reads it from a file), for a route whose
    /// limits read its JSON fields (`json:` key parts).
    #[arg(short = 'd', long = "data", value_name = "BODY", conflicts_with = "log_line")]
    pub data: Option<String>,
    /// The address the request comes from, its TCP peer [default: 127.0.0.1].
    #[arg(long, value_name = "IP", conflicts_with = "log_line")]
    pub peer: Option<IpAddr>,
    /// Decide this many identical requests first (at the same instant), from an empty state.
    #[arg(long, value_name = "N", default_value_t = 0, conflicts_with = "admin")]
    pub after: u64,
    /// Decide against the running instance's state, through its admin listener (this
    /// address, or the file's `admin.listen`), with the file's `admin.token`; nothing is spent.
    #[arg(long, value_name = "ADDRESS", num_args = 0..=1, default_missing_value = "")]
    pub admin: Option<String>,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
    /// Explain the request an access-log line records (its client, method, target, and
    /// the fields it carries), instead of a URL.
    #[arg(long, value_name = "LINE", conflicts_with = "url")]
    pub log_line: Option<String>,
    /// The log line's format, as `simulate --format` takes it: `json`, `combined`, or an
    /// nginx `log_format` string [default: told from the line].
    #[arg(long, value_name = "F", requires = "log_line")]
    pub format: Option<String>,
    /// `http://HOST[:PORT]/PATH?QUERY` (its host is sent as `Host`, as curl does), or `-`:
    /// one raw HTTP/1.1 request head on standard input, read as the proxy reads one.
    #[arg(value_name = "URL", required_unless_present_any = ["log_line", "admin"])]
    pub url: Option<String>,
}

impl ExplainArgs {
    /// `--admin` takes an optional address, so in `--admin http://host/api/x` it takes the
    /// request's URL: given back to the URL when nothing else is, and the address is then
    /// the file's `admin.listen`. An error when no URL is left.
    fn settled(&self) -> Result<std::borrow::Cow<'_, ExplainArgs>, String> {
        if self.url.is_some() || self.log_line.is_some() {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let admin = self.admin.as_deref().unwrap_or_default();
        let path = admin.strip_prefix("http://").or_else(|| admin.strip_prefix("https://")).map(|rest| rest.find('/'));
        let is_request = admin == "-" || admin.starts_with('/') || path.is_some_and(|slash| slash.is_some());
        if !is_request {
            return Err(format!(
                "give the request's URL (after --admin {admin:?}, the address of the instance to ask; \
                 --admin=ADDRESS keeps the two apart)"
            ));
        }
        let mut settled = self.clone();
        settled.url = settled.admin.replace(String::new());
        Ok(std::borrow::Cow::Owned(settled))
    }
}

/// The request to explain, as given: curl's spelling, an access-log line, or a raw head.
enum Given {
    Curl(explain::asked::Request),
    Logged(Box<simulate::format::Logged>),
    Raw(ParsedHead),
}

impl Given {
    /// Reads the request `args` give (from standard input for `-`), with what the
    /// explanation should say of how it was read; an error says why it cannot be read.
    fn read(args: &ExplainArgs, config: &Config) -> Result<(Given, Vec<String>), String> {
        if let Some(line) = &args.log_line {
            return logged(line, args.format.as_deref(), &args.headers).map(|(l, notes)| (Given::Logged(l), notes));
        }
        let url = args.url.as_deref().unwrap_or_default();
        if url == "-" {
            if args.method.is_some() || !args.headers.is_empty() {
                return Err("a request on standard input is given whole: put its method and fields in it".to_owned());
            }
            let mut read = Vec::new();
            // One byte past the most the proxy reads of a head: a head it refuses as too
            // large is refused here too, with its status.
            let most = u64::from(server::head_limits(config).head) + 1;
            std::io::Read::take(std::io::stdin().lock(), most)
                .read_to_end(&mut read)
                .map_err(|e| format!("cannot read standard input: {e}"))?;
            return raw_head(config, read).map(|head| (Given::Raw(head), Vec::new()));
        }
        // As curl, a body makes a POST.
        let method = args.method.as_deref().unwrap_or(if args.data.is_some() { "POST" } else { "GET" });
        let mut asked = Asked::from_curl(method, &args.headers, url, args.peer).map_err(|e| e.to_string())?;
        asked.body = data(args)?;
        asked.request().map(|r| (Given::Curl(r), Vec::new())).map_err(|e| e.to_string())
    }

    /// Its head, as the front reads it, the address it came from and how it came in (a
    /// raw head: `http`).
    fn head(&self) -> (RequestHead<'_>, IpAddr, Scheme) {
        match self {
            Given::Curl(request) => (request.head(), request.peer, request.scheme),
            Given::Logged(logged) => (logged.head(), logged.client, logged.scheme),
            Given::Raw(head) => (head.view(), explain::asked::DEFAULT_PEER, Scheme::Http),
        }
    }
}

/// The body `--data` gives: as it is, or the file `@FILE` names (as text).
fn data(args: &ExplainArgs) -> Result<Option<String>, String> {
    match args.data.as_deref() {
        Some(path) if path.starts_with('@') => std::fs::read_to_string(&path[1..])
            .map(Some)
            .map_err(|e| format!("--data {path}: cannot read {}: {e}", &path[1..])),
        given => Ok(given.map(str::to_owned)),
    }
}

/// The request an access-log `line` records (in `format`, else told from the line), with
/// `headers` (`'Name: value'`) in place of those of the same names, and the notes that
/// say what a line cannot carry.
fn logged(
    line: &str,
    format: Option<&str>,
    headers: &[String],
) -> Result<(Box<simulate::format::Logged>, Vec<String>), String> {
    use simulate::format::{Format, Read, TimeCache};
    let format = match format {
        Some(name) => Format::named(name).map_err(|e| e.to_string())?,
        None => Format::detect([line]).ok_or(
            "cannot tell the line's format: give --format json, --format combined, or the nginx log_format string",
        )?,
    };
    let mut logged = match format.read(line, &mut TimeCache::default()) {
        Ok(Read::Request(logged)) => logged,
        Ok(_) => return Err("the line records no request".to_owned()),
        Err(e) => return Err(format!("the line is no {} line: {e}", format.name())),
    };
    let given = Asked::from_curl("GET", headers, "/", None).and_then(|a| a.request()).map_err(|e| e.to_string())?;
    for name in given.headers.keys() {
        logged.headers.remove(name);
    }
    logged.headers.extend(given.headers);
    let carried = format.carried();
    let mut fields: Vec<String> = carried.headers.iter().map(ToString::to_string).collect();
    fields.extend(carried.cookies.iter().map(|c| format!("cookie {c}")));
    if carried.host {
        fields.push("host".to_owned());
    }
    if carried.recorded_keys {
        fields.push("the key parts its limits read, where the line records them (keys)".to_owned());
    }
    let mut notes = vec![format!(
        "from an access-log line ({}): the client is the address it logged, trusted_proxies already applied; \
         of the header fields it carries only {}: every other field (Host included, unless it carries it) is taken \
         as absent: add one with -H 'Name: value'",
        format.name(),
        if fields.is_empty() { "none".to_owned() } else { fields.join(", ") },
    )];
    if let Some(status) = logged.status {
        notes.push(format!("the line says it was answered {status}"));
    }
    Ok((logged, notes))
}

/// The request head in `read` (standard input), parsed as the proxy parses one with
/// `config`'s limits: one the proxy refuses is an error saying what it answers.
fn raw_head(config: &Config, read: Vec<u8>) -> Result<ParsedHead, String> {
    let limits = server::head_limits(config);
    match parse::request(&read, limits.line as usize, limits.head as usize) {
        Ok(Some(parsed)) => {
            let mut bytes = Bytes::from(read);
            Ok(ParsedHead::new(bytes.split_to(parsed.len), parsed))
        }
        Ok(None) => Err(format!(
            "the request head on standard input ends before its blank line ({} bytes read): end each line with \\r\\n \
             and the head with an empty line",
            read.len()
        )),
        Err(e) => {
            let status = e.status();
            Err(format!("the proxy answers {} {}: {e}", status.as_u16(), status.canonical_reason().unwrap_or_default()))
        }
    }
}

/// `sluicegate explain`: the explanation on stdout; exit 0 once explained, 1 when the
/// configuration or the instance fails, 2 for a request that HTTP cannot carry (or a
/// log line that cannot be read, a raw head the proxy refuses).
pub fn explain(args: &ExplainArgs) -> ExitCode {
    let args = match args.settled() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("sluicegate: explain: {e}");
            return ExitCode::from(2);
        }
    };
    let args = args.as_ref();
    let Some(config) = load_config(&args.config) else { return ExitCode::FAILURE };
    let (given, notes) = match Given::read(args, &config) {
        Ok(given) => given,
        Err(e) => {
            eprintln!("sluicegate: explain: {e}");
            return ExitCode::from(2);
        }
    };
    let (head, peer, scheme) = given.head();
    let logged = matches!(given, Given::Logged(_));
    let claimed = match &given {
        Given::Logged(line) => crate::front::Claimed::Logged(line.claims.as_ref()),
        _ => crate::front::Claimed::Explained,
    };
    let body = match &given {
        Given::Curl(request) => request.body.as_deref(),
        Given::Logged(line) => line.body.as_deref(),
        Given::Raw(_) => None,
    };
    let explained = match &args.admin {
        None => {
            let (config, local) = explain::local(config);
            // A clock of its own: the identical requests and this one at one instant.
            let gate = Gate::new(&config, ManualClock::new(Clock::System.now()).into());
            let mut explained =
                explain::explain(&config, &gate, None, &head, peer, scheme, claimed, body, args.after, "empty");
            explained.notes.extend(local);
            Ok(explained)
        }
        Some(admin) => match Asked::from_head(&head, peer, scheme, logged) {
            Ok(mut asked) => {
                asked.body = body.map(|b| String::from_utf8_lossy(b).into_owned());
                ask_explain(&config, admin, &asked)
            }
            Err(e) => {
                eprintln!("sluicegate: explain: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut explained = match explained {
        Ok(explained) => explained,
        Err(e) => {
            eprintln!("sluicegate: explain: {e}");
            return ExitCode::FAILURE;
        }
    };
    explained.notes.extend(notes);
    if let Ok(src) = std::fs::read_to_string(&args.config) {
        explained.locate(&src);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&explained).unwrap_or_default() + "\n"
    } else {
        explained.to_string()
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

/// `POST /explain` of `asked` to the admin listener `admin` (empty: the configuration's
/// `admin.listen`), with the configuration's token.
fn ask_explain(config: &Config, admin: &str, asked: &Asked) -> Result<Explanation, String> {
    let token = config.admin.as_ref().and_then(|a| a.token.clone());
    let addr = match admin.trim_start_matches("http://").trim_end_matches('/') {
        "" => config
            .admin
            .as_ref()
            .map(|a| a.listen)
            .ok_or("the configuration has no admin listener (admin.listen); give --admin ADDRESS")?,
        given => {
            given.parse::<SocketAddr>().map_err(|_| format!("--admin {admin:?}: give IP:PORT, as admin.listen"))?
        }
    };
    let body = Bytes::from(serde_json::to_vec(asked).map_err(|e| e.to_string())?);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let call = admin_call(addr, token.as_deref(), &Method::POST, "/explain", Some(body));
    let (status, answer) = runtime
        .block_on(async { tokio::time::timeout(ADMIN_WAIT, call).await })
        .map_err(|_| format!("{addr} did not answer within {}s", ADMIN_WAIT.as_secs()))??;
    if status != StatusCode::OK {
        return Err(format!("{addr} answered {status}: {}", answer.trim_end()));
    }
    serde_json::from_str(&answer).map_err(|e| format!("{addr} answered what is no explanation: {e}"))
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
#[command(group(clap::ArgGroup::new("input").required(true).args(["logs", "synthetic"])))]
pub struct SimulateArgs {
    /// The configuration to replay the logs through; a second one is compared with it.
    #[arg(short, long = "config", value_name = "FILE", required = true, action = ArgAction::Append)]
    pub configs: Vec<PathBuf>,
    /// Access logs to replay, merged by time (`-`: standard input).
    #[arg(value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// Predict what a load tool such as wrk will see, instead of replaying logs: a load
    /// spec, `'connections=64 rate=max duration=10s keys=ip:8 path=/api/x'`.
    ///
    /// Fields (NAME=VALUE, separated by spaces; defaults in brackets): connections [64];
    /// rate [max]: `max` for a closed loop, or N (or `Nr/s`, `Nr/m`) for an open loop of N
    /// requests a second in all; duration [10s]; keys [ip:1]: `ip:N`, N client addresses
    /// 127.0.0.1 upwards, connection i using address i mod N, or `header:NAME:N`, N values
    /// `key-0`… of the header, connection i sending value i mod N; path [/]; method [GET];
    /// host; header=NAME:VALUE (repeatable); latency [1ms]: the backend's service time;
    /// turnaround [100us]: what one exchange takes on the machine, apart from the backend.
    ///
    /// The model: closed loop (rate=max, as wrk): each connection sends its next request
    /// when its answer arrives, a refusal after the turnaround, an admitted request after
    /// the turnaround, its delay and the latency. Open loop (rate=N, as wrk2 -R): requests
    /// leave on schedule whatever the answers. Requests are decided on a virtual clock by
    /// the proxy's own routing, keys and limits, every key fresh at the start. Exact
    /// whatever the machine: what each key held back by a limit is admitted, and the
    /// delays. Depends on the machine's speed, in a closed loop: how many requests are sent,
    /// so how many are refused (printed at the turnaround given; `sluicegate verify`
    /// measures it on a real run).
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["logs", "compare", "format", "host", "plot", "decisions"])]
    pub synthetic: Option<String>,
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
    if let Some(spec) = &args.synthetic {
        return synthetic(args, spec);
    }
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

/// `sluicegate simulate --synthetic SPEC -c FILE`: the prediction on stdout; exit 1 when
/// the configuration fails, 2 for a spec that cannot be read.
fn synthetic(args: &SimulateArgs, spec: &str) -> ExitCode {
    let [path] = &args.configs[..] else {
        eprintln!("sluicegate: simulate --synthetic takes one configuration (-c FILE)");
        return ExitCode::from(2);
    };
    let spec = match Spec::parse(spec) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("sluicegate: simulate {e}");
            return ExitCode::from(2);
        }
    };
    let Some(config) = load_config(path) else { return ExitCode::FAILURE };
    let prediction = Model::new(config, path.display().to_string(), spec).run(synthetic::START);
    let text = if args.json {
        serde_json::to_string_pretty(&prediction).unwrap_or_default() + "\n"
    } else {
        prediction.text()
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

/// The configuration at `path`, or `None` once what is wrong with it is on stderr.
fn load_config(path: &Path) -> Option<Config> {
    match config::load(path) {
        Ok(config) => Some(config),
        Err(e @ config::LoadError::Read { .. }) => {
            eprintln!("{e}");
            None
        }
        Err(e) => {
            eprintln!("{e}\n{}: configuration is invalid", path.display());
            None
        }
    }
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
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// How long `sluicegate explain --admin` waits for the running instance's answer.
const ADMIN_WAIT: Duration = Duration::from_secs(10);

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
    // Absolute, for the instance, which may run in another directory.
    let file = file.canonicalize().or_else(|_| std::path::absolute(file)).unwrap_or_else(|_| file.to_owned());
    let target: String =
        form_urlencoded::Serializer::new("/reload?".to_owned()).append_pair("file", &file.to_string_lossy()).finish();
    // The answer's body names the file reloaded, or says why not.
    let (status, why) = admin_call(admin.listen, admin.token.as_deref(), &Method::POST, &target, None).await?;
    match status {
        StatusCode::OK => Ok(why.trim_end().strip_prefix("reloaded ").unwrap_or(why.trim_end()).to_owned()),
        status => Err(format!("{} answered {status}: {}", admin.listen, why.trim_end())),
    }
}

/// Makes `call` to the instance running `config`: prints its answer, or why it failed.
/// A candidate is checked here first, as `check` checks a file (every error with its
/// position), before the instance is asked to read it.
pub async fn candidate(config: &Config, call: CandidateCall) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Some(admin) = config.admin.as_ref() else {
        eprintln!("sluicegate: the configuration has no admin listener (admin.listen)");
        return ExitCode::FAILURE;
    };
    let (method, target) = match &call {
        CandidateCall::Load(file) => {
            match crate::config::check(file) {
                Ok(candidate) => candidate.warnings.iter().for_each(|w| eprintln!("warning: {w}")),
                Err(e) => {
                    eprintln!("{e}");
                    eprintln!("{}: the candidate is invalid", file.display());
                    return ExitCode::FAILURE;
                }
            }
            let file = file.canonicalize().or_else(|_| std::path::absolute(file)).unwrap_or_else(|_| file.clone());
            let target = form_urlencoded::Serializer::new("/candidate?".to_owned())
                .append_pair("file", &file.to_string_lossy())
                .finish();
            (Method::POST, target)
        }
        CandidateCall::Drop => (Method::DELETE, "/candidate".to_owned()),
        CandidateCall::Promote => (Method::POST, "/candidate/promote".to_owned()),
        CandidateCall::Show { json, top } => {
            (Method::GET, format!("/candidate?top={top}{}", if *json { "" } else { "&format=text" }))
        }
    };
    let asked = admin_call(admin.listen, admin.token.as_deref(), &method, &target, None);
    match tokio::time::timeout(RELOAD_WAIT, asked).await {
        Ok(Ok((status, body))) if status.is_success() => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Ok(Ok((status, body))) => {
            eprintln!("sluicegate: {} answered {status}: {}", admin.listen, body.trim_end());
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("sluicegate: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("sluicegate: {} did not answer within {}s", admin.listen, RELOAD_WAIT.as_secs());
            ExitCode::FAILURE
        }
    }
}

/// One call to the admin listener at `addr` (with `token`, if any): `method` on
/// `target`, with a JSON `body` if given; returns the answer's status and body.
async fn admin_call(
    addr: SocketAddr,
    token: Option<&str>,
    method: &Method,
    target: &str,
    body: Option<Bytes>,
) -> Result<(StatusCode, String), String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("{addr}: {e}"))?;
    let mut head = Vec::with_capacity(128);
    let mut writer = write::Head::request(&mut head, method, target);
    writer.field(b"host", addr.to_string().as_bytes());
    if let Some(token) = token {
        writer.field(b"authorization", format!("Bearer {token}").as_bytes());
    }
    let length = body.as_ref().map_or(0, Bytes::len);
    if body.is_some() {
        writer.field(b"content-type", b"application/json");
    }
    writer.content_length(length as u64);
    writer.end();
    let framing = if length == 0 { Framing::Empty } else { Framing::Length(length as u64) };
    let mut whole = Whole(body);
    let (result, _) = exchange(&mut stream, head, Some(&mut whole), framing, method, 64 * 1024).await;
    let (response, read) = result.map_err(|e| e.to_string())?;
    let mut body = crate::wire::http1::client::ResponseBody::new(stream, &response, read);
    let mut answer = Vec::new();
    while let Some(piece) = std::future::poll_fn(|cx| body.poll_data(cx)).await {
        answer.extend_from_slice(&piece.map_err(|e| e.to_string())?);
    }
    Ok((response.status, String::from_utf8_lossy(&answer).into_owned()))
}

/// A request body held whole, sent in one piece.
struct Whole(Option<Bytes>);

impl BodySource for Whole {
    fn poll_chunk(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        Poll::Ready(self.0.take().map(Ok))
    }
}

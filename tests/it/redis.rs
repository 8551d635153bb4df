//! Real `redis-server` processes for tests: a single server or a small cluster, each on
//! free ports on 127.0.0.1, with no persistence, talked to through a tiny RESP client.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::block_until;

const MISSING_SERVER: &str = "redis-server is missing: apt-get install -y redis-server (see README.md)";
const MISSING_CLI: &str = "redis-cli is missing: apt-get install -y redis-server (see README.md)";

/// How often a start is tried before giving up (a picked port can be taken meanwhile).
const START_ATTEMPTS: usize = 5;

/// A `redis-server` child process; killed on drop.
pub struct Redis {
    pub port: u16,
    /// The TLS port of a server started with `start_tls` (0 otherwise).
    pub tls_port: u16,
    /// A configuration file, given first (a sentinel's, which it rewrites).
    config_file: Option<PathBuf>,
    /// Arguments after the common ones (cluster settings).
    extra_args: Vec<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Redis {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> Redis {
        Redis::start_on_free_ports(false, None)
    }

    /// Starts a server that also serves TLS on `tls_port`, with the certificate
    /// `server.pem` and key `server.key` from `certs`.
    pub fn start_tls(certs: &std::path::Path) -> Redis {
        Redis::start_on_free_ports(false, Some(certs))
    }

    /// Starts a server, picking new ports if the process exits before it is ready.
    fn start_on_free_ports(cluster: bool, tls: Option<&std::path::Path>) -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let mut redis = Redis { port: 0, tls_port: 0, config_file: None, extra_args: Vec::new(), child: None, dir };
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let ports = free_ports(2);
            redis.port = ports[0];
            if cluster {
                // An explicit bus port: the default (port + 10000) may be taken or above 65535.
                let bus_port = ports[1].to_string();
                redis.extra_args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                    .into_iter()
                    .chain(["--cluster-port", &bus_port])
                    .map(String::from)
                    .collect();
            }
            if let Some(certs) = tls {
                redis.tls_port = ports[1];
                let file = |name: &str| certs.join(name).display().to_string();
                redis.extra_args = vec![
                    "--tls-port".into(),
                    ports[1].to_string(),
                    "--tls-cert-file".into(),
                    file("server.pem"),
                    "--tls-key-file".into(),
                    file("server.key"),
                    "--tls-auth-clients".into(),
                    "no".into(),
                ];
            }
            match redis.spawn_and_wait() {
                Ok(()) => return redis,
                Err(failure) => failures.push(failure),
            }
        }
        panic!("redis-server did not start in {START_ATTEMPTS} attempts:\n{}", failures.join("\n"));
    }

    /// Starts a sentinel on a free port that monitors `master` as `name`, alone (quorum
    /// 1): a master silent for one second is down, and its replica (if it has one) is made
    /// master.
    pub fn start_sentinel(name: &str, master: &Redis) -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("sentinel.conf");
        let text = format!(
            "sentinel monitor {name} 127.0.0.1 {port} 1\nsentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 10000\n",
            port = master.port
        );
        std::fs::write(&config, text).unwrap();
        let mut sentinel = Redis {
            port: 0,
            tls_port: 0,
            config_file: Some(config),
            extra_args: vec!["--sentinel".into()],
            child: None,
            dir,
        };
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            sentinel.port = free_ports(1)[0];
            match sentinel.spawn_and_wait() {
                Ok(()) => return sentinel,
                Err(failure) => failures.push(failure),
            }
        }
        panic!("redis-server --sentinel did not start in {START_ATTEMPTS} attempts:\n{}", failures.join("\n"));
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the process with SIGKILL and waits for it to exit. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process if it runs, starts it again on the same port (same directory and
    /// arguments), and waits until it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(failure) => failures.push(failure),
            }
            // The port can still be held by a socket of the killed process for a moment.
            sleep(Duration::from_millis(200));
        }
        panic!("redis-server did not restart on port {}:\n{}", self.port, failures.join("\n"));
    }

    /// Freezes the process (SIGSTOP): connections are accepted but nothing is answered.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Runs one command on a new connection and returns the reply as text (see `read_reply`).
    /// Redis errors come back as their text; I/O errors panic.
    pub fn command(&self, args: &[&str]) -> String {
        run_command(self.port, args, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("redis command {args:?} on port {} failed: {e}", self.port))
    }

    fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("redis-server is not running").id();
        let status = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().unwrap();
        assert!(status.success(), "kill -{name} {pid} failed: {status}");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The last lines of the server's log, for failure messages.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Spawns the process; Err if it exits before it is ready (say, the port is taken).
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let spawned = Command::new("redis-server")
            .args(&self.config_file)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Err(e) if e.kind() == io::ErrorKind::NotFound => panic!("{MISSING_SERVER}"),
            spawned => spawned.unwrap(),
        };
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Polls until this very process (not another one on the port) answers PING: at most 10 s.
    fn wait_until_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = self.child.as_ref().unwrap().id();
        let our_pid = format!("process_id:{pid}\r\n");
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("redis-server on port {} exited ({status}); log:\n{}", self.port, self.log_tail()));
            }
            if answers_ping(self.port)
                && run_command(self.port, &["INFO", "server"], Duration::from_secs(1))
                    .is_ok_and(|i| i.contains(&our_pid))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                panic!("redis-server on port {} did not answer PING within 10 s; log:\n{}", self.port, self.log_tail());
            }
            sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis cluster of masters only, one `Redis` per node, all slots assigned.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    /// Starts `n` (at least 3) nodes, joins them with `redis-cli --cluster create`, and waits
    /// until every node reports `cluster_state:ok`.
    pub fn start(n: usize) -> Cluster {
        assert!(n >= 3, "a Redis cluster needs at least 3 masters, got {n}");
        let nodes: Vec<Redis> = (0..n).map(|_| Redis::start_on_free_ports(true, None)).collect();
        let cluster = Cluster { nodes };
        cluster.create();
        for node in &cluster.nodes {
            block_until(&format!("cluster_state:ok on port {}", node.port), Duration::from_secs(20), || {
                node.command(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
        }
        cluster
    }

    /// Runs `redis-cli --cluster create` over all nodes: at most 20 s.
    fn create(&self) {
        let output_path = self.nodes[0].dir.path().join("cluster-create.log");
        let output = File::create(&output_path).unwrap();
        let spawned = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn();
        let mut cli = match spawned {
            Err(e) if e.kind() == io::ErrorKind::NotFound => panic!("{MISSING_CLI}"),
            spawned => spawned.unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = cli.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = cli.kill();
                let _ = cli.wait();
                break None;
            }
            sleep(Duration::from_millis(20));
        };
        if !status.is_some_and(|s| s.success()) {
            let output = std::fs::read_to_string(&output_path).unwrap_or_default();
            panic!("redis-cli --cluster create failed or took over 20 s ({status:?}):\n{output}");
        }
    }

    /// The first node's URL.
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Redis::url).collect()
    }
}

/// `n` distinct ports that were free a moment ago (bound together, then released).
/// `n` free ports below Linux's ephemeral range (32768 and up): a port there is never
/// given to an outgoing connection as its local port, so a killed server's port is still
/// free for its restart (a port from the ephemeral range was once taken meanwhile, under
/// load: `Address already in use`).
fn free_ports(n: usize) -> Vec<u16> {
    let mut listeners = Vec::new();
    while listeners.len() < n {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", fastrand::u16(10_000..32_000))) {
            listeners.push(listener);
        }
    }
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn connect(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// Whether the server on `port` answers PING with `+PONG` within a second.
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = connect(port, Duration::from_secs(1)) else { return false };
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut line = Vec::new();
    BufReader::new(stream).read_until(b'\n', &mut line).is_ok() && line == b"+PONG\r\n"
}

/// Sends `args` as a RESP array of bulk strings on a new connection and reads one reply.
fn run_command(port: u16, args: &[&str], timeout: Duration) -> io::Result<String> {
    let mut stream = connect(port, timeout)?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    read_reply(&mut BufReader::new(stream))
}

/// Reads one RESP2 reply as text: simple strings and errors as their text, integers in
/// decimal, bulk strings as their content, arrays as their elements (read the same way,
/// nested arrays included) joined by newlines, and nil as the empty string.
fn read_reply(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    let Some(header) = line.strip_suffix(b"\r\n").filter(|h| !h.is_empty()) else {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("bad reply line {line:?}")));
    };
    let text = String::from_utf8_lossy(&header[1..]).into_owned();
    let length = || text.parse::<i64>().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, text.clone()));
    match header[0] {
        b'+' | b'-' | b':' => Ok(text),
        b'$' => {
            let Ok(len) = usize::try_from(length()?) else { return Ok(String::new()) };
            let mut content = vec![0; len + 2];
            reader.read_exact(&mut content)?;
            content.truncate(len);
            Ok(String::from_utf8_lossy(&content).into_owned())
        }
        b'*' => {
            let Ok(count) = usize::try_from(length()?) else { return Ok(String::new()) };
            let elements = (0..count).map(|_| read_reply(reader)).collect::<io::Result<Vec<_>>>()?;
            Ok(elements.join("\n"))
        }
        other => Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown reply type {:?}", other as char))),
    }
}

#[test]
fn redis_starts_answers_and_restarts() {
    let mut redis = Redis::start();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port));
    assert_eq!(redis.command(&["SET", "greeting", "hello\r\nworld"]), "OK");
    assert_eq!(redis.command(&["GET", "greeting"]), "hello\r\nworld");
    assert_eq!(redis.command(&["INCRBY", "counter", "-3"]), "-3");
    assert_eq!(redis.command(&["GET", "missing"]), "");
    assert_eq!(redis.command(&["RPUSH", "list", "a", "b"]), "2");
    assert_eq!(redis.command(&["LRANGE", "list", "0", "-1"]), "a\nb");
    assert!(redis.command(&["NOSUCHCOMMAND"]).starts_with("ERR unknown command"));

    // A paused server takes the request but answers only once resumed.
    redis.pause();
    let mut stream = connect(redis.port, Duration::from_millis(200)).unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let silent = reader.read_until(b'\n', &mut line).unwrap_err();
    assert!(matches!(silent.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{silent}");
    redis.resume();
    reader.get_ref().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(read_reply(&mut reader).unwrap(), "PONG");

    let port = redis.port;
    redis.kill();
    assert!(run_command(port, &["PING"], Duration::from_secs(1)).is_err());
    redis.restart();
    assert_eq!(redis.port, port);
    assert_eq!(redis.command(&["PING"]), "PONG");
    assert_eq!(redis.command(&["DBSIZE"]), "0", "nothing survives a restart");
}

#[test]
fn a_cluster_of_three_forms() {
    let cluster = Cluster::start(3);
    assert_eq!(cluster.url(), cluster.nodes[0].url());
    assert_eq!(cluster.urls().len(), 3);
    let info = cluster.nodes[0].command(&["CLUSTER", "INFO"]);
    assert!(info.contains("cluster_state:ok") && info.contains("cluster_size:3"), "{info}");
    assert_eq!(cluster.nodes[0].command(&["CLUSTER", "KEYSLOT", "foo"]), "12182");

    // Exactly one node owns the key; the others redirect to it.
    let answers: Vec<String> = cluster.nodes.iter().map(|node| node.command(&["SET", "foo", "bar"])).collect();
    let owner = answers.iter().position(|a| a == "OK").unwrap_or_else(|| panic!("{answers:?}"));
    let moved = format!("MOVED 12182 127.0.0.1:{}", cluster.nodes[owner].port);
    assert!(answers.iter().enumerate().all(|(i, a)| i == owner || *a == moved), "{answers:?}");
    assert_eq!(cluster.nodes[owner].command(&["GET", "foo"]), "bar");
}

//! gRPC with Python's grpcio on both sides: a client and a server strict in other places
//! than tonic (grpcio reads a DATA frame where a trailers-only answer was as a broken
//! stream, and answers `UNKNOWN`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::*;

const MISSING: &str = "Python's grpcio is not installed (`apt-get install -y python3-grpcio`, as .ci/run does): \
                       the grpcio test is skipped";

/// A server of two raw-bytes methods: `Echo` answers `pong:` and the request, `Fail`
/// aborts with NOT_FOUND, a trailers-only answer. Prints its port.
const SERVER: &str = r#"
import grpc
from concurrent import futures

def echo(request, context):
    return b"pong:" + request

def fail(request, context):
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

handler = grpc.method_handlers_generic_handler("probe.Probe", {
    "Echo": grpc.unary_unary_rpc_method_handler(echo),
    "Fail": grpc.unary_unary_rpc_method_handler(fail),
})
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination(timeout=60)
"#;

/// Calls Echo, Fail, Echo on the target given, a line per call: `ok REPLY` or `CODE
/// DETAILS`.
const CLIENT: &str = r#"
import sys, grpc

with grpc.insecure_channel(sys.argv[1]) as channel:
    for method in ["Echo", "Fail", "Echo"]:
        call = channel.unary_unary("/probe.Probe/" + method)
        try:
            print("ok", call(b"hi", timeout=10).decode(), flush=True)
        except grpc.RpcError as e:
            print(e.code().name, e.details(), flush=True)
"#;

/// A Python that imports grpc: Debian's (where `python3-grpcio` puts it), else the one
/// on the PATH; none says so (the caller skips) unless `CI` is set: there it fails.
fn python() -> Option<&'static str> {
    let found = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|python| Command::new(python).args(["-c", "import grpc"]).output().is_ok_and(|o| o.status.success()));
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "{MISSING}");
        eprintln!("skipped: {MISSING}");
    }
    found
}

/// The server's process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(python: &str, script: &Path, target: &str) -> Vec<String> {
    let output = Command::new(python).arg(script).arg(target).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
}

/// The server's error reaches a grpcio client with its status and message, directly and
/// through the proxy alike, and the proxy's own refusal is RESOURCE_EXHAUSTED.
#[test]
fn a_grpcio_client_gets_a_grpcio_servers_error_and_the_proxys_refusal_as_grpc_statuses() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (server_py, client_py) = (dir.path().join("server.py"), dir.path().join("client.py"));
    std::fs::write(&server_py, SERVER).unwrap();
    std::fs::write(&client_py, CLIENT).unwrap();
    let mut server = Server(Command::new(python).arg(&server_py).stdout(Stdio::piped()).spawn().unwrap());
    let mut port = String::new();
    BufReader::new(server.0.stdout.take().unwrap()).read_line(&mut port).unwrap();
    let backend = format!("127.0.0.1:{}", port.trim());
    assert!(port.trim().parse::<u16>().is_ok_and(|p| p > 0), "the server printed no port: {port:?}");

    let direct = run(python, &client_py, &backend);
    assert_eq!(direct, ["ok pong:hi", "NOT_FOUND no such thing", "ok pong:hi"], "the server's own answers");
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  g: {{ servers: [\"{backend}\"], http2: true }}\n\
         limits:\n  two: {{ key: ip, rate: 1r/m, burst: 1, nodelay: true }}\nroutes:\n  - {{ upstream: g, limits: [two] }}\n"
    ));
    let through = run(python, &client_py, &sg.addr.to_string());
    assert_eq!(through[..2], direct[..2], "through the proxy: {through:?}");
    assert!(through[2].starts_with("RESOURCE_EXHAUSTED "), "the third call is over the limit: {through:?}");
}

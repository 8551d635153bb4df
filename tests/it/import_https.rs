//! The nginx site nearly every operator runs: a server on port 80 that redirects every
//! request to HTTPS, and the HTTPS server for the same names with the real locations and
//! limits. `import` makes routes that match by scheme (`match.scheme`), and the result
//! answers on both ports as nginx answers from the same file; `explain` says which scheme
//! it takes a request to have come in by. And the import says where the requests of a
//! location it left out go now, with the exit status that says so.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::common::*;
use crate::nginx;

/// The pair as the issue met it, on ports `plain` and `tls`, forwarding to `backend`.
fn the_pair(plain: u16, tls: u16, backend: SocketAddr) -> String {
    format!(
        r#"events {{}}
http {{
    limit_req_zone $binary_remote_addr zone=site:1m rate=10r/s;
    limit_req_zone $binary_remote_addr zone=api:1m rate=1r/m;
    limit_req_zone $binary_remote_addr zone=login:1m rate=1r/m;
    limit_req_zone $binary_remote_addr zone=search:1m rate=5r/s;
    upstream app {{ server {backend}; }}
    server {{
        listen {plain};
        listen [::]:{plain};
        server_name example.com www.example.com;
        return 301 https://$host$request_uri;
    }}
    server {{
        listen {tls} ssl http2;
        server_name example.com www.example.com;
        ssl_certificate certs/site.crt;
        ssl_certificate_key certs/site.key;
        limit_req zone=site burst=20 nodelay;
        location / {{ proxy_pass http://app; }}
        location /api/ {{ limit_req zone=api; proxy_pass http://app; }}
        location = /login {{ limit_req zone=login; proxy_pass http://app; }}
        location /search {{ limit_req zone=search burst=5; proxy_pass http://app; }}
    }}
}}
"#
    )
}

/// A private CA, and a certificate of it for example.com and www.example.com in
/// `DIR/certs/site.crt` and `.key`; the CA's, for clients.
fn certificates(dir: &Path) -> CertificateDer<'static> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names = vec!["example.com".to_owned(), "www.example.com".to_owned()];
    let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca).unwrap();
    std::fs::create_dir_all(dir.join("certs")).unwrap();
    std::fs::write(dir.join("certs/site.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("certs/site.key"), key.serialize_pem()).unwrap();
    ca.der().clone()
}

/// `sluicegate import --out DIR/sluicegate.yaml DIR/nginx.conf`: exit code, YAML, stderr.
fn import(dir: &Path) -> (i32, String, String) {
    let out = dir.join("sluicegate.yaml");
    let output = binary().arg("import").arg("--out").arg(&out).arg(dir.join("nginx.conf")).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap().replace(&dir.display().to_string(), "DIR");
    (output.status.code().unwrap(), std::fs::read_to_string(&out).unwrap_or_default(), stderr)
}

/// `GET path` with `Host: host` and `Connection: close`, over TLS (SNI example.com, only
/// HTTP/1.1 offered) when `ca` is given, read until the server closes: the status and the
/// `Location` field.
async fn get(addr: SocketAddr, ca: Option<&CertificateDer<'static>>, host: &str, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let answer = match ca {
        None => raw_exchange(addr, request.as_bytes()).await,
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.clone()).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let exchange = async {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let name = ServerName::try_from("example.com").unwrap();
                let mut tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
                tls.write_all(request.as_bytes()).await.unwrap();
                let (mut out, mut piece) = (Vec::new(), [0u8; 16 * 1024]);
                // A close without TLS's close_notify ends the answer as well.
                while let Ok(n @ 1..) = tls.read(&mut piece).await {
                    out.extend_from_slice(&piece[..n]);
                }
                String::from_utf8_lossy(&out).into_owned()
            };
            tokio::time::timeout(Duration::from_secs(5), exchange).await.expect("the server closed within 5 s")
        }
    };
    let status = answer.split(' ').nth(1).unwrap_or("none").to_owned();
    let location = answer
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Location: ").or_else(|| l.strip_prefix("location: ")))
        .map(|l| format!(" location={}", l.trim()))
        .unwrap_or_default();
    format!("{status}{location}")
}

/// What a client and the backend saw of the same requests to the plain and TLS ports.
async fn seen(plain: SocketAddr, tls: SocketAddr, ca: &CertificateDer<'static>, backend: &Backend) -> Vec<String> {
    let mut seen = Vec::new();
    let requests = [
        (None, "example.com", "/api/x?y=1"),
        (None, "www.example.com", "/"),
        (None, "other.test", "/a"),
        (Some(ca), "example.com", "/"),
        (Some(ca), "example.com", "/api/x"),
        // api's 1r/m with no burst: the second at once is refused (503).
        (Some(ca), "example.com", "/api/y"),
        (Some(ca), "www.example.com", "/login"),
        (Some(ca), "www.example.com", "/login"),
        // No server lists the name: the port's default server, the HTTPS one here.
        (Some(ca), "other.test", "/search?q=1"),
    ];
    for (ca, host, path) in requests {
        let before = backend.hits().len();
        let addr = if ca.is_some() { tls } else { plain };
        let answer = get(addr, ca, host, path).await;
        let hits = backend.hits();
        let forwarded = hits.get(before).map(|h| format!(" forwarded {}", h.path_and_query)).unwrap_or_default();
        let scheme = if ca.is_some() { "https" } else { "http" };
        seen.push(format!("{scheme}://{host}{path}: {answer}{forwarded}"));
    }
    seen
}

#[tokio::test]
async fn the_http_to_https_pair_is_served_like_nginx_on_both_ports() {
    if !nginx::installed() {
        return;
    }
    let backend = Backend::start().await;
    let (plain, tls) = (closed_port(), closed_port());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nginx.conf"), the_pair(plain, tls, backend.addr)).unwrap();
    let ca = certificates(dir.path());
    let (code, yaml, stderr) = import(dir.path());
    // Imported whole, and `check` finds every limit listed by a route.
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(stderr.ends_with("DIR/nginx.conf: imported whole; the result is valid\n"), "{stderr}");
    let y: Value = serde_saphyr::from_str(&yaml).unwrap();
    let routes = y["routes"].as_array().unwrap();
    let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "http://example.com/",
            "http://www.example.com/",
            "https://example.com=/login",
            "https://example.com/search",
            "https://example.com/api/",
            "https://example.com/",
            "https://www.example.com=/login",
            "https://www.example.com/search",
            "https://www.example.com/api/",
            "https://www.example.com/",
            "http://*/",
            "https://*=/login",
            "https://*/search",
            "https://*/api/",
            "https://*/",
        ]
    );
    assert_eq!(routes[0]["match"], json!({"host": "example.com", "scheme": "http"}));
    assert_eq!(routes[0]["respond"], json!({"status": 301, "headers": {"location": "https://$host$request_uri"}}));
    assert_eq!(routes[4]["match"], json!({"host": "example.com", "scheme": "https", "path_prefix": "/api/"}));
    assert_eq!(routes[4]["limits"], json!(["api"]));
    assert_eq!(routes[10]["match"], json!({"scheme": "http"}));

    let (plain_addr, tls_addr): (SocketAddr, SocketAddr) =
        (format!("127.0.0.1:{plain}").parse().unwrap(), format!("127.0.0.1:{tls}").parse().unwrap());
    let nginx_saw = {
        // nginx binds every address before it serves any.
        let _nginx = nginx::Nginx::start(dir.path(), tls_addr).await;
        seen(plain_addr, tls_addr, &ca, &backend).await
    };
    // Fresh ports, so that nothing nginx left behind answers; the same listeners else.
    let (plain2, tls2) = (closed_port(), closed_port());
    let yaml = yaml
        .replace(&format!("\"[::]:{plain}\""), &format!("\"[::]:{plain2}\""))
        .replace(&format!("0.0.0.0:{tls}"), &format!("0.0.0.0:{tls2}"));
    let _sg = Sluicegate::start(&yaml);
    let (plain_addr, tls_addr): (SocketAddr, SocketAddr) =
        (format!("127.0.0.1:{plain2}").parse().unwrap(), format!("127.0.0.1:{tls2}").parse().unwrap());
    wait_until("both listeners", Duration::from_secs(10), async || {
        TcpStream::connect(plain_addr).await.is_ok() && TcpStream::connect(tls_addr).await.is_ok()
    })
    .await;
    let sluicegate_saw = seen(plain_addr, tls_addr, &ca, &backend).await;
    assert_eq!(sluicegate_saw, nginx_saw);
    assert_eq!(
        nginx_saw,
        [
            "http://example.com/api/x?y=1: 301 location=https://example.com/api/x?y=1",
            "http://www.example.com/: 301 location=https://www.example.com/",
            "http://other.test/a: 301 location=https://other.test/a",
            "https://example.com/: 200 forwarded /",
            "https://example.com/api/x: 200 forwarded /api/x",
            "https://example.com/api/y: 503",
            "https://www.example.com/login: 200 forwarded /login",
            "https://www.example.com/login: 503",
            "https://other.test/search?q=1: 200 forwarded /search?q=1",
        ]
    );
}

/// `explain` takes the scheme of the URL (`http` for a path alone), says it, and routes
/// by it as the proxy does.
#[test]
fn explain_routes_by_the_urls_scheme_and_says_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nginx.conf"), the_pair(8080, 8443, "127.0.0.1:9000".parse().unwrap())).unwrap();
    certificates(dir.path());
    let (code, _, stderr) = import(dir.path());
    assert_eq!(code, 0, "{stderr}");
    let explain = |url: &str| {
        let output =
            binary().arg("explain").arg("-c").arg(dir.path().join("sluicegate.yaml")).arg(url).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let https = explain("https://example.com/api/x");
    assert!(https.contains("  path /api/x (normalized), host example.com, scheme https\n"), "{https}");
    assert!(https.contains(" not taken: scheme https is not http\n"), "{https}");
    assert!(https.contains("route https://example.com/api/ (line "), "{https}");
    assert!(https.contains(" taken: upstream app\n"), "{https}");
    let http = explain("http://example.com/api/x");
    assert!(http.contains("scheme http\n"), "{http}");
    assert!(http.contains("route http://example.com/ (line ") && http.contains(" taken: respond 301"), "{http}");
    assert!(explain("/api/x").contains("host none, scheme http\n"));
}

/// A route for a scheme that no listener serves takes no request: `check` says so.
#[test]
fn check_warns_of_a_scheme_no_listener_serves() {
    let (code, stderr) = check_bounded(
        "listen: 127.0.0.1:8080\nroutes:\n  - match: { scheme: https }\n    respond: { status: 204 }\n  - respond: { status: 200 }\n",
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("FILE:3:")
            && stderr.contains(
                "routes[0].match.scheme: no listener has `tls`, so no request comes in by https: this route takes none"
            ),
        "{stderr}"
    );
    let (code, stderr) = check_bounded("listen: 127.0.0.1:8080\nroutes:\n  - match: { scheme: ftp }\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("FILE:3:") && stderr.contains("routes[0].match.scheme"), "{stderr}");
}

/// Requests of the locations the import leaves out (PHP by FastCGI, files from disk, a
/// server's `if` that answers bots) go elsewhere: each says where and what limits they
/// lose, the 21 lines of an included `fastcgi_params` are one line, and the exit status
/// is 5, not the 3 of a dropped directive that changes neither routes nor limits.
#[test]
fn left_out_locations_say_where_their_requests_go_and_the_status_tells_it() {
    let dir = tempfile::tempdir().unwrap();
    let params: String = (1..=21).map(|i| format!("fastcgi_param P{i} $request_uri;\n")).collect();
    std::fs::write(dir.path().join("fastcgi_params"), params).unwrap();
    std::fs::write(
        dir.path().join("nginx.conf"),
        r#"events {}
http {
    limit_req_zone $binary_remote_addr zone=site:1m rate=10r/s;
    limit_req_zone $binary_remote_addr zone=php:1m rate=2r/s;
    server {
        listen 8080;
        if ($http_user_agent ~* badbot) { return 403; }
        location / { limit_req zone=site burst=20; proxy_pass http://127.0.0.1:9000; }
        location /static/ { root /var/www; }
        location ~ \.php$ {
            limit_req zone=php burst=10;
            include fastcgi_params;
            fastcgi_pass unix:/run/php/php-fpm.sock;
        }
    }
}
"#,
    )
    .unwrap();
    let (code, yaml, stderr) = import(dir.path());
    assert_eq!(code, 5, "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "DIR/fastcgi_params:1: fastcgi_param: not supported (21 lines: 1-21)",
            "DIR/nginx.conf:7: if: conditions are not converted: the requests it answers with `return 403` now go on to the route their path takes, limited and forwarded as any other",
            "DIR/nginx.conf:9: location: neither proxy_pass nor return: sluicegate serves no files, so no route is made; its requests now take the route of `location /` (DIR/nginx.conf:8), now limited by `limit_req zone=site burst=20` (DIR/nginx.conf:8)",
            "DIR/nginx.conf:9: root: sluicegate serves no files: it forwards requests or answers them with `respond`",
            "DIR/nginx.conf:10: location: neither proxy_pass nor return: sluicegate serves no files, so no route is made; its requests now take the route of `location /` (DIR/nginx.conf:8), losing `limit_req zone=php burst=10` (DIR/nginx.conf:11), now limited by `limit_req zone=site burst=20` (DIR/nginx.conf:8) instead",
            "DIR/nginx.conf:13: fastcgi_pass: only proxy_pass (HTTP) is converted",
            "DIR/nginx.conf: nothing to convert (sluicegate needs no counterpart): events",
            "DIR/nginx.conf: 26 directives left out (listed above, and as comments in the result); requests are routed, limited or refused otherwise than by nginx where these 4 were left out: DIR/nginx.conf:7, DIR/nginx.conf:9, DIR/nginx.conf:10, DIR/nginx.conf:13; the result is valid",
        ]
    );
    // In the result too, grouped the same way.
    assert!(
        yaml.contains(
            "# left out: DIR/fastcgi_params:1: fastcgi_param: not supported (21 lines: 1-21)\n"
                .replace("DIR", &dir.path().display().to_string())
                .as_str()
        ),
        "{yaml}"
    );

    // Only a directive that changes neither routes nor limits: 3.
    std::fs::write(
        dir.path().join("nginx.conf"),
        "events {}\nhttp {\n    gzip on;\n    server {\n        listen 8080;\n        location / { proxy_pass http://127.0.0.1:9000; }\n    }\n}\n",
    )
    .unwrap();
    let (code, _, stderr) = import(dir.path());
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.ends_with("DIR/nginx.conf: 1 directive left out (listed above, and as comments in the result), none of which changes which route a request takes or how it is limited; the result is valid\n"),
        "{stderr}"
    );
}

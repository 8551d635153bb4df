//! `forwarded: rfc7239 | both`: the `Forwarded` element sent upstream, and the client
//! address read from a trusted proxy's `Forwarded` header.

use crate::common::*;

fn config(backend: &Backend, mode: &str, trusted: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nforwarded: {mode}\ntrusted_proxies: [{trusted}]\nupstreams:\n  app: {{ servers: [\"{}\"] }}\nlimits:\n  once: {{ key: ip, rate: 1r/m, burst: 0 }}\nroutes:\n  - match: {{ path: /once }}\n    upstream: app\n    limits: [once]\n  - upstream: app\n",
        backend.addr
    )
}

#[tokio::test]
async fn an_untrusted_peer_gets_one_forwarded_element_and_no_x_forwarded_fields() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend, "rfc7239", "10.0.0.0/8"));
    let claims = [("forwarded", "for=6.6.6.6"), ("x-forwarded-for", "6.6.6.6"), ("x-forwarded-proto", "https")];
    assert_eq!(get(sg.addr, "/x", &claims).await.status, 200);
    let seen = &backend.hits()[0].headers;
    assert_eq!(seen["forwarded"], "for=127.0.0.1;proto=http;host=localhost");
    for gone in ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"] {
        assert!(!seen.contains_key(gone), "{gone} was forwarded");
    }
}

#[tokio::test]
async fn a_trusted_proxys_forwarded_chain_is_extended_and_names_the_client() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend, "both", "127.0.0.0/8"));
    let v6 = [("forwarded", "for=6.6.6.6, for=\"[2001:db8::1]\";proto=https")];
    assert_eq!(get(sg.addr, "/x", &v6).await.status, 200);
    let seen = &backend.hits()[0].headers;
    assert_eq!(
        seen["forwarded"],
        "for=6.6.6.6, for=\"[2001:db8::1]\";proto=https, for=127.0.0.1;proto=http;host=localhost"
    );
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    // The limit's key is the rightmost untrusted `for=` (IPv6 keys are /64 networks): a
    // new client passes, the same one again is over `1r/m`.
    assert_eq!(get(sg.addr, "/once", &v6).await.status, 200);
    assert_eq!(get(sg.addr, "/once", &[("forwarded", "for=\"[2001:db8:1::2]\"")]).await.status, 200);
    assert_eq!(get(sg.addr, "/once", &[("forwarded", "for=9.9.9.9, for=\"[2001:db8::1]:443\"")]).await.status, 429);
}

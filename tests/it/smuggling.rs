//! Request smuggling and framing, as RFC 9112 reads to a proxy and as the published desync
//! classes play it (CL.TE, TE.CL, TE.TE obfuscations, chunk-size overflow, requests
//! hidden in bodies): each case sends raw bytes and checks what the client is answered
//! and what reached the backend. The backend is hyper, a peer that frames by the RFC:
//! whatever it sees is what a real server behind sluicegate would act on.

use std::net::SocketAddr;

use crate::common::*;

/// A proxy in front of `backend`, everything forwarded.
fn proxy(backend: &Backend) -> Sluicegate {
    Sluicegate::in_front_of(
        backend,
        "listen: 127.0.0.1:0
upstreams:
  b: { servers: [\"BACKEND\"] }
routes:
  - upstream: b
",
    )
}

/// What the client reads after sending `bytes` on one connection: every byte until the
/// proxy closes it (or 5 s pass).
async fn send_raw(addr: SocketAddr, bytes: &[u8]) -> String {
    raw_exchange(addr, bytes).await
}

/// The status codes of the responses in `answer`, in order.
fn statuses(answer: &str) -> Vec<u16> {
    answer
        .split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|rest| rest.get(..3)?.parse().ok())
        .filter(|&status| status >= 200)
        .collect()
}

/// The paths the backend was asked for, in order.
fn reached(backend: &Backend) -> Vec<String> {
    backend.hits().into_iter().map(|h| h.path_and_query).collect()
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_framed_by_the_chunks_and_the_connection_closes() {
    // CL.TE: a front end that believed Content-Length would pass `G` on as the start of a
    // next request; here the chunked coding frames the body, the length is dropped, and
    // nothing more is read from the connection.
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let answer = send_raw(
        sg.addr,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert_eq!(reached(&backend), ["/echo"]);
    let seen = &backend.hits()[0].headers;
    assert!(seen.get("content-length").is_none_or(|l| l == "0"), "{seen:?}");
}

#[tokio::test]
async fn a_body_framed_by_chunks_is_sent_whole_and_nothing_after_it_is_a_request() {
    // TE.CL: a back end that believed Content-Length would read `8\r\nSMUGGLED` as a
    // second request; the upstream gets the body with our framing, whole.
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let answer = send_raw(
        sg.addr,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(answer.ends_with("SMUGGLED"), "{answer}");
    assert_eq!(reached(&backend), ["/echo"]);
}

#[tokio::test]
async fn obfuscated_transfer_encodings_are_refused_before_any_byte_goes_upstream() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    for (te, status) in [
        ("Transfer-Encoding: chunked\r\nTransfer-Encoding: x", 400),
        ("Transfer-Encoding: xchunked", 400),
        ("Transfer-Encoding: chunked, identity", 400),
        ("Transfer-Encoding: identity", 400),
        ("Transfer-Encoding: chunked;q=1", 400),
        ("Transfer-Encoding: , chunked", 400),
        ("Transfer-Encoding : chunked", 400),
        ("Transfer-Encoding:\x0bchunked", 400),
        ("X: y\r\n Transfer-Encoding: chunked", 400),
        ("Transfer-Encoding: gzip, chunked", 501),
    ] {
        let request = format!("POST /echo HTTP/1.1\r\nHost: a\r\n{te}\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        let answer = send_raw(sg.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [status], "{te:?}: {answer}");
        assert!(answer.contains("connection: close"), "{te:?}: {answer}");
    }
    assert_eq!(reached(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn the_chunked_coding_is_read_whatever_its_case_and_whitespace() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    for te in ["Transfer-Encoding: CHUNKED", "Transfer-Encoding:\tchunked ", "Transfer-Encoding: Chunked"] {
        let request =
            format!("POST /echo HTTP/1.1\r\nHost: a\r\n{te}\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        let answer = send_raw(sg.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [200], "{te:?}: {answer}");
        assert!(answer.ends_with("hello"), "{te:?}: {answer}");
    }
}

#[tokio::test]
async fn transfer_encoding_in_http10_is_refused() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let answer =
        send_raw(sg.addr, b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n").await;
    assert_eq!(statuses(&answer), [400], "{answer}");
    assert_eq!(reached(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn several_or_malformed_content_lengths_are_refused() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    for cl in [
        "Content-Length: 5\r\nContent-Length: 5",
        "Content-Length: 5\r\nContent-Length: 6",
        "Content-Length: 5, 5",
        "Content-Length: +5",
        "Content-Length: -5",
        "Content-Length: 0x5",
        "Content-Length: 5 5",
        "Content-Length: 5a",
        "Content-Length: ",
        "Content-Length: 99999999999999999999999",
    ] {
        let request = format!("POST /echo HTTP/1.1\r\nHost: a\r\n{cl}\r\n\r\nhello");
        let answer = send_raw(sg.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [400], "{cl:?}: {answer}");
    }
    assert_eq!(reached(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn malformed_chunks_end_the_request_with_400_and_no_second_request() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let extension = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(2000));
    for body in [
        "fffffffffffffffff\r\nhello\r\n0\r\n\r\n", // past 64 bits
        "5 \r\nhello\r\n0\r\n\r\n",                // a space where no extension follows
        "0x5\r\nhello\r\n0\r\n\r\n",
        "-5\r\nhello\r\n0\r\n\r\n",
        "5\nhello\r\n0\r\n\r\n",          // LF alone
        "5\r\nhelloXX\r\n0\r\n\r\n",      // more data than the size says
        "5\r\nhello\r\n0\r\nbad\r\n\r\n", // a trailer that is no field
        extension.as_str(),
    ] {
        let request = format!(
            "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{body}GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
        );
        let answer = send_raw(sg.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [400], "{body:?}: {answer}");
    }
    assert!(!reached(&backend).contains(&"/smuggled".to_owned()), "{:?}", reached(&backend));
}

#[tokio::test]
async fn a_request_hidden_in_a_body_stays_body() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let hidden = "GET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{hidden}",
        hidden.len()
    );
    let answer = send_raw(sg.addr, request.as_bytes()).await;
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(answer.ends_with(hidden), "{answer}");
    assert_eq!(reached(&backend), ["/echo"]);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_each_reaches_the_upstream_once() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let answer = send_raw(
        sg.addr,
        b"GET /status/201 HTTP/1.1\r\nHost: a\r\n\r\nPOST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiGET /status/202 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&answer), [201, 200, 202], "{answer}");
    assert_eq!(reached(&backend), ["/status/201", "/echo", "/status/202"]);
}

#[tokio::test]
async fn bytes_after_a_request_without_a_body_are_the_next_request_and_garbage_there_is_refused() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let answer = send_raw(sg.addr, b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nhello there\r\n\r\n").await;
    assert_eq!(statuses(&answer), [200, 400], "{answer}");
    assert_eq!(reached(&backend), ["/a"]);
}

#[tokio::test]
async fn malformed_fields_are_refused() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    for field in [
        "X-A: 1\r\n folded", // obs-fold
        "X-A : 1",           // a space before the colon
        "X-A: a\rb",         // a bare CR
        "X-A: a\0b",         // NUL
        "X-A: a\x01b",       // another control byte
        ": empty-name",      // no name
        "X A: 1",            // a space in the name
    ] {
        let request = format!("GET / HTTP/1.1\r\nHost: a\r\n{field}\r\n\r\n");
        let answer = send_raw(sg.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [400], "{field:?}: {answer}");
    }
    assert_eq!(reached(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn request_lines_that_are_not_http1_are_refused() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    for line in [
        "GET / HTTP/2.0",
        "GET / HTTP/1.2",
        "GET /a b HTTP/1.1",
        "GET  / HTTP/1.1",
        "GET\t/ HTTP/1.1",
        "G\x01T / HTTP/1.1",
        "GET example.com/x HTTP/1.1",
    ] {
        let request = format!("{line}\r\nHost: a\r\n\r\n");
        let answer = send_raw(sg.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [400], "{line:?}: {answer}");
    }
    assert_eq!(reached(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn an_absolute_target_naming_another_host_than_host_is_refused() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let answer =
        send_raw(sg.addr, b"GET http://other.example/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(statuses(&answer), [400], "{answer}");
    let answer = send_raw(sg.addr, b"GET http://a/x?y=1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert_eq!(reached(&backend), ["/x?y=1"], "the upstream gets the origin form");
}

#[tokio::test]
async fn heads_past_their_bounds_are_refused_with_their_status() {
    let backend = Backend::start().await;
    let sg = proxy(&backend);
    let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
    let answer = send_raw(sg.addr, format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes()).await;
    assert_eq!(statuses(&answer), [431], "{answer}");
    // Within what is read (the target and fields within their bounds, and some), the
    // front measures the head exactly; past it, the head is refused as it is read.
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", "x".repeat(8_500));
    assert_eq!(statuses(&send_raw(sg.addr, long.as_bytes()).await), [414]);
    let longer = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "x".repeat(100_000));
    assert_eq!(statuses(&send_raw(sg.addr, longer.as_bytes()).await), [414]);
    let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\nConnection: close\r\n\r\n", "x".repeat(33_000));
    assert_eq!(statuses(&send_raw(sg.addr, big.as_bytes()).await), [431]);
    let bigger = format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n", "x".repeat(100_000));
    assert_eq!(statuses(&send_raw(sg.addr, bigger.as_bytes()).await), [431]);
    assert_eq!(reached(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn expect_100_continue_is_answered_when_the_body_is_wanted_and_never_before_a_refusal() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(
        &backend,
        "listen: 127.0.0.1:0
upstreams:
  b: { servers: [\"BACKEND\"] }
routes:
  - match: { path: /small }
    upstream: b
    max_body_bytes: 4
  - upstream: b
",
    );
    // Refused on its declared length: no `100 Continue`, the final status only.
    let answer =
        send_raw(sg.addr, b"POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
            .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    // Forwarded: the client is told to go on, then answered.
    let rest = post_after_100_continue(sg.addr, "/echo").await;
    assert!(rest.starts_with("HTTP/1.1 200") && rest.ends_with("hello"), "{rest}");
    let seen = &backend.hits()[0].headers;
    assert!(seen.get("expect").is_none(), "the expectation was met at this hop");
}

/// A proxy in front of a raw backend at `addr`.
fn proxy_to(addr: SocketAddr) -> Sluicegate {
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{addr}\"], retries: 0 }}\nroutes:\n  - upstream: b\n"
    ))
}

#[tokio::test]
async fn responses_framed_in_doubt_or_malformed_are_502_and_bodies_are_sent_as_framed() {
    for (answer, status, body) in [
        (&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc"[..], 502, None),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nabc", 502, None),
        (b"HTTP/1.1 200 OK\r\nBad Field: 1\r\n\r\n", 502, None),
        (b"HTTP/1.1 2000 OK\r\n\r\n", 502, None),
        // Both: the chunks frame it (and the connection is not used again).
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            200,
            Some("abc"),
        ),
        // Read until the server closes: the client gets it chunked.
        (b"HTTP/1.0 200 OK\r\n\r\nuntil close", 200, Some("until close")),
    ] {
        let (addr, _) = raw_backend(answer).await;
        let sg = proxy_to(addr);
        let reply = send_raw(sg.addr, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
        assert_eq!(statuses(&reply), [status], "{:?}: {reply}", String::from_utf8_lossy(answer));
        if let Some(body) = body {
            let decoded = get(sg.addr, "/", &[]).await;
            assert_eq!(decoded.text(), body, "{:?}", String::from_utf8_lossy(answer));
        }
    }
}

#[tokio::test]
async fn the_upstream_gets_one_head_of_ours_with_hop_by_hop_fields_gone() {
    let (addr, received) = raw_backend(
        b"HTTP/1.1 204 No Content\r\nConnection: close, x-secret\r\nx-secret: 1\r\nkeep-alive: timeout=5\r\n\r\n",
    )
    .await;
    let sg = proxy_to(addr);
    let reply = send_raw(
        sg.addr,
        b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: x-drop, close\r\nX-Drop: 1\r\nTE: trailers\r\nKeep-Alive: 5\r\nProxy-Connection: keep-alive\r\nX-Kept: 1\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&reply), [204], "{reply}");
    assert!(!reply.contains("x-secret") && !reply.contains("keep-alive"), "{reply}");
    let sent = String::from_utf8(received.lock().unwrap().clone()).unwrap();
    assert!(sent.starts_with("GET /x HTTP/1.1\r\nhost: a\r\n"), "{sent}");
    assert!(sent.contains("X-Kept: 1\r\n"), "{sent}");
    for gone in ["X-Drop", "TE:", "Keep-Alive", "Proxy-Connection", "Connection: x-drop"] {
        assert!(!sent.contains(gone), "{gone} went upstream: {sent}");
    }
    assert!(sent.ends_with("\r\n\r\n"), "{sent}");
}

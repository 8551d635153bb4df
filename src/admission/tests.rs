//! The admission's steps in order, each where it lives: in-process, on a manual clock.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use super::hold::Holds;
use super::*;
use crate::clock::ManualClock;
use crate::wire::head::Fields;
use crate::wire::message::{FieldValue, Response};

const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

const CONFIG: &str = "listen: 127.0.0.1:0
trusted_proxies: [192.0.2.0/24]
redis: { url: \"redis://127.0.0.1:1\" }
upstreams:
  b: { servers: [\"127.0.0.1:9\"] }
limits:
  once: { key: ip, rate: 1r/m }
  per_key: { key: \"header:x-key\", rate: 1r/m, on_missing_key: refuse }
  per_token: { key: bearer, rate: 1r/m, on_missing_key: refuse }
  trial: { key: \"header:x-trial\", rate: 1r/m, dry_run: true, on_missing_key: skip }
  per_model: { key: \"json:model\", rate: 1r/m, on_missing_key: refuse }
  model_trial: { key: \"json:tool\", rate: 1r/m, dry_run: true, on_missing_key: skip }
  shared: { key: ip, rate: 1r/m, scope: global }
routes:
  - { match: { path_prefix: /upload }, max_body_bytes: 10, respond: { status: 200 }, limits: [once] }
  - { match: { path_prefix: /key }, respond: { status: 200 }, limits: [per_key, trial] }
  - { match: { path_prefix: /token }, respond: { status: 200 }, limits: [per_token] }
  - { match: { path_prefix: /cost }, cost_header: x-cost, respond: { status: 200 }, limits: [once] }
  - { match: { path_prefix: /global }, respond: { status: 200 }, limits: [shared] }
  - { match: { path_prefix: /model }, respond: { status: 200 }, limits: [per_model, model_trial] }
  - { match: { path_prefix: /held }, upstream: b, limits: [once], upstream_hold: { by: once } }
";

struct Setting {
    config: Config,
    gate: Gate,
}

fn setting(yaml: &str) -> Setting {
    let config = crate::config::parse(yaml, "test").unwrap();
    let gate = Gate::new(&config, ManualClock::default().into());
    Setting { config, gate }
}

/// `method path` with `fields` (and a `Host`), as a request on the wire.
fn head<'a>(method: &'a Method, path: &'a str, fields: &'a HeaderMap) -> RequestHead<'a> {
    RequestHead { method, target: path, version: http::Version::HTTP_11, authority: None, fields: Fields::from(fields) }
}

fn fields(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("host", "example.com".parse().unwrap());
    for (name, value) in pairs {
        map.append(*name, value.parse().unwrap());
    }
    map
}

/// The admission of `path` with `pairs`, decided as `decide` says, holds `holds`.
fn admit_with<'a>(
    s: &Setting,
    head: &'a RequestHead<'a>,
    declared: Option<u64>,
    decide: Decide,
    holds: Option<&Holds>,
) -> Admission<'a> {
    let asked = Asked { head, peer: PEER, declared, scheme: Scheme::Http, origin: Origin::Wire, body: AskedBody::None };
    admit(&s.config, &s.gate, &asked, &Way { decide, holds, drives: None })
}

fn refused<'b>(admission: &'b Admission<'_>) -> Option<&'b Refused> {
    match &admission.verdict {
        Verdict::Refused(refused) => Some(refused),
        _ => None,
    }
}

#[tokio::test]
async fn a_request_is_refused_at_the_first_step_that_refuses_it_with_what_was_found_before() {
    let s = setting(CONFIG);
    let get = Method::GET;
    let no_host = HeaderMap::new();
    let bad_head = head(&get, "/upload", &no_host);
    let bad = admit_with(&s, &bad_head, None, Decide::Spend, None);
    assert_eq!(refused(&bad), Some(&Refused::Front(FrontError::BadHost("an HTTP/1.1 request needs a Host header"))));
    assert!(bad.front.is_none() && bad.host.is_none());

    let plain = fields(&[]);
    let none_head = head(&get, "/nowhere", &plain);
    let none = admit_with(&s, &none_head, None, Decide::Spend, None);
    assert_eq!(refused(&none), Some(&Refused::Front(FrontError::NoRoute)));
    assert_eq!(none.host, Some("example.com"));

    let large_head = head(&get, "/upload", &plain);
    let large = admit_with(&s, &large_head, Some(11), Decide::Spend, None);
    assert_eq!(refused(&large), Some(&Refused::BodyTooLarge { length: 11, limit: 10 }));
    assert!(large.front.is_some(), "the route that refused it is known");
    assert!(large.cost.is_none(), "no later step was taken");
    let fits_head = head(&get, "/upload", &plain);
    let fits = admit_with(&s, &fits_head, Some(10), Decide::Spend, None);
    assert!(matches!(fits.verdict, Verdict::Decided(Decision::Pass { .. })), "decided at once: no global limit");

    let twice = fields(&[("x-key", "a"), ("x-key", "b")]);
    let repeated_head = head(&get, "/key", &twice);
    let repeated = admit_with(&s, &repeated_head, None, Decide::Spend, None);
    assert!(matches!(refused(&repeated), Some(Refused::DuplicateKeyField { limit, .. }) if limit == "per_key"));

    let missing_head = head(&get, "/key", &plain);
    let missing = admit_with(&s, &missing_head, None, Decide::Spend, None);
    let id = s.config.limits.position(|l| l.name == "per_key").unwrap();
    assert!(matches!(refused(&missing), Some(Refused::MissingKey { token: false, id: i, .. }) if *i == id));
    let tokenless_head = head(&get, "/token", &plain);
    let tokenless = admit_with(&s, &tokenless_head, None, Decide::Spend, None);
    let refusal = refused(&tokenless).unwrap();
    assert!(matches!(refusal, Refused::MissingKey { token: true, .. }));
    assert_eq!((refusal.status(), refusal.grpc_code()), (StatusCode::BAD_REQUEST, Code::UNAUTHENTICATED));

    let weighed = fields(&[("x-cost", "none")]);
    let cost_head = head(&get, "/cost", &weighed);
    let cost = admit_with(&s, &cost_head, None, Decide::Spend, None);
    assert!(matches!(refused(&cost), Some(Refused::Front(FrontError::InvalidCost { .. }))));
}

#[tokio::test]
async fn a_dry_run_limit_keyed_on_a_repeated_field_says_so_and_refuses_nothing() {
    let s = setting(CONFIG);
    let get = Method::GET;
    let twice = fields(&[("x-key", "a"), ("x-trial", "1"), ("x-trial", "2")]);
    let admission_head = head(&get, "/key", &twice);
    let admission = admit_with(&s, &admission_head, None, Decide::Spend, None);
    let trial = s.config.limits.position(|l| l.name == "trial").unwrap();
    assert_eq!(admission.repeated_dry.as_slice(), [(trial, "header:x-trial".to_owned())]);
    assert!(matches!(admission.verdict, Verdict::Decided(Decision::Pass { .. })));
}

#[tokio::test]
async fn a_preview_spends_nothing_and_a_global_limit_waits_for_redis() {
    let s = setting(CONFIG);
    let get = Method::GET;
    let plain = fields(&[]);
    let upload = head(&get, "/upload", &plain);
    for _ in 0..3 {
        let previewed = admit_with(&s, &upload, None, Decide::Preview, None);
        assert!(matches!(previewed.verdict, Verdict::Decided(Decision::Pass { .. })), "nothing spent");
    }
    assert!(matches!(
        admit_with(&s, &upload, None, Decide::Spend, None).verdict,
        Verdict::Decided(Decision::Pass { .. })
    ));
    let second = admit_with(&s, &upload, None, Decide::Spend, None);
    assert!(matches!(second.verdict, Verdict::Decided(Decision::Reject { .. })), "one a minute, spent");

    let global = head(&get, "/global", &plain);
    let spent = admit_with(&s, &global, None, Decide::Spend, None);
    assert!(matches!(spent.verdict, Verdict::Pending), "Redis must be asked");
    assert_eq!((spent.limits.len(), spent.cost), (1, Some(1)), "with what it is asked");
    let previewed = admit_with(&s, &global, None, Decide::Preview, None);
    assert!(matches!(&previewed.verdict, Verdict::Decided(d) if d.results().is_empty()), "a preview asks no Redis");
}

#[tokio::test]
async fn a_logged_line_is_not_checked_again_and_its_client_is_the_one_it_names() {
    let s = setting(CONFIG);
    let get = Method::GET;
    // Without Host (a line that logs none), through a trusted peer that forwards.
    let mut logged = HeaderMap::new();
    logged.insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
    let line = head(&get, "/upload", &logged);
    let asked = Asked {
        head: &line,
        peer: PEER,
        declared: None,
        scheme: Scheme::Http,
        origin: Origin::Logged { claims: None, host: None },
        body: AskedBody::None,
    };
    let admission = admit(&s.config, &s.gate, &asked, &Way { decide: Decide::Spend, holds: None, drives: None });
    assert!(matches!(admission.verdict, Verdict::Decided(Decision::Pass { .. })));
    assert_eq!(admission.client_ip, PEER, "the line's client, not a hop it recorded");
    let wire = Asked { origin: Origin::Wire, ..asked };
    assert!(matches!(
        admit(&s.config, &s.gate, &wire, &Way { decide: Decide::Spend, holds: None, drives: None }).verdict,
        Verdict::Refused(Refused::Front(FrontError::BadHost(_)))
    ));
}

#[tokio::test]
async fn a_limit_a_line_cannot_drive_neither_decides_nor_refuses_it() {
    let s = setting(CONFIG);
    let get = Method::GET;
    let plain = fields(&[]);
    let key = head(&get, "/key", &plain);
    let asked = Asked {
        head: &key,
        peer: PEER,
        declared: None,
        scheme: Scheme::Http,
        origin: Origin::Wire,
        body: AskedBody::None,
    };
    let none = |_: RouteId, _: LimitId| false;
    let admission = admit(&s.config, &s.gate, &asked, &Way { decide: Decide::Spend, holds: None, drives: Some(&none) });
    assert!(admission.limits.is_empty());
    assert!(matches!(admission.verdict, Verdict::Decided(Decision::Pass { .. })), "its missing key refuses nothing");
}

#[tokio::test]
async fn a_held_key_is_answered_from_its_hold_before_it_takes_any_quota() {
    let s = setting(CONFIG);
    let holds = Holds::new(&s.config, None);
    let get = Method::GET;
    let plain = fields(&[]);
    let held = head(&get, "/held", &plain);
    let first = admit_with(&s, &held, None, Decide::Preview, Some(&holds));
    let (route, key) = (first.front.as_ref().unwrap().route, first.hold.expect("the route holds by `once`"));
    let refusal = Response::<Bytes>::made(
        StatusCode::TOO_MANY_REQUESTS,
        vec![(http::header::RETRY_AFTER, FieldValue::Long(b"30".to_vec()))],
        Bytes::new(),
    );
    let table = holds.table(route).unwrap();
    assert_eq!(table.hold(&key, &refusal, s.gate.clock().now()), Some(Duration::from_secs(30)));
    let again = admit_with(&s, &held, None, Decide::Spend, Some(&holds));
    assert!(matches!(&again.verdict, Verdict::Held(h) if h.status == StatusCode::TOO_MANY_REQUESTS));
    assert!(again.cost.is_none(), "decided by no limit");
    let asked_without = admit_with(&s, &held, None, Decide::Spend, None);
    assert!(matches!(asked_without.verdict, Verdict::Decided(Decision::Pass { .. })), "the quota was untouched");
}

#[tokio::test]
async fn a_route_that_reads_the_body_pauses_for_it_and_resumes_with_its_fields() {
    let s = setting(CONFIG);
    let post = Method::POST;
    let plain = fields(&[]);
    let model = head(&post, "/model", &plain);
    let spend = Way { decide: Decide::Spend, holds: None, drives: None };
    let on_wire =
        |body| Asked { head: &model, peer: PEER, declared: None, scheme: Scheme::Http, origin: Origin::Wire, body };
    // On the wire, unread: the admission stops before the keys, nothing spent.
    let mut paused = admit(&s.config, &s.gate, &on_wire(AskedBody::Unread), &spend);
    assert!(matches!(paused.verdict, Verdict::ReadBody));
    let fields = s.config.routes[paused.front.as_ref().unwrap().route].body_fields.clone().unwrap();
    let mut scan = Scan::new(fields.clone());
    scan.feed(br#"{"model": "m1", "tool": "t"}"#);
    resume(&s.config, &s.gate, &on_wire(AskedBody::Unread), &spend, &mut paused, &scan, true);
    assert!(matches!(paused.verdict, Verdict::Decided(Decision::Pass { .. })));
    // The same model again: its key is spent.
    let given = admit(&s.config, &s.gate, &on_wire(AskedBody::Given(br#"{"model":"m1"}"#)), &spend);
    assert!(matches!(given.verdict, Verdict::Decided(Decision::Reject { .. })));
    // A request without a body (or a line's) has the field missing: on_missing_key.
    let none = admit(&s.config, &s.gate, &on_wire(AskedBody::None), &spend);
    assert!(matches!(refused(&none), Some(Refused::MissingKey { limit, .. }) if limit == "per_model"));
    // A field an enforced limit reads, sent twice: refused; a dry-run one's: said.
    let twice = admit(&s.config, &s.gate, &on_wire(AskedBody::Given(br#"{"model":"a","model":"b"}"#)), &spend);
    let Some(Refused::DuplicateKeyField { limit, field, .. }) = refused(&twice) else { panic!("not refused") };
    assert_eq!((limit.as_str(), field.as_str()), ("per_model", "the field `model` of the JSON body"));
    let dry = admit(&s.config, &s.gate, &on_wire(AskedBody::Given(br#"{"model":"c","tool":"x","tool":"y"}"#)), &spend);
    assert!(matches!(dry.verdict, Verdict::Decided(Decision::Pass { .. })));
    assert_eq!(dry.repeated_dry.iter().map(|(_, f)| f.as_str()).collect::<Vec<_>>(), ["json:tool"]);
    // A body that cannot be read ends the admission with its refusal, naming the limit.
    let mut stalled = admit(&s.config, &s.gate, &on_wire(AskedBody::Unread), &spend);
    body_unread(&s.config, &mut stalled, "no data for 1s".into(), true);
    let refusal = refused(&stalled).unwrap();
    assert_eq!((refusal.status(), refusal.outcome()), (StatusCode::REQUEST_TIMEOUT, "body_timeout"));
    assert!(refusal.to_string().contains("per_model"), "{refusal}");
    // A route that reads no body never pauses for it.
    let upload = head(&post, "/key", &plain);
    let asked = Asked { head: &upload, ..on_wire(AskedBody::Unread) };
    assert!(!matches!(admit(&s.config, &s.gate, &asked, &spend).verdict, Verdict::ReadBody));
}

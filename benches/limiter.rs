//! Hot paths of a request's limit decision, and governor's keyed limiter for scale.
//!
//! `cargo bench --bench limiter`. Besides criterion's timings it prints the resident
//! memory per key of a table holding one million keys.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use sluicegate::clock::{Clock, ManualClock, Nanos};
use sluicegate::config::{self, LimitId, LimitUse};
use sluicegate::gate::Gate;
use sluicegate::policy::key::KeySource;

/// A gate of one local limit, on `clock`.
fn gate(key: &str, max_keys: usize, clock: &ManualClock) -> Gate {
    // Fast enough that the bench measures admissions, not rejections.
    let yaml = format!(
        "listen: 127.0.0.1:0\nlimits:\n  l: {{ key: {key}, rate: 1000000r/s, burst: 1000, nodelay: true, max_keys: {max_keys} }}\nroutes:\n  - limits: [l]\n    respond: {{ status: 200 }}\n"
    );
    Gate::new(&config::parse(&yaml, "bench").expect("bench config is valid"), clock.clone().into())
}

fn ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-api-key", "0123456789abcdef0123456789abcdef".parse().expect("valid value"));
    h.insert("authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc".parse().expect("valid value"));
    h.insert("cookie", "theme=dark; session=9f8e7d6c5b4a; lang=en".parse().expect("valid value"));
    h.insert("host", "example.com".parse().expect("valid value"));
    h
}

fn decision(c: &mut Criterion) {
    let headers = headers();
    // Made once: only the client's address changes per decision, so the figure is the
    // decision's, not the request view's.
    let mut src = KeySource::get(ip(0), "/api/v1/items?page=2", &headers);
    let mut group = c.benchmark_group("decision");
    for keys in [1u32, 100_000, 1_000_000] {
        // Room for every key: this measures lookups, not eviction churn.
        let clock = ManualClock::default();
        let l = gate("ip", 2 * keys as usize, &clock);
        let mut now = 0u64;
        for i in 0..keys {
            src.client_ip = ip(i);
            l.check(&[LimitUse::plain(LimitId::from(0))], &src, 1);
        }
        let mut i = 0u32;
        group.bench_function(BenchmarkId::new("sluicegate", keys), |b| {
            b.iter(|| {
                i = (i + 7919) % keys;
                now += 1_000;
                clock.set(Nanos(now));
                src.client_ip = ip(i);
                black_box(l.check(&[LimitUse::plain(LimitId::from(0))], &src, 1))
            })
        });
    }
    // governor's keyed GCRA over the same keys: a reference point, not a competitor
    // (it cannot decide several limits all-or-nothing, nor delay).
    for keys in [1u32, 100_000] {
        let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000).expect("non-zero"))
            .allow_burst(NonZeroU32::new(1001).expect("non-zero"));
        let g = governor::RateLimiter::keyed(quota);
        let mut i = 0u32;
        group.bench_function(BenchmarkId::new("governor_keyed", keys), |b| {
            b.iter(|| {
                i = (i + 7919) % keys;
                black_box(g.check_key(&ip(i)).is_ok())
            })
        });
    }
    // The proxy reads the monotonic clock once per decision.
    group.bench_function("clock", |b| b.iter(|| black_box(Clock::System.now())));
    group.finish();
}

/// A fixed window's decision, over 1000 keys: a window of a length (arithmetic on the
/// instant) and a calendar month (its window remembered: the zone's rules are read once
/// per window).
fn fixed_window(c: &mut Criterion) {
    let headers = headers();
    let mut src = KeySource::get(ip(0), "/", &headers);
    let mut group = c.benchmark_group("fixed_window");
    for (name, window) in [("1h", "1h"), ("calendar_month", "{ calendar: month, tz: Europe/Berlin }")] {
        let yaml = format!(
            "listen: 127.0.0.1:0\nlimits:\n  l: {{ key: ip, algorithm: fixed_window, limit: 16000000, window: {window} }}\nroutes:\n  - limits: [l]\n    respond: {{ status: 200 }}\n"
        );
        // From 2026-01-01T00:00Z, a millisecond per decision.
        let mut now = 1_767_225_600_000_000_000u64;
        let clock = ManualClock::new(Nanos(now));
        let gate = Gate::new(&config::parse(&yaml, "bench").expect("bench config is valid"), clock.clone().into());
        let mut i = 0u32;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 7919) % 1000;
                now += 1_000_000;
                clock.set(Nanos(now));
                src.client_ip = ip(i);
                black_box(gate.check(&[LimitUse::plain(LimitId::from(0))], &src, 1))
            })
        });
    }
    group.finish();
}

fn key_extraction(c: &mut Criterion) {
    let headers = headers();
    let src = KeySource::get(ip(1), "/api/v1/items?page=2&user=42", &headers);
    let mut group = c.benchmark_group("key");
    for key in [
        "ip",
        "\"header:x-api-key\"",
        "bearer",
        "\"cookie:session\"",
        "\"query:user\"",
        "[ip, \"header:x-api-key\", path]",
    ] {
        let spec =
            config::parse(&format!("listen: 127.0.0.1:0\nlimits:\n  l: {{ key: {key}, rate: 1r/s }}\n"), "bench")
                .expect("bench config is valid")
                .limits
                .remove(LimitId::from(0))
                .key;
        let seed = sluicegate::limit::secret::KeySecret::draw().seed;
        group.bench_function(key.replace('"', ""), |b| b.iter(|| black_box(spec.hash(&src, &seed))));
    }
    group.finish();
}

/// Resident set size of this process, in bytes (Linux).
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn memory_per_key(_: &mut Criterion) {
    let headers = HeaderMap::new();
    let keys = 1_000_000u32;
    let before = rss();
    let l = gate("ip", keys as usize, &ManualClock::default());
    for i in 0..keys {
        let src = KeySource::get(ip(i), "/", &headers);
        l.check(&[LimitUse::plain(LimitId::from(0))], &src, 1);
    }
    if let (Some(before), Some(after)) = (before, rss()) {
        println!(
            "memory: {} keys held, {:.1} bytes per key (RSS growth)",
            keys,
            (after - before) as f64 / f64::from(keys)
        );
    }
    black_box(&l);
}

criterion_group!(benches, memory_per_key, decision, fixed_window, key_extraction);
criterion_main!(benches);

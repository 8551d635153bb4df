//! The dashboard in a real browser (headless Chromium, `chromium.rs`): it shows what
//! happens without a reload (a limit's requests without its key among it), lifts a ban,
//! shows nothing before its token is typed, logs no error and fetches nothing from
//! another origin. Skipped with a notice where Chromium is not installed, unless `CI` is
//! set.

use std::time::Duration;

use fantoccini::Locator;

use crate::chromium::Chromium;
use crate::common::*;

/// Waits in the browser: bounded by what a loaded machine needs for a page and a poll.
const WITHIN: Duration = Duration::from_secs(30);

/// The console lines of `browser` that are errors or warnings.
async fn complaints(browser: &Chromium) -> Vec<(String, String)> {
    browser.console().await.into_iter().filter(|(level, _)| level == "SEVERE" || level == "WARNING").collect()
}

/// Opens the dashboard of `sg` and waits for its first answer.
async fn open(browser: &Chromium, sg: &Sluicegate) {
    browser.client.goto(&format!("http://{}/", sg.admin_addr())).await.unwrap();
    browser.until("the dashboard's first answer", WITHIN, "return document.body.dataset.seq !== undefined").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_floods_refusals_and_the_refused_key_without_a_reload() {
    let Some(browser) = Chromium::start().await else { return };
    let sg = Conf::new()
        .admin()
        .limit("per_user", "key: \"header:x-user\", on_missing_key: skip, rate: 1r/m")
        .route("name: quiet, match: { path: /quiet }, respond: { status: 200 }")
        .route("name: api, respond: { status: 200 }, limits: [per_user]")
        .start();
    open(&browser, &sg).await;
    // A mark in this page: a reload would lose it.
    browser.run("window.openedOnce = true; return true").await;
    for _ in 0..6 {
        get(sg.addr, "/", &[("x-user", "mallory")]).await;
    }
    browser
        .until(
            "the refused key in the limit's card",
            WITHIN,
            r#"const card = document.querySelector('[data-limit="per_user"]');
               return card !== null && card.querySelector('ol.refused').textContent.includes('header:x-user=mallory (5)')"#,
        )
        .await;
    browser
        .until(
            "the route's refusals in its sparkline",
            WITHIN,
            r#"const line = document.querySelector('[data-route="api"] polyline.refused');
               return line.getAttribute('points').split(' ').some((p) => Number(p.split(',')[1]) < 100)"#,
        )
        .await;
    // A route that refused nothing draws no refusal line at 0, only the line of what
    // passed, which says where 0 is.
    let quiet = browser
        .run(
            r#"const points = (kind) => document.querySelector(`[data-route="quiet"] polyline.${kind}`).getAttribute('points');
               return [points('passed') !== '', points('delayed'), points('refused')]"#,
        )
        .await;
    assert_eq!(quiet, serde_json::json!([true, "", ""]));
    let same_page = browser
        .run("return window.openedOnce === true && performance.getEntriesByType('navigation').length === 1")
        .await;
    assert_eq!(same_page, true, "the page was not reloaded");
    assert_eq!(complaints(&browser).await, []);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_lifted_from_the_page_lets_the_key_in() {
    let Some(browser) = Chromium::start().await else { return };
    let sg = Conf::new()
        .admin()
        .limit("login", "key: \"header:x-user\", on_missing_key: skip, rate: 10r/s, ban: 10m")
        .route("name: login, respond: { status: 200 }, limits: [login]")
        .start();
    let mallory = [("x-user", "mallory")];
    let statuses = [get(sg.addr, "/", &mallory).await.status, get(sg.addr, "/", &mallory).await.status];
    assert_eq!(statuses, [200, 429], "the second request starts a ban");
    open(&browser, &sg).await;
    let ban = r#"document.querySelector('[data-limit="login"] li[data-ban]')"#;
    browser
        .until("the ban in the list", WITHIN, &format!("return ({ban})?.textContent.includes('header:x-user=mallory')"))
        .await;
    // The rate itself lets the key in again (a tenth of a second later: no excess left),
    // and the lookup says the ban still refuses it.
    wait_until("the bucket to drain under the ban", WITHIN, async || {
        let state = get(sg.admin_addr(), "/limits/login?header:x-user=mallory", &[]).await;
        let window = &serde_json::from_slice::<serde_json::Value>(&state.body).unwrap()["windows"][0];
        assert_eq!(window["admits"], false, "banned: {window}");
        window["excess"].as_f64() == Some(0.0)
    })
    .await;
    assert_eq!(get(sg.addr, "/", &mallory).await.status, 429, "banned");
    browser
        .client
        .find(Locator::Css(r#"[data-limit="login"] li[data-ban] button.lift"#))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.until("the ban gone from the list", WITHIN, &format!("return ({ban}) === null")).await;
    assert_eq!(get(sg.addr, "/", &mallory).await.status, 200, "the key is let in");
    assert_eq!(complaints(&browser).await, []);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_page_shows_nothing_until_it_is_typed() {
    let Some(browser) = Chromium::start().await else { return };
    let token = "t0ken-typed-by-the-operator";
    let sg = Conf::new()
        .set(&format!("admin: {{ listen: 127.0.0.1:0, token: {token} }}"))
        .limit("hidden_limit", "key: ip, rate: 1r/s")
        .route("name: hidden-route, respond: { status: 200 }, limits: [hidden_limit]")
        .start();
    browser.client.goto(&format!("http://{}/", sg.admin_addr())).await.unwrap();
    browser.until("the token's form", WITHIN, "return document.querySelector('#login').hidden === false").await;
    let shown = browser
        .run(
            "return { text: document.body.innerText, html: document.documentElement.outerHTML, \
             asked: performance.getEntriesByType('resource').map((e) => e.name) }",
        )
        .await;
    let (text, html) = (shown["text"].as_str().unwrap(), shown["html"].as_str().unwrap());
    assert!(!text.contains("hidden-route") && !html.contains("hidden_limit"), "shown before the token: {text}");
    let asked = shown["asked"].to_string();
    assert!(!asked.contains("dashboard.json"), "asked for data without the token: {asked}");

    browser.client.find(Locator::Css("#token")).await.unwrap().send_keys(token).await.unwrap();
    browser.client.find(Locator::Css("#login button")).await.unwrap().click().await.unwrap();
    browser
        .until("the routes", WITHIN, r#"return document.querySelector('[data-route="hidden-route"]') !== null"#)
        .await;
    let kept = browser
        .run(
            "return { session: sessionStorage.getItem('sluicegate.admin-token'), cookie: document.cookie, \
             local: localStorage.length, url: location.href, \
             asked: performance.getEntriesByType('resource').map((e) => e.name) }",
        )
        .await;
    assert_eq!(kept["session"], token, "kept in the tab's session storage");
    assert_eq!((kept["cookie"].as_str(), kept["local"].as_u64()), (Some(""), Some(0)), "nowhere else");
    assert!(!kept.to_string().replace(&format!("\"session\":\"{token}\""), "").contains(token), "in a URL: {kept}");
    assert_eq!(complaints(&browser).await, []);

    // A wrong token is refused, and asked for again.
    browser.run("sessionStorage.setItem('sluicegate.admin-token', 'wrong'); location.reload(); return true").await;
    browser
        .until(
            "the form again",
            WITHIN,
            "return document.querySelector('#login-error').textContent === 'That token was refused.'",
        )
        .await;
    assert_eq!(browser.run("return sessionStorage.getItem('sluicegate.admin-token')").await, serde_json::Value::Null);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_logs_no_error_and_fetches_nothing_from_another_origin() {
    let Some(browser) = Chromium::start().await else { return };
    let backend = Backend::start().await;
    // Every part of the page drawn: routes, limits of every kind, a ban, upstream
    // servers in and out, Redis away, a failed reload.
    let conf = Conf::new()
        .admin()
        .set(&format!(
            "upstreams:\n  b: {{ servers: [\"{}\"] }}\n  dead: {{ servers: [\"127.0.0.1:{}\"], health_check: {{ path: /, interval: 200ms }} }}",
            backend.addr,
            closed_port()
        ))
        .redis(&format!("redis://127.0.0.1:{}", closed_port()), "timeout: 50ms")
        .limit("per_ip", "key: ip, rate: 1r/m, ban: 1m")
        .limit("slots", "key: ip, concurrency: 2")
        .limit("trial", "key: bearer, on_missing_key: skip, algorithm: sliding_window, limit: 1, window: 1m, dry_run: true")
        .limit("shared", "key: ip, rate: 1000r/s, scope: global, on_store_error: local")
        .route("name: login, match: { path: /login }, respond: { status: 200 }, limits: [per_ip]")
        .route("name: gone, match: { path_prefix: /gone }, upstream: dead")
        .route("name: api, upstream: b, limits: [slots, trial, shared]");
    let sg = conf.start();
    for path in ["/login", "/login", "/gone", "/api", "/api"] {
        get(sg.addr, path, &[("authorization", "Bearer abc")]).await;
    }
    sg.reload("listen: 127.0.0.1:0\nroutes: nonsense\n");
    open(&browser, &sg).await;
    let first = browser.run("return Number(document.body.dataset.seq)").await.as_u64().unwrap();
    browser
        .until("three more answers", WITHIN, &format!("return Number(document.body.dataset.seq) >= {first} + 3"))
        .await;
    let page = browser
        .run(
            "return { origin: location.origin, \
             asked: performance.getEntriesByType('resource').map((e) => e.name), \
             inline: document.querySelectorAll('script:not([src]), style').length, \
             text: document.body.innerText }",
        )
        .await;
    let origin = page["origin"].as_str().unwrap();
    let asked: Vec<&str> = page["asked"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(asked.iter().any(|a| a.contains("/dashboard.json")), "{asked:?}");
    assert!(asked.iter().all(|a| a.starts_with(&format!("{origin}/"))), "fetched from another origin: {asked:?}");
    assert_eq!(page["inline"], 0, "no inline script or style");
    let text = page["text"].as_str().unwrap();
    for shown in ["per_ip", "dry run", "in Redis", "unreachable", "health check", "failed", "ip=127.0.0.1"] {
        assert!(text.contains(shown), "{shown:?} not in:\n{text}");
    }
    // Times as the logs write them: UTC, 24 hours, whatever the browser's zone.
    let failed = text.lines().find(|l| l.contains("by SIGHUP: failed")).unwrap_or_else(|| panic!("{text}"));
    let utc = failed.split(" by SIGHUP").next().unwrap().rsplit('\t').next().unwrap().trim();
    let (day, time) = utc.strip_suffix(" UTC").and_then(|t| t.split_once(' ')).unwrap_or_else(|| panic!("{failed:?}"));
    assert!(day.len() == 10 && time.len() == 8 && !failed.contains(" PM") && !failed.contains(" AM"), "{failed:?}");
    assert_eq!(complaints(&browser).await, []);
    browser.close().await;
}

/// Not a check: makes `docs/dashboard.png`, docs/operations.md's picture of the page, from a minute
/// and a half of scripted traffic (clients passing, one flooding, a ban, a dry-run
/// limit, a slow route, a server that is down):
/// `cargo test --release -- --ignored a_picture_of_the_dashboard_for_the_readme`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "makes docs/dashboard.png"]
async fn a_picture_of_the_dashboard_for_the_readme() {
    let browser = Chromium::start().await.expect("Chromium to take the picture with");
    let backend = Backend::start().await;
    let sg = Conf::new()
        .set("admin: { listen: 127.0.0.1:0 }")
        .set(&format!(
            "upstreams:\n  app: {{ servers: [\"{}\"] }}\n  reports: {{ servers: [\"{}\", \"127.0.0.1:{}\"], health_check: {{ path: /, interval: 1s }} }}",
            backend.addr,
            backend.addr,
            closed_port()
        ))
        .limit("per_client", "key: \"header:x-client\", on_missing_key: skip, rate: 20r/s, burst: 10, nodelay: true")
        .limit("per_token", "key: bearer, on_missing_key: skip, algorithm: sliding_window, limit: 300, window: 1m, dry_run: true")
        .limit("login", "key: \"header:x-user\", on_missing_key: skip, rate: 6r/m, burst: 2, nodelay: true, ban: 5m")
        .route("name: login, match: { path: /login }, respond: { status: 200 }, limits: [login]")
        .route("name: reports, match: { path_prefix: /reports }, upstream: reports")
        .route("name: api, match: { path_prefix: /api }, upstream: app, limits: [per_client, per_token]")
        .route("name: search, upstream: app, limits: [per_client]")
        .start();
    browser.client.goto(&format!("http://{}/", sg.admin_addr())).await.unwrap();
    // Traffic paced at ten rounds a second.
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(100));
    for tick in 0..900u64 {
        pace.tick().await;
        let second = tick / 10;
        let mut calls = vec![("/api/orders", "alice", "Bearer tok-alice"), ("/api/items", "bob", "Bearer tok-bob")];
        if tick % 3 == 0 {
            calls.push(("/sleep/12", "carol", "Bearer tok-carol"));
        }
        if second >= 40 {
            calls.extend([("/api/orders", "mallory", "Bearer tok-mallory"); 4]);
        }
        if tick % 7 == 0 {
            calls.push(("/reports/daily", "bob", "Bearer tok-bob"));
        }
        if (20..40).contains(&second) && tick % 5 == 0 {
            calls.push(("/login", "eve", ""));
        }
        for (path, client, token) in calls {
            let user = if path == "/login" { client } else { "" };
            get(sg.addr, path, &[("x-client", client), ("x-user", user), ("authorization", token)]).await;
        }
    }
    let height = browser.run("return document.documentElement.scrollHeight").await.as_u64().unwrap();
    // The window's frame takes some of its height: room enough for the whole page.
    browser.client.set_window_size(1300, u32::try_from(height).unwrap() + 160).await.unwrap();
    browser.until("a fresh answer", WITHIN, "return document.querySelector('#status').textContent === 'live'").await;
    let png = browser.client.screenshot().await.unwrap();
    std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/dashboard.png"), png).unwrap();
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_card_shows_its_requests_without_its_key_once_there_are_any() {
    let Some(browser) = Chromium::start().await else { return };
    let sg = Conf::new()
        .admin()
        .limit("per_user", "key: \"header:x-user\", rate: 10r/s, on_missing_key: skip")
        .answering("per_user")
        .start();
    // The figures of the limit's card, each `name: value`.
    const STATS: &str = r#"(() => {
        const card = document.querySelector('[data-limit="per_user"]');
        return card === null ? [] : [...card.querySelectorAll('.stats > div')].map((d) => {
          const name = d.querySelector('b').textContent;
          return `${name}: ${d.textContent.slice(name.length)}`;
        });
      })()"#;
    open(&browser, &sg).await;
    let shown = format!("return {STATS}.some((s) => s.startsWith('evictions: '))");
    browser.until("the limit's card with its figures", WITHIN, &shown).await;
    assert_eq!(get(sg.addr, "/", &[("x-user", "alice")]).await.status, 200);
    let before = browser.run(&format!("return {STATS}")).await;
    let before: Vec<&str> = before.as_array().unwrap().iter().filter_map(|s| s.as_str()).collect();
    assert!(!before.iter().any(|s| s.starts_with("without its key")), "not shown while none came: {before:?}");
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    }
    let counted = format!("return {STATS}.includes('without its key: 3')");
    browser.until("the requests without its key in the card", WITHIN, &counted).await;
    assert_eq!(complaints(&browser).await, []);
    browser.close().await;
}

/// The candidate's panel shows, live, what a candidate would do differently: it appears
/// once one is loaded, its figures follow the requests, and it goes when it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_candidate_panel_follows_a_live_candidate_without_a_reload() {
    let Some(browser) = Chromium::start().await else { return };
    let conf = |n: u32| {
        Conf::new()
            .admin()
            .limit(
                "per_key",
                &format!(
                    "key: \"header:x-user\", on_missing_key: refuse, algorithm: fixed_window, limit: {n}, window: 1h"
                ),
            )
            .answering("per_key")
            .yaml()
    };
    let sg = Sluicegate::start(&conf(10));
    let candidate = sg.config.parent().unwrap().join("candidate.yaml");
    std::fs::write(&candidate, conf(2)).unwrap();
    let admin = sg.admin_addr();
    open(&browser, &sg).await;
    assert_eq!(browser.run("return document.querySelector('#candidate').hidden").await, true, "none live");
    let call = |method: http::Method, path: String| {
        let req = http::Request::builder().method(method).uri(path).header("host", "localhost");
        request(admin, req.body(String::new()).unwrap())
    };
    assert_eq!(call(http::Method::POST, format!("/candidate?file={}", candidate.display())).await.status, 200);
    for _ in 0..5 {
        assert_eq!(get(sg.addr, "/", &[("x-user", "mallory")]).await.status, 200);
    }
    browser
        .until(
            "the candidate's row and key",
            WITHIN,
            r#"const row = document.querySelector('#candidate [data-candidate-limit="per_key"]');
               return !document.querySelector('#candidate').hidden && row !== null
                 && [...row.children].map((c) => c.textContent).join('|') === 'per_key|0|3|3|0'
                 && document.querySelector('#candidate ol.newly-refused').textContent.includes('per_key: header:x-user=mallory (3)')"#,
        )
        .await;
    assert_eq!(call(http::Method::DELETE, "/candidate".to_owned()).await.status, 200);
    browser.until("the panel gone", WITHIN, "return document.querySelector('#candidate').hidden").await;
    assert_eq!(complaints(&browser).await, []);
    browser.close().await;
}

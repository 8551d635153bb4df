//! sluicegate: an HTTP reverse proxy with rate limiting built in.
//!
//! ```text
//! accept (server)          listeners, TLS, HTTP/1.1 and HTTP/2, connection cap, timeouts
//!                          (watchdog), graceful shutdown; the proxy of the configuration
//!                          in force, swapped whole by a reload
//!   -> head checks         431 / 414, CONNECT 405, one valid Host (proxy::head, route)
//!   -> client address      peer, or rightmost untrusted X-Forwarded-For / Forwarded hop
//!   -> route               first match on host, normalized path (path), method (proxy::route)
//!   -> allow-list, cost    exempt requests skip the limits; what a request weighs
//!   -> keys                each limit hashes its key (a repeated key field is a 400)
//!   -> limits (gate)       one call decides the request, all or nothing: overrides and
//!                          allow-lists, the near-cache, the local limits (state in limit),
//!                          then the global ones in one Redis call (store; concurrent
//!                          requests share it), undone or
//!                          decided by on_store_error when Redis cannot answer; pass,
//!                          delay, or reject with 429 — all on one clock (clock)
//!   -> receipts            slots held until the body is sent (proxy::response); `count:`
//!                          refunds by status
//!   -> forward / respond   a server by balance and health (host names looked up again:
//!                          proxy::resolve) on a pooled connection (proxy::pool), retried
//!                          on the next when it could not be sent, bodies streamed and
//!                          bounded, upgrades tunnelled (proxy::forward); or a static
//!                          response
//!   -> account             metrics, rejection lines within their budget, access log line
//!                          when the body is done
//! ```
//!
//! `config` turns the YAML file into the compiled `Config` the request path reads; the
//! words a limit is written in (`policy`) are shared by `config` and `limit`. The
//! decision's layers import downwards only: proxy -> gate -> store -> limit -> config ->
//! policy (server and proxy still know each other: connection holds, buffer sizes).
//! `simulate` replays access logs through the same routes, keys and gate offline.

pub mod access_log;
pub mod admin;
pub mod cli;
pub mod clock;
pub mod config;
pub mod gate;
pub mod import;
pub mod limit;
pub mod metrics;
pub mod path;
pub mod policy;
pub mod proxy;
pub mod server;
pub mod simulate;
pub mod store;
pub mod watchdog;

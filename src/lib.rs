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
//!   -> keys                each limit hashes its key (a repeated key field is a 400), or an
//!                          override picks another limit
//!   -> limits              all or nothing: pass, delay, or reject with 429; local ones
//!                          first (limit), then global ones in one Redis call (store)
//!   -> receipts            slots held until the body is sent; `count:` refunds by status
//!   -> forward / respond   a server by balance and health, retried on the next when it
//!                          could not be sent, bodies streamed and bounded, upgrades
//!                          tunnelled (proxy::forward); or a static response
//!   -> account             metrics, rejection lines within their budget, access log line
//!                          when the body is done
//! ```
//!
//! `config` turns the YAML file into the compiled `Config` the request path reads;
//! `simulate` replays access logs through the same routes, keys and limiters offline.

pub mod access_log;
pub mod admin;
pub mod cli;
pub mod config;
pub mod limit;
pub mod metrics;
pub mod path;
pub mod proxy;
pub mod server;
pub mod simulate;
pub mod store;
pub mod watchdog;

//! sluicegate: an HTTP reverse proxy with rate limiting built in.
//!
//! ```text
//! accept (server)          listeners, TLS, HTTP/1.1 and HTTP/2, connection cap, timeouts (watchdog), graceful shutdown
//!   -> client address      peer, or rightmost untrusted X-Forwarded-For hop (proxy::headers)
//!   -> route               first match on host, normalized path (path), method (proxy::route)
//!   -> allow-list, cost    exempt requests skip the limits; what a request weighs
//!   -> keys                each limit hashes its key, or an override picks another limit
//!   -> limits              all or nothing: pass, delay, or reject with 429; local ones
//!                          first (limit), then global ones in one Redis call (store)
//!   -> receipts            slots held until the body is sent; `count:` refunds by status
//!   -> forward / respond   pooled upstream client, bodies streamed (proxy::forward),
//!                          or a static response; 404 / 502 / 504 made here (proxy::response)
//! ```
//!
//! `config` turns the YAML file into the compiled `Config` the request path reads.

pub mod access_log;
pub mod admin;
pub mod cli;
pub mod config;
pub mod limit;
pub mod metrics;
pub mod path;
pub mod proxy;
pub mod server;
pub mod store;
pub mod watchdog;

//! sluicegate: an HTTP reverse proxy with rate limiting built in.
//!
//! ```text
//! accept (server)          listeners, TLS, connection cap, graceful shutdown; each accepted
//!                          stream set up in one place; the proxy of the configuration in
//!                          force (running), swapped whole by a reload
//!   wire                   HTTP and nothing above it: HTTP/1 on sluicegate's engine
//!                          (wire::http1, wire::h1: strict framing, keep-alive, timeouts in
//!                          its loop), HTTP/2 on hyper (wire::h2, wire::watchdog); both hand
//!                          the service one Request and write one Response (wire::message),
//!                          whose body settles itself; what a connection holds
//!                          (wire::connection); the request view every layer reads
//!                          (wire::head)
//!   -> admission           the steps that decide a request, driven in one place for the
//!                          proxy, `explain` and `simulate`'s replay (admission): the
//!                          head's checks (431 / 414, CONNECT 405, one valid Host), the
//!                          client address (hop), the normalized path (path), host, route,
//!                          the route's token verified (jwt; keys fetched by jwks), key
//!                          source, allow-list (front), a declared body too large, a key
//!                          field repeated or missing, a key its upstream refused with a
//!                          time to wait (admission::hold), cost, then the decision
//!   -> limits (gate)       one call decides the request, all or nothing: overrides and
//!                          allow-lists, the near-cache, the local limits (state in limit),
//!                          then the global ones in one Redis call (store; concurrent
//!                          requests share it), undone or decided by on_store_error when
//!                          Redis cannot answer; pass, delay, or reject with 429 — all on
//!                          one clock (clock); one result per limit for every reader;
//!                          local state written to disk and read back at start (persist,
//!                          limit::snapshot)
//!   -> receipts            slots held until the body is sent, the log line written as it
//!                          ends, its pace (proxy::body); `count:` refunds by status;
//!                          `charge:` debits what the response reports (proxy::charge)
//!   -> forward / respond   (proxy: admit, then serve) a server by balance and health, host
//!                          names looked up again, on a pooled connection, retried on the
//!                          next when it could not be sent, bodies streamed and bounded
//!                          (upstream); hop-by-hop and forwarding fields (hop); upgrades
//!                          tunnelled; or a static response
//!   -> account             metrics, rejection lines within their budget, a refusal's key
//!                          (for the dashboard, with an admin listener), access log line
//!                          when the body is done
//! ```
//!
//! `config` turns the YAML file into the compiled `Config` the request path reads, its
//! routes, limits and upstreams named by typed ids (`ids`) in every table beside them; the
//! words a limit is written in (`policy`) are shared by `config` and `limit`. Modules
//! import downwards only: server -> admin -> dashboard (the page, and its history read
//! once a second from the counters) -> running -> proxy, explain, simulate -> admission
//! -> front, gate, hop; proxy -> upstream; gate -> store -> limit -> config -> policy -> wire::head, suggest ("did you
//! mean", for config's and policy's messages); proxy, upstream -> wire (the upstream side
//! of the engine is `wire::http1::client`), and the wire imports nothing above it.
//! `simulate` replays access logs through the same front and gate offline.

pub mod access_log;
pub mod admin;
pub mod admission;
pub mod candidate;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod explain;
pub mod front;
pub mod gate;
pub mod grpc;
pub mod hop;
pub mod ids;
pub mod import;
pub mod jwks;
pub mod jwt;
pub mod limit;
pub mod metrics;
pub mod path;
pub mod persist;
pub mod policy;
pub mod proxy;
pub mod router;
pub mod running;
pub mod server;
pub mod simulate;
pub mod store;
pub mod suggest;
pub mod top_keys;
pub mod upstream;
pub mod variables;
pub mod verify;
pub mod wire;
pub mod worker;

//! The wire: HTTP and nothing above it. Connections' bytes become requests and
//! responses go back as bytes, whichever protocol: HTTP/1.x on sluicegate's own engine
//! (`http1` frames, `h1` serves a client connection's requests one after another),
//! HTTP/2 on hyper (`h2`, under the `watchdog`'s timeouts), upgraded connections joined
//! as tunnels (`tunnel`); what passes between the wire and a service (`message`), the
//! views of a request head every layer reads (`head`), and what a client connection
//! holds (`connection`). Nothing here knows limits, routes, upstreams or logs: a response
//! body settles what it holds itself (`message::ResponseBody`).

pub mod connection;
pub mod h1;
pub mod h2;
pub mod head;
pub mod http1;
pub mod message;
mod tunnel;
pub mod watchdog;

pub use watchdog::Timeouts;

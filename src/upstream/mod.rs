//! The upstream side of the proxy: an upstream's servers and which of them a request
//! goes to (`servers`: passive health and in-flight counts; `balance`; host names looked
//! up again by `resolve`; active checks by `health`), connections to them (`connect`,
//! kept alive in `pool`), and one request's exchange with them (`client`, over
//! sluicegate's HTTP/1 engine or hyper's HTTP/2, `h2`: a request that could not be sent
//! tried again on the next server; the request body held to its limits on the way,
//! `body`).

mod balance;
mod body;
mod client;
mod connect;
mod error;
pub mod h2;
mod health;
mod pool;
mod resolve;
mod servers;

pub use body::{BodyFault, PeekError, Peeked, RequestBody, peek};
pub use client::{Answer, Outgoing, UpstreamBody, UpstreamClient, UpstreamResponse};
pub use connect::UpstreamIo;
pub use error::{SendError, UpstreamError};

//! The upstream side of the proxy: an upstream's servers and which of them a request
//! goes to (`servers`: passive health and in-flight counts; `balance`; host names looked
//! up again by `resolve`; active checks by `health`), connections to them (`connect`,
//! kept alive in `pool`), and one request's exchange with them (`client`: a request that
//! could not be sent tried again on the next server, `retry`; the request body held to
//! its limits on the way, `body`).

mod balance;
mod body;
mod client;
mod connect;
mod error;
mod health;
mod pool;
mod resolve;
mod retry;
mod servers;

pub use body::{BodyFault, FaultCell, RequestBody};
pub use client::{Hop, UpstreamBody, UpstreamClient};
pub use error::{SendError, UpstreamError};
pub use pool::BUFFER_BYTES;

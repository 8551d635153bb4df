//! What a client connection holds while it lives: its place under
//! `server.max_connections`, its place among its address's connections
//! (`server.max_connections_per_ip`), and a receiver of the shutdown signal, which the
//! shutdown waits for; and what a request knows of the connection it came on.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// The client connection a request came on.
pub struct ClientConn {
    pub peer: SocketAddr,
    /// The connection is TLS: `X-Forwarded-Proto: https`.
    pub tls: bool,
    /// Shutdown's signal: the connection closes between requests once it comes. Kept,
    /// as the hold, as long as the connection lives (a tunnel made of it included), and
    /// shutdown waits (at most the grace period) for every receiver to be dropped.
    stopping: watch::Receiver<()>,
    /// Kept as long as the connection lives: the connection counts under
    /// `max_connections` (and `max_connections_per_ip`).
    _hold: Option<ConnectionHold>,
}

impl ClientConn {
    pub fn new(peer: SocketAddr, tls: bool, stopping: watch::Receiver<()>, hold: ConnectionHold) -> Self {
        ClientConn { peer, tls, stopping, _hold: Some(hold) }
    }

    /// A connection that counts under no limit (the admin listener's), stopped by
    /// `stopping`'s signal.
    pub fn unheld(peer: SocketAddr, stopping: watch::Receiver<()>) -> Self {
        ClientConn { peer, tls: false, stopping, _hold: None }
    }

    /// Shutdown's signal, as the connection sees it.
    pub fn stopping(&self) -> &watch::Receiver<()> {
        &self.stopping
    }
}

/// What a client connection holds while it lives, and an upgraded connection (a tunnel)
/// after hyper has let it go: its place under `max_connections`, and among its address's.
pub struct ConnectionHold {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _peer: Option<PeerSlot>,
}

impl ConnectionHold {
    /// Holds `slot` of `max_connections` and the place `peer` among its address's
    /// connections, until dropped.
    pub fn new(slot: tokio::sync::OwnedSemaphorePermit, peer: Option<PeerSlot>) -> Self {
        ConnectionHold { _slot: slot, _peer: peer }
    }
}

/// Connections open per client address (`server.max_connections_per_ip`), so that one
/// host cannot take every slot of `max_connections`. An IPv6 client counts by its /64, as
/// it can pick any address in it. Holds only addresses with connections open, so at
/// most `max_connections` entries.
#[derive(Default)]
pub struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One connection's place in `PeerCounts`, given back when the connection ends.
pub struct PeerSlot {
    counts: Arc<PeerCounts>,
    peer: IpAddr,
}

impl PeerCounts {
    /// A place for a connection from `peer`, unless it already holds `max`.
    pub fn take(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<PeerSlot> {
        let peer = match peer.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
            v4 => v4,
        };
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let open = counts.entry(peer).or_insert(0);
        if *open >= max {
            if *open == 0 {
                counts.remove(&peer);
            }
            return None;
        }
        *open += 1;
        Some(PeerSlot { counts: Arc::clone(self), peer })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = counts.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// A client connection's transport, asked whether the client has closed its side as the
/// kernel knows it now: the runtime hears of a close when it next polls for events,
/// which may come after the response the close should have cut short.
pub trait PeerClosed {
    /// The client closed its side and nothing it sent is left unread.
    fn peer_closed(&self) -> bool;
}

impl PeerClosed for tokio::net::TcpStream {
    /// A peek that never blocks (the socket is non-blocking): no byte and no error is the
    /// end of the stream.
    fn peer_closed(&self) -> bool {
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        matches!(socket2::SockRef::from(self).peek(&mut byte), Ok(0))
    }
}

/// The engine's in-process tests: a close is heard when the stream is polled.
#[cfg(test)]
impl PeerClosed for tokio::io::DuplexStream {
    fn peer_closed(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_places_come_back() {
        let counts = Arc::new(PeerCounts::default());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = counts.take(ip("2001:db8:1:2::1"), 2).unwrap();
        let b = counts.take(ip("2001:db8:1:2:ffff::9"), 2).unwrap();
        assert!(counts.take(ip("2001:db8:1:2::77"), 2).is_none(), "the same /64");
        assert!(counts.take(ip("2001:db8:1:3::1"), 2).is_some(), "another /64");
        assert!(counts.take(ip("::ffff:192.0.2.1"), 1).is_some(), "IPv4-mapped counts as IPv4");
        drop((a, b));
        assert!(counts.take(ip("2001:db8:1:2::1"), 2).is_some());
        assert!(counts.0.lock().unwrap().is_empty(), "addresses without connections are forgotten");
    }
}

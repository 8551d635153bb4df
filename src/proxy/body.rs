//! A response's body as the proxy hands it to the wire: made here in full, or a server's
//! still to be read, carrying what the response holds until it has been sent (its
//! receipts: the request's concurrency slots, its access log line, what a gRPC call does
//! at its end) and its pace. It settles itself: the slots go back (a global one's release
//! awaited) before its last frame goes out, so the client never sees its response end
//! while a slot still counts it, and the log line is written then; a body dropped first
//! (its client gone) settles as it drops. HTTP/1 and HTTP/2 poll it alike
//! (`crate::wire::message::ResponseBody`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Frame, SizeHint};

use super::charge::Meter;
use super::pace::{self, Pacer};
use crate::access_log::Entry;
use crate::config::BodyRate;
use crate::gate::{Charges, Pending, Permits};
use crate::grpc::Code;
use crate::ids::RouteId;
use crate::metrics::Metrics;
use crate::upstream::UpstreamBody;
use crate::wire::http1::BodyError;
use crate::wire::message::{ResponseBody, Upgrade};

/// A response of the proxy (or the admin API).
pub type Response = crate::wire::message::Response<Settling>;

/// A response body that settles the request as it ends. Its state lives in one box made
/// with the response: a response is moved from the upstream client through the proxy
/// to the wire, and each move of a future or a result that holds it copies it whole. A
/// body made here with nothing to settle (a refusal, an error) is its bytes alone, with
/// no box: the box is made when something is given to it (`receipts`, `pace`).
pub struct Settling(Form);

enum Form {
    /// Made here, nothing held: sent as it is.
    Made(Bytes),
    Settles(Box<State>),
}

/// What a `Settling` body holds.
struct State {
    /// `None` once its last frame has been given.
    source: Option<Source>,
    /// What it holds until it has been sent; `None` until `carry` gives it (a server's
    /// body is made before the request's receipts are handed over: none is made and
    /// dropped in their place).
    receipts: Option<Receipts>,
    /// The release of global slots under way, and the frame (or end) it holds back
    /// (boxed, as the pace: both are rare, and every response carries room for them).
    releasing: Option<Box<(Release, Option<Frame<Bytes>>)>>,
    /// The body's pace (the route's `response_body_rate`), and what it read but did not
    /// give yet.
    pacer: Option<Box<Pacer>>,
    held: Bytes,
}

enum Source {
    /// Made here, in full (empty for no body).
    Full(Bytes),
    /// A server's, still to be read.
    Upstream(UpstreamBody),
}

type Release = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a response carries until it has been sent in full or the client went away: the
/// request's concurrency slots, and its access log line (written when dropped). Made
/// once, when the proxy's answer to a request is (`RequestCtx::settle`).
pub struct Receipts {
    pub permits: Permits,
    pub access: Option<Box<Entry>>,
    /// A tunnel made of this response (`101`) through which nothing moves this long is
    /// closed (the upstream's `tunnel_idle_timeout`).
    pub tunnel_idle_timeout: std::time::Duration,
    /// What the proxy does once a gRPC call's response has ended, with the `grpc-status`
    /// of its trailers (`None`: it ended without one, its client gone or its protocol
    /// unable to carry trailers): the charges its status kept, if any, are returned.
    pub grpc_end: Option<Box<GrpcEnd>>,
    /// What the response reports it cost, read for the limits that charge it.
    pub meter: Option<Box<Meter>>,
    /// The slots a live candidate holds for the request (`candidate`).
    pub candidate: Option<Box<Permits>>,
}

/// A gRPC call whose status comes in its trailers: counted in its route's metrics, and
/// its `count:` limits settled by that status, when it ends.
pub struct GrpcEnd {
    pub pending: Pending,
    pub metrics: Arc<Metrics>,
    pub route: RouteId,
    /// The status counted when the call ends without a `grpc-status`.
    pub status: u16,
}

impl GrpcEnd {
    /// The call ended with `code`: the charges its status kept, and what is to be settled
    /// in Redis.
    fn end(self, code: Option<Code>) -> (Option<Release>, Option<Charges>) {
        self.metrics.grpc(self.route, code);
        self.pending.settle(code.map_or(self.status, crate::grpc::counted_status))
    }
}

impl Default for Receipts {
    fn default() -> Self {
        Receipts {
            permits: Permits::default(),
            access: None,
            tunnel_idle_timeout: Receipts::TUNNEL_IDLE_TIMEOUT,
            grpc_end: None,
            meter: None,
            candidate: None,
        }
    }
}

impl Receipts {
    /// A tunnel's idle timeout where no upstream sets one.
    pub const TUNNEL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

    /// Nothing waits for the response's end: no slot, log line, gRPC end or meter.
    fn hold_nothing(&self) -> bool {
        self.permits.is_empty()
            && self.access.is_none()
            && self.grpc_end.is_none()
            && self.meter.is_none()
            && self.candidate.is_none()
    }

    /// The response's body ended with `trailers`: the gRPC status they carry goes to the
    /// access log line and to `grpc_end`; what it reported it cost is charged, the
    /// debit in Redis returned, to be awaited.
    fn ended(&mut self, trailers: Option<&HeaderMap>) -> Option<Release> {
        let code = trailers.and_then(crate::grpc::status);
        if let (Some(entry), Some(code)) = (&mut self.access, code) {
            entry.grpc_status = Some(code.0);
        }
        let (global, settled) = self.grpc_end.take().map_or((None, None), |end| end.end(code));
        let debit = self.meter.take().and_then(|meter| meter.end(trailers, settled));
        match (global, debit) {
            (global, None) => global,
            (None, Some(debit)) => Some(Box::pin(debit)),
            (Some(global), Some(debit)) => Some(Box::pin(async move {
                futures_util::future::join(global, debit).await;
            })),
        }
    }
}

impl Drop for Receipts {
    /// A call that ends without its trailers (the client went away) ends all the same,
    /// and a response that did is charged what it reported so far (or the default).
    fn drop(&mut self) {
        if let Some(debit) = self.ended(None)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(debit);
        }
    }
}

impl From<Bytes> for Settling {
    fn from(bytes: Bytes) -> Self {
        Settling(Form::Made(bytes))
    }
}

impl From<UpstreamBody> for Settling {
    fn from(body: UpstreamBody) -> Self {
        Settling::new(Source::Upstream(body))
    }
}

impl Settling {
    fn new(source: Source) -> Self {
        Settling(Form::Settles(Box::new(State {
            source: Some(source),
            receipts: None,
            releasing: None,
            pacer: None,
            held: Bytes::new(),
        })))
    }

    /// Its state, boxed now if it was bytes alone.
    fn state(&mut self) -> &mut State {
        if let Form::Made(bytes) = &mut self.0 {
            *self = Settling::new(Source::Full(std::mem::take(bytes)));
        }
        match &mut self.0 {
            Form::Settles(state) => state,
            Form::Made(_) => unreachable!("boxed above"),
        }
    }

    /// Gives the body what the response holds until it has been sent (`receipts`), and
    /// the pace it is sent at (`rate`). A body made here that is given nothing to hold
    /// stays its bytes alone.
    pub fn carry(&mut self, receipts: Receipts, rate: Option<BodyRate>) {
        if matches!(self.0, Form::Made(_)) && receipts.hold_nothing() && rate.is_none() {
            return;
        }
        let state = self.state();
        state.receipts = Some(receipts);
        state.pacer = rate.map(|rate| Box::new(Pacer::new(rate)));
    }

    /// Replaces the body by `bytes`, made here; what it holds stays.
    pub fn set_made(&mut self, bytes: Bytes) {
        match &mut self.0 {
            Form::Made(made) => *made = bytes,
            Form::Settles(state) => state.source = Some(Source::Full(bytes)),
        }
    }

    /// The body, when it was made here in full and not sent yet.
    pub fn made(&self) -> Option<&Bytes> {
        match &self.0 {
            Form::Made(bytes) => Some(bytes),
            Form::Settles(state) => match &state.source {
                Some(Source::Full(bytes)) => Some(bytes),
                _ => None,
            },
        }
    }
}

impl State {
    /// The body's last `data` (or none, and then its trailers, if it has any): what the
    /// response holds is settled first.
    fn end(&mut self, cx: &mut Context<'_>, data: Option<Bytes>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        // A body's trailers come once its data has ended (a poll that gave data did not
        // read them yet).
        let trailers = match (&mut self.source, &data) {
            (Some(Source::Upstream(body)), None) => body.trailers(),
            _ => None,
        };
        let debit = self.receipts.as_mut().and_then(|r| r.ended(trailers.as_ref()));
        self.source = None;
        let frame = data.map(Frame::data).or_else(|| trailers.map(Frame::trailers));
        self.settle(cx, frame, debit)
    }

    /// Gives `frame` (or the end) once the slots have gone back and what the response
    /// cost has been debited (`debit`); the access log line is written then.
    fn settle(
        &mut self,
        cx: &mut Context<'_>,
        frame: Option<Frame<Bytes>>,
        debit: Option<Release>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let release: Release = match (self.receipts.as_mut().and_then(|r| r.permits.finish()), debit) {
            (None, None) => {
                self.log();
                return Poll::Ready(frame.map(Ok));
            }
            (Some(release), None) => Box::pin(release),
            (None, Some(debit)) => debit,
            (Some(release), Some(debit)) => Box::pin(async move {
                futures_util::future::join(release, debit).await;
            }),
        };
        self.releasing = Some(Box::new((release, frame)));
        self.poll_released(cx)
    }

    /// The frame held back while global slots are released, once they are.
    fn poll_released(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let Some(releasing) = &mut self.releasing else { return Poll::Ready(None) };
        std::task::ready!(releasing.0.as_mut().poll(cx));
        let held = self.releasing.take().and_then(|releasing| releasing.1);
        self.log();
        Poll::Ready(held.map(Ok))
    }

    /// Writes the access log line, if one is written (dropping it writes it).
    fn log(&mut self) {
        if let Some(receipts) = &mut self.receipts {
            receipts.access = None;
        }
    }

    /// The next frame (see `hyper::body::Body::poll_frame`).
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self;
        if this.releasing.is_some() {
            return this.poll_released(cx);
        }
        if let (Some(pacer), false) = (&mut this.pacer, this.held.is_empty()) {
            // A paced body goes in steps of what was read, each once the pace allows it.
            let n = pace::piece_bytes(pacer.rate()).min(this.held.len());
            std::task::ready!(pacer.poll_send(cx, n));
            let step = this.held.split_to(n);
            if !this.held.is_empty() || this.source.is_some() {
                return Poll::Ready(Some(Ok(Frame::data(step))));
            }
            return this.end(cx, Some(step));
        }
        let (data, ends) = match &mut this.source {
            None => return Poll::Ready(None),
            Some(Source::Full(bytes)) => {
                let bytes = std::mem::take(bytes);
                (Some(bytes).filter(|b| !b.is_empty()), true)
            }
            Some(Source::Upstream(body)) => match std::task::ready!(body.poll_data(cx)) {
                Some(Ok(data)) => (Some(data), body.is_done()),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => (None, true),
            },
        };
        if let (Some(receipts), Some(data)) = (&mut this.receipts, &data) {
            if let Some(entry) = &mut receipts.access {
                entry.bytes += data.len() as u64;
            }
            if let Some(meter) = &mut receipts.meter {
                meter.feed(data);
            }
        }
        match data {
            Some(data) if this.pacer.is_some() => {
                this.held = data;
                if ends {
                    // (A body that ended with data has no trailers.)
                    this.source = None;
                }
                this.poll_frame(cx)
            }
            data if !ends => Poll::Ready(data.map(|d| Ok(Frame::data(d)))),
            data => this.end(cx, data),
        }
    }
}

impl hyper::body::Body for Settling {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().0 {
            // Its bytes, then the end (taken, they leave it empty).
            Form::Made(bytes) => {
                Poll::Ready(Some(std::mem::take(bytes)).filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b))))
            }
            Form::Settles(state) => state.poll_frame(cx),
        }
    }

    /// Nothing is left to give: no data, no trailers, nothing to settle first. A body
    /// made here and empty ends with the head (a gRPC answer made here is then a
    /// trailers-only response, as the protocol requires).
    fn is_end_stream(&self) -> bool {
        let state = match &self.0 {
            Form::Made(bytes) => return bytes.is_empty(),
            Form::Settles(state) => state,
        };
        let empty = match &state.source {
            None => true,
            Some(Source::Full(bytes)) => bytes.is_empty(),
            Some(Source::Upstream(_)) => false,
        };
        let leases = state.receipts.as_ref().is_some_and(|r| r.permits.holds_leases());
        state.releasing.is_none() && !leases && empty && state.held.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let state = match &self.0 {
            Form::Made(bytes) => return SizeHint::with_exact(bytes.len() as u64),
            Form::Settles(state) => state,
        };
        match &state.source {
            None => SizeHint::with_exact(state.held.len() as u64),
            Some(Source::Full(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Some(Source::Upstream(body)) => body.length().map_or_else(SizeHint::default, SizeHint::with_exact),
        }
    }
}

impl ResponseBody for Settling {
    fn poll_unsent(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let state = match &mut self.0 {
            Form::Made(bytes) => {
                *bytes = Bytes::new();
                return Poll::Ready(());
            }
            Form::Settles(state) => state,
        };
        if state.releasing.is_none() {
            state.source = None;
            state.held = Bytes::new();
            let debit = state.receipts.as_mut().and_then(|r| r.ended(None));
            if state.settle(cx, None, debit).is_ready() {
                return Poll::Ready(());
            }
        }
        state.poll_released(cx).map(|_| ())
    }

    fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let state = match &mut self.0 {
            Form::Made(bytes) => return Poll::Ready(bytes.is_empty()),
            Form::Settles(state) => state,
        };
        if state.releasing.is_none() {
            let over = match &state.source {
                None => true,
                Some(Source::Full(bytes)) => bytes.is_empty(),
                // Read to its end before anything was taken of it: a server's answer that
                // ended with its head (nothing was read yet, so no trailers either).
                Some(Source::Upstream(body)) => body.is_done(),
            };
            if !over || !state.held.is_empty() {
                return Poll::Ready(false);
            }
            state.source = None;
            let debit = state.receipts.as_mut().and_then(|r| r.ended(None));
            if state.settle(cx, None, debit).is_ready() {
                return Poll::Ready(true);
            }
        }
        state.poll_released(cx).map(|_| true)
    }

    fn upgrade(&mut self) -> Option<Upgrade> {
        let Form::Settles(state) = &mut self.0 else { return None };
        let Some(Source::Upstream(body)) = state.source.take() else { return None };
        let (io, read) = body.into_upgrade()?;
        let receipts = state.receipts.take().unwrap_or_default();
        Some(Upgrade { io: Box::new(io), read, idle: receipts.tunnel_idle_timeout, held: Box::new(receipts) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Body as _;

    /// Every frame `body` gives, polled to its end (a made body never waits, and gives
    /// its bytes in one frame).
    fn frames(mut body: Settling) -> Vec<Bytes> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut given = Vec::new();
        for _ in 0..3 {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => given.push(frame.into_data().expect("data")),
                Poll::Ready(None) => return given,
                other => panic!("a made body gave {:?}", other.map(|f| f.map(|f| f.map(|_| ())))),
            }
        }
        panic!("a made body did not end: {given:?}")
    }

    #[test]
    fn a_body_made_here_is_its_bytes_alone_until_it_holds_something() {
        let body = Settling::from(Bytes::from_static(b"Too Many Requests\n"));
        assert!(matches!(body.0, Form::Made(_)));
        assert_eq!(body.size_hint().exact(), Some(18));
        assert!(!body.is_end_stream());
        assert_eq!(frames(body), [Bytes::from_static(b"Too Many Requests\n")]);

        // Given receipts, it is boxed with its bytes, and gives the same.
        let mut body = Settling::from(Bytes::from_static(b"ok\n"));
        body.carry(Receipts::default(), None);
        assert!(matches!(body.0, Form::Made(_)), "given nothing to hold, it stays its bytes");
        body.state().receipts = Some(Receipts::default());
        assert!(matches!(body.0, Form::Settles(_)));
        assert_eq!(body.made().map(Bytes::as_ref), Some(&b"ok\n"[..]));
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(frames(body), [Bytes::from_static(b"ok\n")]);

        // Emptied (a gRPC answer made here), in either form: it ends with its head.
        let made = Settling::from(Bytes::from_static(b"x"));
        let mut boxed = Settling::from(Bytes::from_static(b"x"));
        boxed.state();
        for mut body in [made, boxed] {
            body.set_made(Bytes::new());
            assert!(body.is_end_stream());
            assert_eq!(body.size_hint().exact(), Some(0));
            assert_eq!(frames(body), Vec::<Bytes>::new());
        }
    }
}

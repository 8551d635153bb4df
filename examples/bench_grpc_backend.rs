//! The backend of the gRPC benchmark (`benches/grpc/run.sh`): a gRPC server over h2c on
//! one thread that answers every unary call with the message it was sent, then the
//! trailers `grpc-status: 0`, as any gRPC server frames a unary answer. Hand-framed on
//! hyper rather than a gRPC stack, so that pinned to one CPU beside the proxies it costs
//! what a lean server costs.
//!
//!     bench_grpc_backend 127.0.0.1:PORT

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(serve(&addr))
}

type Frames = std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>;

async fn serve(addr: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let service = service_fn(|req: Request<Incoming>| async move {
                // The call's one message, framed as it came (flag, length, message).
                let message = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                let frames: Frames = vec![Ok(Frame::data(message)), Ok(Frame::trailers(trailers))].into_iter();
                let mut response = Response::new(StreamBody::new(futures_util::stream::iter(frames)));
                response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                Ok::<_, Infallible>(response)
            });
            let _ = http2::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

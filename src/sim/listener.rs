//! The accept loop of one channel's ICOM listener: each TCP connection gets
//! its own task (optional mTLS handshake, then hyper HTTP/1.1), is counted
//! against its (ispb, channel) — at accept when that is known (a single ISPB,
//! or the client certificate's CN), else at its first request — and can be
//! reset (RST) by a fault. A connection that closes ends only the wait for
//! its answers: each request is handled to its end in a task of its own
//! (`routes::serve`), as a real server keeps a held long-poll it already took.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use cabine_actors::domain::ChannelId;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::der::subject_common_name;
use super::routes::{self, ConnCtx};
use super::state::Shared;

/// Longest wait for a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts until cancelled.
pub async fn serve(
    listener: TcpListener,
    channel: ChannelId,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, _peer)) => {
                let (shared, tls, cancel) = (shared.clone(), tls.clone(), cancel.clone());
                tokio::spawn(async move { connection(tcp, channel, shared, tls, cancel).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, channel = %channel, "simulator accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn connection(
    tcp: TcpStream,
    channel: ChannelId,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    cancel: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    // A second handle on the socket, to turn its close into an RST when a reset fault fires.
    let rst_handle = tcp.as_fd().try_clone_to_owned().ok();
    match tls {
        None => {
            let ctx = Arc::new(ConnCtx::new(shared.clone(), channel, None, cancel.clone()));
            if let Some(lane) = shared.sole_lane(channel) {
                ctx.attribute(lane);
            }
            http(tcp, ctx, rst_handle, cancel).await;
        }
        Some(acceptor) => {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, channel = %channel, "simulator TLS handshake refused");
                    return;
                }
                Err(_) => return,
            };
            let cn =
                stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(|c| subject_common_name(c));
            let ctx = Arc::new(ConnCtx::new(shared.clone(), channel, cn.clone(), cancel.clone()));
            if let Some(lane) = cn.as_deref().and_then(|cn| shared.lane(cn, channel)) {
                ctx.attribute(lane);
            }
            http(stream, ctx, rst_handle, cancel).await;
        }
    }
}

/// Serves HTTP/1.1 on one connection until it closes, is reset, or the simulator stops.
async fn http<IO>(io: IO, ctx: Arc<ConnCtx>, rst_handle: Option<OwnedFd>, cancel: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service_ctx = ctx.clone();
    let service = service_fn(move |req| {
        let ctx = service_ctx.clone();
        async move { Ok::<_, std::convert::Infallible>(routes::serve(req, ctx).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        // No idle timeout: a keep-alive connection stays until the client closes it.
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = conn => {}
        _ = ctx.reset.notified() => reset(rst_handle),
        _ = cancel.cancelled() => {}
    }
    ctx.closed();
}

/// Arms SO_LINGER 0 so that the close that follows sends an RST instead of a FIN.
fn reset(handle: Option<OwnedFd>) {
    let Some(fd) = handle else { return };
    if let Ok(socket) = TcpStream::from_std(std::net::TcpStream::from(fd)) {
        let _ = socket.set_zero_linger();
    }
}

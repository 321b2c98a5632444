//! Connections: the accept loop, and the limits a slow or hostile client meets.
//!
//! * A request's head must arrive within the read timeout of the server starting to wait for
//!   it (an idle kept-alive connection included); past that the connection is closed
//!   (hyper's header timeout, which needs a timer: `axum::serve` sets none, so a client
//!   sending headers that never end held its connection forever).
//! * The body's deadline is in [`crate::http`] (408, then close).
//! * A write that cannot go on for the write timeout (a client that stopped reading) ends the
//!   connection; the engine then sees the request's receiver gone and frees its slot. Until
//!   then a slow reader costs its buffered events (bounded by the request's token limit),
//!   never the engine's time: the engine sends into an unbounded channel and does not wait.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// `--timeout`'s default, as llama-server's: 600 seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Serve `app` on `listener` until `stop` completes; then stop accepting and wait for the open
/// connections to finish their requests. `timeout` (`--timeout`) bounds a request head's
/// arrival and a write's stall.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(timeout);
    let http = Arc::new(http);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Tokens are small writes that should leave at once.
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(WriteDeadline::new(stream, timeout));
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            // A connection's end (a timeout, a reset, a parse error hyper answered) concerns
            // that client only.
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// After a failed `accept`: a connection that died while queued is nothing; anything else
/// (out of file descriptors, say) is reported and retried after a pause rather than spun on.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused
    ) {
        return;
    }
    eprintln!("warning: accepting a connection failed: {e} (retrying in 1 s)");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// A TCP stream whose writes fail with `TimedOut` once one has been unable to proceed for
/// `limit`.
struct WriteDeadline {
    io: TcpStream,
    limit: Duration,
    /// The stall's deadline: one timer per connection, re-armed at each stall.
    deadline: Pin<Box<Sleep>>,
    /// Whether a write (or flush) is waiting on the client now.
    stalled: bool,
}

impl WriteDeadline {
    fn new(io: TcpStream, limit: Duration) -> WriteDeadline {
        WriteDeadline {
            io,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            stalled: false,
        }
    }

    /// What a write that returned `r` gives: the result, or, while it is pending, the timeout
    /// once the stall has lasted `limit`.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = false;
            return r;
        }
        if !self.stalled {
            self.stalled = true;
            self.deadline
                .as_mut()
                .reset(tokio::time::Instant::now() + self.limit);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing for {} s (--timeout)",
                    self.limit.as_secs_f64()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A peer that never reads: the writer fills the socket buffers, then times out.
    #[tokio::test]
    async fn a_write_the_peer_never_reads_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut w = WriteDeadline::new(server, Duration::from_millis(200));
        let chunk = vec![7u8; 1 << 16];
        // 64 MiB at most: far more than any socket buffers hold.
        let mut err = None;
        for _ in 0..1024 {
            if let Err(e) = w.write_all(&chunk).await {
                err = Some(e);
                break;
            }
        }
        let err = err.expect("64 MiB written to a peer that reads nothing: writes never stalled");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        drop(client);
    }

    /// A peer that reads keeps the writer going however long it takes in all: each stall
    /// shorter than the limit starts the count again.
    #[tokio::test]
    async fn a_slow_but_steady_reader_does_not_time_out() {
        use tokio::io::AsyncReadExt;
        // Small socket buffers (the accepted socket inherits the listener's), so that the
        // writer waits on the reader many times over.
        let listen = tokio::net::TcpSocket::new_v4().unwrap();
        listen.set_send_buffer_size(16 << 10).unwrap();
        listen.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listen.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let connect = tokio::net::TcpSocket::new_v4().unwrap();
        connect.set_recv_buffer_size(16 << 10).unwrap();
        let mut client = connect.connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let limit = Duration::from_millis(300);
        let mut w = WriteDeadline::new(server, limit);
        let total = 2usize << 20;
        let writer = tokio::spawn(async move {
            let chunk = vec![1u8; 1 << 16];
            for _ in 0..total / chunk.len() {
                w.write_all(&chunk).await?;
            }
            io::Result::Ok(())
        });
        // 2 MiB through buffers of a few tens of KiB, read 16 KiB per 10 ms: over a second in
        // all, four times the limit, and the writer waits on every read.
        let mut got = 0;
        let mut buf = vec![0u8; 16 << 10];
        while got < total {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got += n;
        }
        writer.await.unwrap().unwrap();
    }
}

//! A connection whose writes fail when the client does not take the bytes in time.
//!
//! hyper has a timeout for reading a request head but none for writing: 512 connections that
//! pipelined `GET /metrics` and never read held every connection slot for as long as they
//! stayed open. [`WriteTimeout`] fails a write (and so the connection, which hyper then
//! closes) that has made no progress for its timeout; hyper's own write buffer is bounded
//! (its `max_buf_size`), so what a connection holds unsent is bounded too.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `S` whose writes fail with [`io::ErrorKind::TimedOut`] after `timeout` without progress.
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Started when a write first found the socket full; reset by any progress.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteTimeout<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        WriteTimeout {
            inner,
            timeout,
            timer: None,
        }
    }

    /// `r` as it is when ready (progress: the timer stops); when pending, pending until the
    /// timer runs out, then a timeout error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let timeout = self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client took no response bytes for {} s (--write-timeout)",
                    timeout.as_secs()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A peer that reads nothing: writes succeed until the pipe is full, then fail after the
    /// timeout; a peer that reads keeps the connection going.
    #[tokio::test]
    async fn a_write_the_peer_does_not_take_times_out() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = WriteTimeout::new(a, Duration::from_millis(50));
        w.write_all(&[1; 1024]).await.unwrap();
        let e = w.write_all(&[2; 10]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let (a, mut b2) = tokio::io::duplex(1024);
        let mut w = WriteTimeout::new(a, Duration::from_millis(50));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b2.read_to_end(&mut got).await.unwrap();
            got.len()
        });
        w.write_all(&vec![3; 64 * 1024]).await.unwrap();
        drop(w);
        assert_eq!(reader.await.unwrap(), 64 * 1024);
        let mut rest = [0; 1];
        let _ = b.read(&mut rest).await;
    }
}

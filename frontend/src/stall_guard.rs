//! A write timeout for one connection: a client that stops reading (its socket buffers full, so
//! our writes stop making progress) for `limit` gets its connection closed. The response is
//! dropped with it, which cancels the generation in the daemon and frees its blocks; without
//! this, a stalled SSE client kept its request running to `max_tokens`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `S` with a deadline on every write that cannot proceed.
pub struct StallGuard<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write (or flush) is blocked; cleared by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// Called when a write returned `Pending`: `Err` once the stall has lasted `limit`.
    fn blocked(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                tracing::warn!(
                    "a client read nothing of its response for {limit:?} (--write-timeout); \
                     disconnecting it, which cancels its generation"
                );
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client read nothing for {limit:?}"),
                ))
            }
            Poll::Pending => Ok(()),
        }
    }

    fn progress<T>(
        &mut self,
        poll: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Pending => match self.blocked(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(poll, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(poll, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(poll, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_fails_the_write_after_the_limit_and_one_that_reads_does_not() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut guarded = StallGuard::new(ours, Duration::from_secs(5));
        // A reader keeping up: many times the buffer goes through, however long it takes.
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 6400];
            theirs.read_exact(&mut got).await.unwrap();
            theirs
        });
        for _ in 0..100 {
            guarded.write_all(&[7u8; 64]).await.unwrap();
        }
        let _theirs = reader.await.unwrap();
        // Nobody reads now: the buffer fills, and the write fails once 5 s pass.
        let started = Instant::now();
        let err = loop {
            if let Err(e) = guarded.write_all(&[1u8; 64]).await {
                break e;
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_secs(5));
    }
}

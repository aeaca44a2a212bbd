//! Length-prefixed frames over any async byte stream.
//!
//! A frame is a little-endian `u32` payload length followed by the payload (see [`crate::codec`]).
//! The length is checked against [`Limits::max_frame_bytes`] *before* anything is allocated, so a
//! peer claiming a 4 GiB frame costs us four bytes of reading and a [`FrameError::TooLarge`].
//!
//! After [`FrameError::Decode`] the stream is still in step (the whole frame was consumed), so a
//! server can answer with an error and keep the connection; every other error leaves the stream
//! unusable and the connection should be closed.
//!
//! A reader may have a frame deadline ([`FrameReader::with_frame_deadline`]): waiting for a frame
//! to begin is unbounded (an idle peer is fine), but once its first byte has come the rest must
//! follow within the deadline, so a peer that sends half a frame and stalls cannot hold the
//! connection open.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::StreamExt;
use serde::{Serialize, de::DeserializeOwned};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio_util::codec::FramedRead;

use crate::codec::{self, CodecError, HARD_MAX_FRAME_BYTES};
use crate::frame_codec::FrameDecoder;

/// How long the rest of a frame may take once its first byte has come, on the servers'
/// connections (a whole 4 MiB frame over a local socket takes milliseconds).
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);

/// Size limits for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload accepted or sent, in bytes (capped at [`HARD_MAX_FRAME_BYTES`]).
    pub max_frame_bytes: usize,
}

impl Limits {
    /// The default limit: 4 MiB, room for an `Acquire` of ~100k block hashes.
    pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

    /// Limits with `max_frame_bytes`, capped at the hard ceiling.
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            max_frame_bytes: max_frame_bytes.clamp(64, HARD_MAX_FRAME_BYTES),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(Self::DEFAULT_MAX_FRAME_BYTES)
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// The length prefix is over the limit; nothing was allocated and the stream is out of step.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The whole frame was read but its payload is not a valid message (stream still in step).
    #[error("{0}")]
    Decode(CodecError),
    /// A message we were asked to send could not be encoded.
    #[error("{0}")]
    Encode(CodecError),
    /// A frame began but did not arrive whole within the reader's frame deadline.
    #[error("a frame began but did not arrive whole within {0:?}")]
    Stalled(Duration),
}

impl FrameError {
    /// True when the connection can go on after this error (the bad frame was consumed whole).
    pub fn is_recoverable(&self) -> bool {
        matches!(self, FrameError::Decode(_))
    }
}

/// Reads frames from the receive side of a stream (buffered: a small frame costs one read).
/// Cancel-safe ([`crate::frame_codec`]): a read raced in `select!` loses nothing.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: FramedRead<R, FrameDecoder>,
    frame: BytesMut,
    frame_deadline: Option<Duration>,
    /// When the frame now arriving began (its first bytes are buffered).
    begun: Option<Instant>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, limits: Limits) -> Self {
        let decoder = FrameDecoder {
            max: limits.max_frame_bytes,
        };
        Self {
            inner: FramedRead::with_capacity(inner, decoder, 64 * 1024),
            frame: BytesMut::new(),
            frame_deadline: None,
            begun: None,
        }
    }

    /// Once a frame has begun, its rest must arrive within `deadline`, else
    /// [`FrameError::Stalled`] (the stream is then out of step: close it).
    pub fn with_frame_deadline(mut self, deadline: Duration) -> Self {
        self.frame_deadline = Some(deadline);
        self
    }

    /// Reads one whole frame's payload. `Ok(None)` is a clean end of stream between frames.
    pub async fn read_payload(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let next = match self.frame_deadline {
            None => self.inner.next().await,
            Some(limit) => self.next_within(limit).await?,
        };
        self.begun = None;
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(e),
            Some(Ok(frame)) => {
                self.frame = frame;
                Ok(Some(&self.frame))
            }
        }
    }

    /// The next frame, failing once one has begun and not come whole within `limit`. Whether
    /// a frame has begun is looked at every `limit / 8` while none has.
    async fn next_within(
        &mut self,
        limit: Duration,
    ) -> Result<Option<Result<BytesMut, FrameError>>, FrameError> {
        let look = (limit / 8).max(Duration::from_millis(10));
        loop {
            if self.begun.is_none() && !self.inner.read_buffer().is_empty() {
                self.begun = Some(Instant::now());
            }
            let wake = match self.begun {
                Some(t) => t + limit,
                None => Instant::now() + look,
            };
            tokio::select! {
                next = self.inner.next() => return Ok(next),
                _ = tokio::time::sleep_until(wake.into()) => {
                    if self.begun.is_some_and(|t| t.elapsed() >= limit) {
                        return Err(FrameError::Stalled(limit));
                    }
                }
            }
        }
    }

    /// Reads and decodes one message. `Ok(None)` is a clean end of stream between frames.
    pub async fn read_frame<M: DeserializeOwned>(&mut self) -> Result<Option<M>, FrameError> {
        match self.read_payload().await? {
            None => Ok(None),
            Some(bytes) => codec::decode(bytes).map(Some).map_err(FrameError::Decode),
        }
    }
}

/// Writes frames to the send side of a stream.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    limits: Limits,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W, limits: Limits) -> Self {
        Self {
            inner,
            limits,
            buf: Vec::new(),
        }
    }

    /// Encodes and sends one message as a single frame (one `write_all`, then flush).
    pub async fn write_frame<M: Serialize>(&mut self, msg: &M) -> Result<(), FrameError> {
        let payload = codec::encode(msg).map_err(FrameError::Encode)?;
        self.write_payload(&payload).await
    }

    /// Sends raw payload bytes as one frame (tests use it to send garbage on purpose).
    pub async fn write_payload(&mut self, payload: &[u8]) -> Result<(), FrameError> {
        if payload.len() > self.limits.max_frame_bytes {
            return Err(FrameError::TooLarge {
                len: payload.len(),
                max: self.limits.max_frame_bytes,
            });
        }
        self.buf.clear();
        self.buf
            .extend_from_slice(&(payload.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(payload);
        self.inner.write_all(&self.buf).await?;
        self.inner.flush().await?;
        Ok(())
    }

    /// Writes raw bytes with no framing at all (for tests of hostile peers).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        self.inner.write_all(bytes).await?;
        self.inner.flush().await?;
        Ok(())
    }

    /// Shuts the send side down (the peer sees end of stream).
    pub async fn shutdown(&mut self) -> Result<(), FrameError> {
        self.inner.shutdown().await?;
        Ok(())
    }
}

/// Both directions of one stream, for strict request/response conversations.
#[derive(Debug)]
pub struct Connection<S> {
    reader: FrameReader<ReadHalf<S>>,
    writer: FrameWriter<WriteHalf<S>>,
}

impl<S: AsyncRead + AsyncWrite> Connection<S> {
    /// Wraps `stream`.
    pub fn new(stream: S, limits: Limits) -> Self {
        let (r, w) = tokio::io::split(stream);
        Self {
            reader: FrameReader::new(r, limits),
            writer: FrameWriter::new(w, limits),
        }
    }

    /// See [`FrameReader::with_frame_deadline`].
    pub fn with_frame_deadline(mut self, deadline: Duration) -> Self {
        self.reader = self.reader.with_frame_deadline(deadline);
        self
    }

    /// Reads one message; `Ok(None)` is a clean end of stream.
    pub async fn read_frame<M: DeserializeOwned>(&mut self) -> Result<Option<M>, FrameError> {
        self.reader.read_frame().await
    }

    /// Sends one message.
    pub async fn write_frame<M: Serialize>(&mut self, msg: &M) -> Result<(), FrameError> {
        self.writer.write_frame(msg).await
    }

    /// Splits into halves that can live in different tasks.
    pub fn into_split(self) -> (FrameReader<ReadHalf<S>>, FrameWriter<WriteHalf<S>>) {
        (self.reader, self.writer)
    }

    /// The send half, for writing raw bytes in tests.
    pub fn writer(&mut self) -> &mut FrameWriter<WriteHalf<S>> {
        &mut self.writer
    }

    /// The receive half.
    pub fn reader(&mut self) -> &mut FrameReader<ReadHalf<S>> {
        &mut self.reader
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_clean_eof_is_none() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Connection::new(a, Limits::default());
        let mut b = Connection::new(b, Limits::default());
        a.write_frame(&("hello", 42u64)).await.unwrap();
        let got: Option<(String, u64)> = b.read_frame().await.unwrap();
        assert_eq!(got, Some(("hello".into(), 42)));
        drop(a);
        assert!(b.read_frame::<u8>().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn oversized_prefix_is_refused_before_allocation() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Connection::new(a, Limits::default());
        let mut b = Connection::new(b, Limits::new(1024));
        a.writer().write_raw(&u32::MAX.to_le_bytes()).await.unwrap();
        match b.read_frame::<u8>().await {
            Err(FrameError::TooLarge { len, max }) => {
                assert_eq!(len, u32::MAX as usize);
                assert_eq!(max, 1024);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn garbage_payload_is_recoverable_and_stream_stays_in_step() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Connection::new(a, Limits::default());
        let mut b = Connection::new(b, Limits::default());
        a.writer().write_payload(&[0xFF, 0xFF, 0xFF]).await.unwrap();
        a.write_frame(&7u32).await.unwrap();
        let err = b.read_frame::<(u32, u32)>().await.unwrap_err();
        assert!(err.is_recoverable(), "{err}");
        assert_eq!(b.read_frame::<u32>().await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn eof_inside_a_frame_is_truncated() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Connection::new(a, Limits::default());
        let mut b = Connection::new(b, Limits::default());
        a.writer().write_raw(&[10, 0, 0, 0, 1, 2]).await.unwrap();
        drop(a);
        assert!(matches!(
            b.read_frame::<u8>().await,
            Err(FrameError::Truncated)
        ));
    }

    #[tokio::test]
    async fn a_stalled_frame_ends_at_the_deadline_and_an_idle_peer_does_not() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Connection::new(a, Limits::default());
        let (r, _w) = Connection::new(b, Limits::default()).into_split();
        let mut r = r.with_frame_deadline(Duration::from_millis(100));
        // Idle for longer than the deadline, then a whole frame: fine.
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            a.write_frame(&9u32).await.unwrap();
            // Then half a length prefix, and nothing more.
            a.writer().write_raw(&[8, 0]).await.unwrap();
            a
        });
        assert_eq!(r.read_frame::<u32>().await.unwrap(), Some(9));
        let _a = late.await.unwrap();
        let begun = std::time::Instant::now();
        assert!(matches!(
            r.read_frame::<u32>().await,
            Err(FrameError::Stalled(_))
        ));
        assert!(begun.elapsed() >= Duration::from_millis(100));
    }
}

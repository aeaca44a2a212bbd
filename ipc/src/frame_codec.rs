//! The frame format as a `tokio_util` decoder: a little-endian `u32` payload length, then the
//! payload. The length is checked against the limit before anything is reserved for it, so a
//! peer claiming a 4 GiB frame costs four bytes of reading. Reads through a
//! [`tokio_util::codec::FramedRead`] of this are cancel-safe: bytes of a frame that has not
//! arrived whole stay in its buffer.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

use crate::connection::FrameError;

/// Decodes frames of at most `max` payload bytes.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    pub max: usize,
}

impl Decoder for FrameDecoder {
    type Item = BytesMut;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        let Some(prefix) = src.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > self.max {
            return Err(FrameError::TooLarge { len, max: self.max });
        }
        if src.len() < 4 + len {
            src.reserve(4 + len - src.len());
            return Ok(None);
        }
        src.advance(4);
        Ok(Some(src.split_to(len)))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(FrameError::Truncated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_whole_however_the_bytes_are_split() {
        let mut d = FrameDecoder { max: 16 };
        let mut buf = BytesMut::new();
        for b in [3u8, 0, 0, 0, b'a', b'b'] {
            buf.extend_from_slice(&[b]);
            assert!(d.decode(&mut buf).unwrap().is_none());
        }
        buf.extend_from_slice(&[b'c', 0, 0]);
        assert_eq!(&d.decode(&mut buf).unwrap().unwrap()[..], b"abc");
        assert!(d.decode(&mut buf).unwrap().is_none());
        assert!(matches!(d.decode_eof(&mut buf), Err(FrameError::Truncated)));
    }

    #[test]
    fn an_oversized_length_is_refused_before_anything_is_reserved() {
        let mut d = FrameDecoder { max: 16 };
        let mut buf = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        assert!(matches!(
            d.decode(&mut buf),
            Err(FrameError::TooLarge { len, max: 16 }) if len == u32::MAX as usize
        ));
        assert!(buf.capacity() < 1024);
    }
}

//! The payload encoding: bincode 2.x over serde.
//!
//! This is the only module that names `bincode`; moving to another format is a change here alone.
//! Decoding is bounded: bincode's byte limit makes it refuse a claimed container length larger
//! than the bytes that could possibly follow, so a lying length inside a payload cannot make us
//! allocate its claimed size.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use serde::{Serialize, de::DeserializeOwned};

/// The absolute ceiling for one payload, whatever a process configures (see
/// [`crate::Limits::max_frame_bytes`]).
pub const HARD_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

type Config = Configuration<LittleEndian, Varint, Limit<HARD_MAX_FRAME_BYTES>>;

fn config() -> Config {
    bincode::config::standard().with_limit::<HARD_MAX_FRAME_BYTES>()
}

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("cannot encode message: {0}")]
    Encode(String),
    #[error("cannot decode message: {0}")]
    Decode(String),
    #[error("cannot decode message: {0} trailing bytes after the message")]
    Trailing(usize),
}

/// Encodes one message into a fresh payload.
pub fn encode<M: Serialize>(msg: &M) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(msg, config()).map_err(|e| CodecError::Encode(e.to_string()))
}

/// Decodes one message that must fill `bytes` exactly.
pub fn decode<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, CodecError> {
    let (msg, used) = decode_prefix(bytes)?;
    if used != bytes.len() {
        return Err(CodecError::Trailing(bytes.len() - used));
    }
    Ok(msg)
}

/// Decodes a message from the start of `bytes`, returning it and how many bytes it used.
/// Used to read a leading field (the protocol version) from a payload whose rest may not decode.
pub fn decode_prefix<M: DeserializeOwned>(bytes: &[u8]) -> Result<(M, usize), CodecError> {
    bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| CodecError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_trailing_bytes() {
        let msg = (7u32, String::from("x"), vec![1u64, 2, 3]);
        let mut bytes = encode(&msg).unwrap();
        assert_eq!(decode::<(u32, String, Vec<u64>)>(&bytes).unwrap(), msg);
        bytes.push(0);
        assert!(matches!(
            decode::<(u32, String, Vec<u64>)>(&bytes),
            Err(CodecError::Trailing(1))
        ));
    }

    #[test]
    fn a_lying_container_length_is_refused_without_allocating_it() {
        // Varint 0xFD prefix = u64 length follows; claim 2^60 elements with nothing after.
        let mut bytes = vec![0xFD];
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(decode::<Vec<u64>>(&bytes).is_err());
    }
}

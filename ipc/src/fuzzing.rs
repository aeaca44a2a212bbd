//! Fuzzing entry points (used by `fuzz/` and by the corpus replay test): arbitrary bytes as
//! frames and payloads of every message type. Decoding must return errors, never panic, and
//! never allocate more than the frame limit.

use crate::codec::decode;
use crate::proto::admin::{AdminReply, AdminRequest};
use crate::proto::cache::{CacheToDaemon, DaemonToCache};
use crate::proto::daemon::{DaemonToFrontend, FrontendToDaemon};
use crate::{FrameReader, Hello, HelloReply, Limits};

/// Decodes `data` as a payload of each message type.
pub fn payloads(data: &[u8]) {
    let _ = decode::<Hello>(data);
    let _ = decode::<HelloReply>(data);
    let _ = decode::<DaemonToCache>(data);
    let _ = decode::<CacheToDaemon>(data);
    let _ = decode::<AdminRequest>(data);
    let _ = decode::<AdminReply>(data);
    let _ = decode::<FrontendToDaemon>(data);
    let _ = decode::<DaemonToFrontend>(data);
}

/// Reads `data` as a stream of length-prefixed frames (1 MiB limit), decoding each frame as
/// the message type its position picks, until the stream ends or a frame is refused.
pub fn frames(data: &[u8]) {
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(_) => return,
    };
    runtime.block_on(async {
        let mut reader = FrameReader::new(data, Limits::new(1 << 20));
        for i in 0..64usize {
            let result = match i % 4 {
                0 => reader
                    .read_frame::<DaemonToCache>()
                    .await
                    .map(|m| m.is_some()),
                1 => reader
                    .read_frame::<AdminRequest>()
                    .await
                    .map(|m| m.is_some()),
                2 => reader
                    .read_frame::<FrontendToDaemon>()
                    .await
                    .map(|m| m.is_some()),
                _ => reader.read_frame::<Hello>().await.map(|m| m.is_some()),
            };
            match result {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) if e.is_recoverable() => {}
                Err(_) => return,
            }
        }
    });
}

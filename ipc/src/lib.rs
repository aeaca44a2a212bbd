//! Everything the mlxcel processes share on the wire.
//!
//! Every process (`mlxcel-cachemgr`, `mlxcel-daemon`, `mlxcel-frontend`, `mlxcelctl`) talks over
//! local sockets using one framing (a little-endian `u32` length, then a `bincode` payload) and the
//! message enums defined here, once, so client and server can never disagree on a shape.
//!
//! # Layout
//! - [`codec`]: the only place that knows the payload encoding (bincode 2 + serde).
//! - [`connection`]: [`FrameReader`] / [`FrameWriter`] / [`Connection`]: length-prefixed frames
//!   with a hard size limit; framing never leaks into command logic. [`frame_codec`]: the frame
//!   decoder its reads use (the limit checked before anything is reserved).
//! - [`hello`]: the handshake every connection starts with, and the protocol version;
//!   [`handshake`]: its server side (peer uid check included).
//! - [`proto`]: the conversations: daemon ↔ cache manager ([`proto::cache`]) and admin
//!   (ctl, frontend) ↔ cache manager ([`proto::admin`]), plus the shared error body.
//! - [`geometry`]: model KV geometry and the one formula for a block's real size in bytes.
//! - [`block_hash`]: [`BlockHash`], the chained hash that names a block of tokens.
//! - [`runtime_dir`]: the private socket directory and socket paths.
//! - [`client`]: connecting with a handshake, and [`client::AdminClient`]; [`reconnect`]: keeping
//!   one client connection up with backoff.
//! - [`socket`]: binding (stale-socket removal, 0600), connecting, and the peer uid check.
//! - [`signals`]: SIGTERM / SIGINT as a future; [`lifeline`]: a supervised child's end with its
//!   supervisor.
//! - [`size`]: parsing and printing byte sizes (`512MiB`, `2GiB`).
//! - [`fuzzing`]: arbitrary bytes through every decoder (for `fuzz/` and its corpus replay).

pub mod block_hash;
pub mod client;
pub mod codec;
pub mod connection;
pub mod frame_codec;
pub mod fuzzing;
pub mod geometry;
pub mod handshake;
pub mod hello;
pub mod lifeline;
pub mod proto;
pub mod reconnect;
pub mod runtime_dir;
pub mod signals;
pub mod size;
pub mod socket;

pub use block_hash::{BlockHash, HashKey, HashSeed};
pub use connection::{Connection, FRAME_DEADLINE, FrameError, FrameReader, FrameWriter, Limits};
pub use geometry::{Dtype, Geometry};
pub use hello::{Hello, HelloReply, PROTOCOL_VERSION, Role};

/// A block's index in the daemon's KV pool (one id indexes every layer's pool tensor).
pub type BlockId = u32;

/// A token id, as the model's vocabulary numbers it.
pub type TokenId = u32;

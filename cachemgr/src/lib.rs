//! The mlxcel cache manager: the authority on which KV blocks the prompt cache retains.
//!
//! It keeps a real-byte ledger (blocks × a block size it computes itself from the daemon's
//! geometry), a prefix tree of cached blocks, leases that pin prefixes for running requests, and
//! the eviction policy that keeps `retained + releasing ≤ capacity`. It has no MLX in it and
//! builds and tests in seconds.
//!
//! # Layout
//! - [`index`]: the block tree keyed by `BlockHash`, with an O(1) LRU over unpinned leaves.
//! - [`leases`], [`releases`]: pins held for requests; releases awaiting acknowledgement.
//! - [`pins`]: prefixes requests asked to keep for a while (`cache_control`), within a share.
//! - [`policy`]: capacity, max blocks, TTL and timeouts.
//! - [`cache`]: [`Cache`], the whole state and every decision, with no I/O.
//! - [`server`]: the socket listener, per-connection handlers and the task that owns the cache.
//! - [`config`]: command-line flags and their environment variables.
//! - [`hash_key`]: the installation's secret that keys block hashes.

pub mod cache;
pub mod config;
pub mod hash_key;
pub mod index;
pub mod leases;
pub mod pins;
pub mod policy;
pub mod releases;
pub mod server;

pub use cache::Cache;
pub use policy::Policy;

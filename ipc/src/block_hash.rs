//! [`BlockHash`]: the name of a full block of tokens in a given context.
//!
//! A block's hash chains its parent's hash, its token ids and a seed made of the model id and an
//! optional cache salt, so equal hashes mean equal tokens *and* equal everything before them.
//! The seed is keyed with the installation's secret [`HashKey`] (kept by the cache manager,
//! handed to the daemon when it registers), so no one can compute a block's hash, or the entry
//! id shown for it, from public inputs: guessing another tenant's prompt offline is out.
//! Everyone (daemon, tests, benchmarks) computes hashes with [`block_hashes`]; nothing else.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::TokenId;

/// A 256-bit BLAKE3 chained hash of a block.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

/// On the wire a hash is one 32-byte string (a length and a copy), not 32 separate elements:
/// acquire requests carry one hash per prompt block, so this is the hot path of decoding.
impl Serialize for BlockHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for BlockHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(Bytes32).map(BlockHash)
    }
}

/// Exactly 32 bytes, sent as one byte string.
struct Bytes32;

impl Visitor<'_> for Bytes32 {
    type Value = [u8; 32];
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("32 bytes")
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<[u8; 32], E> {
        <[u8; 32]>::try_from(v).map_err(|_| E::invalid_length(v.len(), &self))
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<[u8; 32], E> {
        self.visit_bytes(&v)
    }
}

/// The installation's secret that keys every block hash (see the module docs). Its `Debug`
/// never shows the bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HashKey(pub [u8; 32]);

impl Serialize for HashKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for HashKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(Bytes32).map(HashKey)
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(..)")
    }
}

impl Hash for BlockHash {
    /// The value is already a uniform cryptographic hash: its first 8 bytes are a perfect
    /// table key (see [`BlockHashMap`]), so hashing it again would only cost time.
    fn hash<H: Hasher>(&self, state: &mut H) {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_le_bytes(first));
    }
}

/// A hasher that passes a [`BlockHash`]'s leading 64 bits through unchanged.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than BlockHash; fold them in FNV-style.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A hash map keyed by [`BlockHash`] with no re-hashing.
pub type BlockHashMap<V> = HashMap<BlockHash, V, BuildHasherDefault<PassThroughHasher>>;

impl BlockHash {
    /// Short hex form (first 8 bytes), used as an entry id in stats and by `mlxcelctl`.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", self.short())
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

/// What every block hash of one model (and salt) is seeded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashSeed {
    root: [u8; 32],
}

impl HashSeed {
    /// A seed for `model_id` and an optional cache salt (tenants with different salts never
    /// share blocks), keyed with the installation's `key`.
    pub fn new(key: &HashKey, model_id: &str, salt: Option<&str>) -> Self {
        let mut h = blake3::Hasher::new_keyed(&key.0);
        h.update(b"mlxcel block hash v2");
        h.update(&(model_id.len() as u64).to_le_bytes());
        h.update(model_id.as_bytes());
        match salt {
            Some(s) => {
                h.update(&[1]);
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
        Self {
            root: *h.finalize().as_bytes(),
        }
    }

    /// The hash of a block whose parent is `parent` (None for the first block).
    pub fn chain(&self, parent: Option<&BlockHash>, tokens: &[TokenId]) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(&self.root);
        match parent {
            Some(p) => {
                h.update(&[1]);
                h.update(&p.0);
            }
            None => {
                h.update(&[0]);
            }
        }
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockHash(*h.finalize().as_bytes())
    }
}

/// Hashes of every *full* block of `tokens` (a trailing partial block has no hash).
pub fn block_hashes(seed: &HashSeed, tokens: &[TokenId], block_tokens: usize) -> Vec<BlockHash> {
    let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_tokens.max(1));
    if block_tokens == 0 {
        return out;
    }
    for chunk in tokens.chunks_exact(block_tokens) {
        let next = seed.chain(out.last(), chunk);
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K: HashKey = HashKey([7; 32]);

    #[test]
    fn the_key_separates_hashes_and_is_never_printed() {
        let t = [1, 2, 3, 4];
        let a = block_hashes(&HashSeed::new(&K, "m", None), &t, 4);
        let b = block_hashes(&HashSeed::new(&HashKey([8; 32]), "m", None), &t, 4);
        assert_ne!(a, b);
        assert_eq!(format!("{K:?}"), "HashKey(..)");
        let bytes = crate::codec::encode(&K).unwrap();
        assert_eq!(crate::codec::decode::<HashKey>(&bytes).unwrap(), K);
    }

    #[test]
    fn partial_blocks_have_no_hash() {
        let seed = HashSeed::new(&K, "m", None);
        assert_eq!(block_hashes(&seed, &[1, 2, 3, 4, 5], 2).len(), 2);
        assert!(block_hashes(&seed, &[1], 2).is_empty());
    }

    #[test]
    fn model_and_salt_separate_hashes() {
        let t = [1, 2, 3, 4];
        let a = block_hashes(&HashSeed::new(&K, "m", None), &t, 4);
        let b = block_hashes(&HashSeed::new(&K, "n", None), &t, 4);
        let c = block_hashes(&HashSeed::new(&K, "m", Some("tenant")), &t, 4);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_hash_is_33_bytes_on_the_wire_and_a_short_one_is_refused() {
        let h = HashSeed::new(&K, "m", None).chain(None, &[1, 2, 3]);
        let bytes = crate::codec::encode(&h).unwrap();
        assert_eq!(bytes.len(), 33);
        assert_eq!(crate::codec::decode::<BlockHash>(&bytes).unwrap(), h);
        let short = crate::codec::encode(&vec![0u8; 31]).unwrap();
        assert!(crate::codec::decode::<BlockHash>(&short).is_err());
    }

    proptest! {
        #[test]
        fn shared_prefix_gives_shared_hashes_then_diverges(
            prefix in proptest::collection::vec(0u32..50_000, 8..64),
            a in 0u32..50_000, b in 0u32..50_000,
        ) {
            prop_assume!(a != b);
            let seed = HashSeed::new(&K, "m", None);
            let bt = 4;
            let full = prefix.len() / bt * bt;
            let mut x = prefix[..full].to_vec();
            let mut y = x.clone();
            x.extend([a; 4]);
            y.extend([b; 4]);
            let hx = block_hashes(&seed, &x, bt);
            let hy = block_hashes(&seed, &y, bt);
            prop_assert_eq!(&hx[..full / bt], &hy[..full / bt]);
            prop_assert_ne!(hx.last(), hy.last());
        }
    }
}

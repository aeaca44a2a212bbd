//! Ids for responses, messages and tool calls: a prefix and 24 characters, unique across
//! processes and restarts (a counter and the clock, mixed by BLAKE3).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A fresh id such as `call_3kT9...` (`prefix`, `_`, 24 base-62 characters).
pub fn fresh(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hasher = blake3::Hasher::new();
    hasher.update(&n.to_le_bytes());
    hasher.update(&nanos.to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    let digest = hasher.finalize();
    let body: String = digest.as_bytes()[..24]
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    format!("{prefix}_{body}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_fresh_and_shaped() {
        let a = super::fresh("call");
        let b = super::fresh("call");
        assert_ne!(a, b);
        assert!(a.starts_with("call_") && a.len() == 29, "{a}");
        assert!(a[5..].bytes().all(|c| c.is_ascii_alphanumeric()));
    }
}

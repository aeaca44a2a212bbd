//! A structural check of a GGUF file before MLX reads it. MLX's GGUF reader trusts the
//! file's counts and offsets, and a damaged file with a valid magic number can crash the
//! process; this walks the header, metadata and tensor table in Rust, checking every length
//! and offset against the file's size, so damage is a clear error instead.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// GGUF metadata value types.
const STRING: u32 = 8;
const ARRAY: u32 = 9;
/// The default alignment of the tensor data section.
const DEFAULT_ALIGNMENT: u64 = 32;

struct Cursor<R> {
    inner: R,
    /// Bytes read so far.
    pos: u64,
    size: u64,
}

impl<R: Read> Cursor<R> {
    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, String> {
        if n > self.size.saturating_sub(self.pos) {
            return Err(format!(
                "{what} needs {n} bytes at offset {} but the file has {}",
                self.pos, self.size
            ));
        }
        let mut buf = vec![0; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| format!("reading {what}: {e}"))?;
        self.pos += n;
        Ok(buf)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.bytes(8, what)?;
        let mut a = [0; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(what)?;
        let b = self.bytes(len, what)?;
        String::from_utf8(b).map_err(|_| format!("{what} is not UTF-8"))
    }

    /// Skips one value of `kind` (returning it as a number when it is one, for alignment).
    fn value(&mut self, kind: u32, what: &str, depth: u32) -> Result<Option<u64>, String> {
        let fixed = |k: u32| match k {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        match kind {
            STRING => self.string(what).map(|_| None),
            ARRAY if depth == 0 => {
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                match fixed(elem) {
                    Some(width) => {
                        let total = count
                            .checked_mul(width)
                            .ok_or_else(|| format!("{what}: array of {count} is too long"))?;
                        self.bytes(total, what).map(|_| None)
                    }
                    None => {
                        for _ in 0..count {
                            self.value(elem, what, depth + 1)?;
                        }
                        Ok(None)
                    }
                }
            }
            k => match fixed(k) {
                Some(width) => {
                    let b = self.bytes(width, what)?;
                    let mut a = [0; 8];
                    a[..b.len()].copy_from_slice(&b);
                    Ok(Some(u64::from_le_bytes(a)))
                }
                None => Err(format!("{what} has unknown value type {k}")),
            },
        }
    }
}

/// Bytes per block and elements per block of the ggml tensor types MLX can read.
fn block_size(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (4, 1),   // F32
        1 => (2, 1),   // F16
        2 => (18, 32), // Q4_0
        3 => (20, 32), // Q4_1
        8 => (34, 32), // Q8_0
        30 => (2, 1),  // BF16
        _ => return None,
    })
}

/// Checks the structure of the GGUF file at `path`.
pub fn check(path: &Path) -> Result<(), String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut c = Cursor {
        inner: BufReader::new(file),
        pos: 0,
        size,
    };
    if c.bytes(4, "the magic number")? != b"GGUF" {
        return Err("not a GGUF file (no GGUF magic number)".into());
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version} is not supported (2 or 3)"));
    }
    let tensors = c.u64("the tensor count")?;
    let kvs = c.u64("the metadata count")?;
    // Every entry takes at least 12 bytes: counts beyond the file are damage.
    if tensors.max(kvs) > size / 12 {
        return Err(format!(
            "the header claims {tensors} tensors and {kvs} metadata entries, more than the file can hold"
        ));
    }
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..kvs {
        let key = c.string(&format!("metadata key {i}"))?;
        let kind = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(kind, &format!("the value of `{key}`"), 0)?;
        if key == "general.alignment" {
            alignment = value
                .filter(|&a| a > 0 && a.is_power_of_two())
                .ok_or_else(|| "general.alignment is not a power of two".to_string())?;
        }
    }
    let mut extents = Vec::new();
    for i in 0..tensors {
        let name = c.string(&format!("tensor name {i}"))?;
        let dims = c.u32(&format!("the rank of `{name}`"))?;
        if dims > 8 {
            return Err(format!("tensor `{name}` has rank {dims}"));
        }
        let mut elements: u64 = 1;
        for _ in 0..dims {
            let d = c.u64(&format!("a dimension of `{name}`"))?;
            elements = elements
                .checked_mul(d)
                .ok_or_else(|| format!("tensor `{name}` is impossibly large"))?;
        }
        let kind = c.u32(&format!("the type of `{name}`"))?;
        let offset = c.u64(&format!("the offset of `{name}`"))?;
        extents.push((name, kind, elements, offset));
    }
    let data_start = c.pos.div_ceil(alignment) * alignment;
    for (name, kind, elements, offset) in extents {
        let bytes = match block_size(kind) {
            Some((block_bytes, block_elems)) => elements.div_ceil(block_elems) * block_bytes,
            None => 0,
        };
        let end = data_start
            .checked_add(offset)
            .and_then(|s| s.checked_add(bytes))
            .unwrap_or(u64::MAX);
        if end > size {
            return Err(format!(
                "tensor `{name}` ends at byte {end} but the file has {size}: the file is truncated or damaged"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn header(tensors: u64, kvs: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(kvs.to_le_bytes());
        b
    }

    #[test]
    fn damaged_headers_are_refused_with_the_reason() {
        let (_d, p) = write(b"GGUF\x03\x00\x00\x00 this is not a model");
        assert!(
            check(&p)
                .unwrap_err()
                .contains("more than the file can hold")
        );
        let mut b = header(0, 1);
        b.extend(1000u64.to_le_bytes());
        b.extend(b"short");
        let (_d, p) = write(&b);
        assert!(check(&p).unwrap_err().contains("metadata key 0"));
        let mut b = header(1, 0);
        b.extend(1u64.to_le_bytes());
        b.push(b'w');
        b.extend(1u32.to_le_bytes());
        b.extend(4096u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let (_d, p) = write(&b);
        assert!(check(&p).unwrap_err().contains("tensor `w` ends at byte"));
        let (_d, p) = write(b"NOPE");
        assert!(check(&p).unwrap_err().contains("magic"));
    }

    #[test]
    fn a_well_formed_file_passes() {
        let mut b = header(1, 1);
        b.extend(17u64.to_le_bytes());
        b.extend(b"general.alignment");
        b.extend(4u32.to_le_bytes());
        b.extend(32u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.push(b'w');
        b.extend(1u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend([0u8; 16]);
        let (_d, p) = write(&b);
        assert_eq!(check(&p), Ok(()));
    }
}

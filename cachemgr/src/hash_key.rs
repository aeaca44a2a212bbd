//! The installation's secret block-hash key: 32 random bytes in a file only its owner may read
//! (0600, in a 0700 directory), created on first start and read on every later one, so block
//! hashes stay the same across restarts and cannot be computed by anyone else.
//!
//! The file is written under a temporary name and linked into place, so managers starting at
//! once agree on one key and none reads a half-written file.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use mlxcel_ipc::HashKey;

/// Where the key lives by default: `$XDG_STATE_HOME/mlxcel/hash-key`, else
/// `~/.local/state/mlxcel/hash-key` (`~/Library/Application Support/mlxcel/hash-key` on macOS).
pub fn default_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let state = if cfg!(target_os = "macos") {
        home.map(|h| h.join("Library/Application Support"))
    } else {
        std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| home.map(|h| h.join(".local/state")))
    };
    state.map(|s| s.join("mlxcel").join("hash-key"))
}

/// A key from the operating system's randomness.
pub fn random() -> io::Result<HashKey> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(HashKey(bytes))
}

/// Reads the key at `path`, creating it (and its directory, 0700) when there is none.
pub fn load_or_create(path: &Path) -> Result<HashKey, String> {
    let shown = path.display();
    match read(path) {
        Ok(key) => return Ok(key),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("hash key file {shown}: {e}")),
    }
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let key = random().map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = write_new(&temp, &key).and_then(|()| fs::hard_link(&temp, path));
    let _ = fs::remove_file(&temp);
    match written {
        Ok(()) => {
            tracing::info!(file = %shown, "created the block-hash key");
            Ok(key)
        }
        // Another manager linked its key first: use that one.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read(path).map_err(|e| format!("hash key file {shown}: {e}"))
        }
        Err(e) => Err(format!("cannot write hash key file {shown}: {e}")),
    }
}

/// Reads a key file, refusing one that others could read or replace.
fn read(path: &Path) -> io::Result<HashKey> {
    let meta = fs::symlink_metadata(path)?;
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            why.to_string(),
        ))
    };
    if !meta.file_type().is_file() {
        return refuse("is not a regular file (a symlink?); remove it to create a new key");
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return refuse("belongs to another user");
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return refuse("is readable or writable by other users: chmod 600 it");
    }
    let text = fs::read_to_string(path)?;
    parse(text.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "does not hold 64 hex digits; remove it to create a new key (cached blocks are lost)",
        )
    })
}

fn write_new(path: &Path, key: &HashKey) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let hex: String = key.0.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(f, "{hex}")?;
    f.sync_all()
}

fn parse(hex: &str) -> Option<HashKey> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(HashKey(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_once_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/mlxcel/hash-key");
        let a = load_or_create(&path).unwrap();
        let b = load_or_create(&path).unwrap();
        assert_eq!(a, b);
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_ne!(a, random().unwrap());
    }

    #[test]
    fn a_readable_garbled_or_linked_key_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hash-key");
        load_or_create(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(&path).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");

        let garbled = dir.path().join("garbled");
        fs::write(&garbled, "not hex\n").unwrap();
        fs::set_permissions(&garbled, fs::Permissions::from_mode(0o600)).unwrap();
        let e = load_or_create(&garbled).unwrap_err();
        assert!(e.contains("64 hex digits"), "{e}");

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&garbled, &link).unwrap();
        let e = load_or_create(&link).unwrap_err();
        assert!(e.contains("symlink"), "{e}");
    }
}

//! The private runtime directory that holds every mlxcel socket.
//!
//! `$XDG_RUNTIME_DIR/mlxcel` on Linux when that variable is set, otherwise `/tmp/mlxcel-<uid>`
//! (on macOS always, since `$TMPDIR` paths there are too long for a socket). The directory is
//! mode 0700 and must be owned by us: a directory somebody else created in our place is refused,
//! never used.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// File name of the cache manager's socket.
pub const CACHEMGR_SOCKET: &str = "cachemgr.sock";
/// File name of the inference daemon's socket.
pub const DAEMON_SOCKET: &str = "daemon.sock";

/// Longest socket path the OS accepts (`sun_path` less its NUL): 104 bytes on macOS, 108 on Linux.
#[cfg(target_os = "macos")]
pub const MAX_SOCKET_PATH: usize = 103;
#[cfg(not(target_os = "macos"))]
pub const MAX_SOCKET_PATH: usize = 107;

/// Why the runtime directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("cannot create runtime directory {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("runtime directory {path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "runtime directory {path} is owned by uid {owner}, not by us (uid {us}); refusing to use it"
    )]
    WrongOwner { path: PathBuf, owner: u32, us: u32 },
    #[error(
        "socket path {path} is {len} bytes; the limit is {max} (choose a shorter --socket-dir)"
    )]
    PathTooLong {
        path: PathBuf,
        len: usize,
        max: usize,
    },
}

/// The socket directory of one mlxcel installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeDir {
    path: PathBuf,
}

impl RuntimeDir {
    /// `explicit` if given (a `--socket-dir` flag), else the platform default.
    pub fn new(explicit: Option<&Path>) -> Self {
        Self {
            path: explicit.map(Path::to_path_buf).unwrap_or_else(default_path),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the directory (0700) if needed and checks that we own it and that nobody else
    /// can enter it; a group/other bit on a directory we own is removed.
    pub fn ensure(&self) -> Result<(), RuntimeDirError> {
        let path = &self.path;
        let create = |source| RuntimeDirError::Create {
            path: path.clone(),
            source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(create)?;
        let meta = fs::symlink_metadata(path).map_err(create)?;
        if !meta.is_dir() {
            return Err(RuntimeDirError::NotADirectory { path: path.clone() });
        }
        let us = nix::unistd::geteuid().as_raw();
        if meta.uid() != us {
            return Err(RuntimeDirError::WrongOwner {
                path: path.clone(),
                owner: meta.uid(),
                us,
            });
        }
        if meta.mode() & 0o077 != 0 {
            fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(create)?;
        }
        Ok(())
    }

    /// The path of socket `name` in this directory, checked against the OS length limit.
    pub fn socket(&self, name: &str) -> Result<PathBuf, RuntimeDirError> {
        let path = self.path.join(name);
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(RuntimeDirError::PathTooLong {
                path,
                len,
                max: MAX_SOCKET_PATH,
            });
        }
        Ok(path)
    }
}

/// The platform default directory (not created).
pub fn default_path() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    #[cfg(not(target_os = "macos"))]
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("mlxcel");
    }
    PathBuf::from(format!("/tmp/mlxcel-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_private_dir_and_tightens_loose_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RuntimeDir::new(Some(&tmp.path().join("rt")));
        dir.ensure().unwrap();
        let mode = fs::metadata(dir.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        dir.ensure().unwrap();
        assert_eq!(fs::metadata(dir.path()).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(RuntimeDir::new(Some(&file)).ensure().is_err());
    }

    #[test]
    fn over_long_socket_paths_are_refused() {
        let long = PathBuf::from(format!("/tmp/{}", "d".repeat(120)));
        let err = RuntimeDir::new(Some(&long))
            .socket(CACHEMGR_SOCKET)
            .unwrap_err();
        assert!(err.to_string().contains("limit is"), "{err}");
    }
}

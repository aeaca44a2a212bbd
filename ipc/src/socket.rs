//! Binding, connecting, and checking who is on the other end.
//!
//! Servers bind with [`bind`]: a socket file left by a dead server is removed, but one that a live
//! server still answers on is left alone (we refuse to start instead). Sockets are mode 0600 in a
//! 0700 directory, and [`check_peer`] refuses a peer whose uid is not ours (SO_PEERCRED on Linux,
//! getpeereid on macOS).

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use interprocess::local_socket::traits::tokio::{Listener as _, Stream as _};
use interprocess::local_socket::{GenericFilePath, ListenerOptions, ToFsName};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use interprocess::os::unix::uds_local_socket::tokio as uds;

/// A connected local socket stream (async read + write).
pub type LocalStream = uds::Stream;

/// Why a socket could not be bound or connected.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("nothing is listening on {path} ({reason})")]
    NotRunning { path: PathBuf, reason: String },
    #[error("another server is already listening on {path}")]
    AlreadyRunning { path: PathBuf },
    #[error("{path} exists and is not a socket; refusing to remove it")]
    NotASocket { path: PathBuf },
    /// The socket, its directory or the process behind it is not ours alone.
    #[error("refusing to connect to {path}: {reason}")]
    Untrusted { path: PathBuf, reason: String },
    #[error("socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A listening local socket. Its file is removed when it is dropped.
#[derive(Debug)]
pub struct LocalListener {
    inner: uds::Listener,
    path: PathBuf,
}

impl LocalListener {
    /// Waits for the next connection.
    pub async fn accept(&self) -> std::io::Result<LocalStream> {
        self.inner.accept().await
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds a server socket at `path` (its directory must already be private).
pub async fn bind(path: &Path) -> Result<LocalListener, SocketError> {
    let io = |source| SocketError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(SocketError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Ok(_) => match connect(path).await {
            Ok(_) => {
                return Err(SocketError::AlreadyRunning {
                    path: path.to_path_buf(),
                });
            }
            Err(SocketError::NotRunning { .. }) => {
                tracing::info!(path = %path.display(), "removing stale socket left by a dead server");
                std::fs::remove_file(path).map_err(io)?;
            }
            Err(e) => return Err(e),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let name = path.to_fs_name::<GenericFilePath>().map_err(io)?;
    let inner = ListenerOptions::new()
        .name(name)
        .mode(0o600)
        .reclaim_name(true)
        .create_tokio_as::<uds::Listener>()
        .map_err(io)?;
    // The mode option is applied at creation where the OS allows it; make sure regardless.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(LocalListener {
        inner,
        path: path.to_path_buf(),
    })
}

/// Connects to the server socket at `path`.
pub async fn connect(path: &Path) -> Result<LocalStream, SocketError> {
    let name = path
        .to_fs_name::<GenericFilePath>()
        .map_err(|source| SocketError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    match uds::Stream::connect(name).await {
        Ok(s) => Ok(s),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Err(SocketError::NotRunning {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        }
        Err(source) => Err(SocketError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Connects to a server socket only if nobody else could have put it there and only our own
/// user answers: its directory is a real directory (no symlink) that we own and nobody else may
/// enter (0700), the socket is ours, and the peer runs as our uid. Every mlxcel client connects
/// through this (the front end, `mlxcelctl`, the daemon's cache client).
pub async fn connect_trusted(path: &Path) -> Result<LocalStream, SocketError> {
    // Connect first: nothing listening is `NotRunning`, whatever the directory; nothing is
    // sent before the checks below pass.
    let stream = connect(path).await?;
    let untrusted = |reason: String| SocketError::Untrusted {
        path: path.to_path_buf(),
        reason,
    };
    let us = nix::unistd::geteuid().as_raw();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let meta = std::fs::symlink_metadata(dir)
            .map_err(|e| untrusted(format!("cannot inspect {}: {e}", dir.display())))?;
        if !meta.is_dir() {
            return Err(untrusted(format!(
                "{} is not a directory (a symlink?)",
                dir.display()
            )));
        }
        if meta.uid() != us {
            return Err(untrusted(format!(
                "{} belongs to uid {}, not to us (uid {us})",
                dir.display(),
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(untrusted(format!(
                "{} is open to other users (mode {:o}); it must be 0700",
                dir.display(),
                meta.mode() & 0o777
            )));
        }
    }
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| untrusted(format!("cannot inspect the socket: {e}")))?;
    if meta.uid() != us {
        return Err(untrusted(format!(
            "the socket belongs to uid {}, not to us (uid {us})",
            meta.uid()
        )));
    }
    check_peer(&stream).map_err(untrusted)?;
    Ok(stream)
}

/// The effective uid of the process at the other end of `stream`.
pub fn peer_uid(stream: &LocalStream) -> std::io::Result<u32> {
    let fd = stream.as_fd();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let uid = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials)?.uid();
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let uid = nix::unistd::getpeereid(fd)?.0.as_raw();
    Ok(uid)
}

/// Refuses a peer that is not running as our own user.
pub fn check_peer(stream: &LocalStream) -> Result<u32, String> {
    let us = nix::unistd::geteuid().as_raw();
    match peer_uid(stream) {
        Ok(uid) if uid == us => Ok(uid),
        Ok(uid) => Err(format!("peer uid {uid} is not our uid {us}")),
        Err(e) => Err(format!("cannot read the peer's credentials: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{Connection, Limits};
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn bind_is_0600_refuses_live_twin_and_replaces_stale_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = bind(&path).await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let server = tokio::spawn(async move {
            let s = listener.accept().await.unwrap();
            assert_eq!(check_peer(&s), Ok(nix::unistd::geteuid().as_raw()));
            let mut c = Connection::new(s, Limits::default());
            let n: Option<u32> = c.read_frame().await.unwrap();
            c.write_frame(&(n.unwrap() + 1)).await.unwrap();
            // Wait for the client to finish its twin check (a probe connection) before closing.
            let _probe = listener.accept().await.unwrap();
            drop(listener);
        });
        let mut c = Connection::new(connect(&path).await.unwrap(), Limits::default());
        c.write_frame(&41u32).await.unwrap();
        assert_eq!(c.read_frame::<u32>().await.unwrap(), Some(42));
        // The server is still listening until its task ends: a twin must be refused.
        assert!(matches!(
            bind(&path).await,
            Err(SocketError::AlreadyRunning { .. })
        ));
        server.await.unwrap();
        assert!(!path.exists(), "a dropped listener removes its socket file");
    }

    #[tokio::test]
    async fn clients_refuse_a_directory_others_could_enter_or_a_symlinked_one() {
        let dir = tempfile::tempdir().unwrap();
        crate::runtime_dir::RuntimeDir::new(Some(dir.path()))
            .ensure()
            .unwrap();
        let path = dir.path().join("s.sock");
        let _listener = bind(&path).await.unwrap();
        let ok = connect_trusted(&path).await;
        assert!(ok.is_ok(), "our own 0700 directory: {:?}", ok.err());

        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = connect_trusted(&path).await.unwrap_err().to_string();
        assert!(e.contains("must be 0700"), "{e}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();

        let link = tempfile::tempdir().unwrap();
        let via = link.path().join("dir");
        std::os::unix::fs::symlink(dir.path(), &via).unwrap();
        let e = connect_trusted(&via.join("s.sock"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("symlink"), "{e}");

        let missing = dir.path().join("none.sock");
        assert!(matches!(
            connect_trusted(&missing).await,
            Err(SocketError::NotRunning { .. })
        ));
    }

    /// Runs only as root (CI does): a child that switched to `nobody` connects to a socket we
    /// opened up on purpose, and the peer check refuses it by uid.
    #[tokio::test]
    async fn a_peer_running_as_another_user_is_refused() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to run a client as another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("open.sock");
        let listener = bind(&path).await.unwrap();
        // Open the door on purpose so that only the uid check stands in the way.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let script = format!(
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); s.recv(1)",
            path.display().to_string()
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        let stream = listener.accept().await.unwrap();
        let verdict = check_peer(&stream);
        drop(stream);
        let _ = child.wait();
        let err = verdict.unwrap_err();
        assert!(err.contains("peer uid 65534 is not our uid 0"), "{err}");
    }

    #[tokio::test]
    async fn stale_socket_file_is_removed_and_regular_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        // A socket file nobody listens on: bind with std and drop the listener without unlinking.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        assert!(matches!(
            connect(&path).await,
            Err(SocketError::NotRunning { .. })
        ));
        let l = bind(&path).await.unwrap();
        drop(l);

        let file = dir.path().join("file.sock");
        std::fs::write(&file, b"precious").unwrap();
        assert!(matches!(
            bind(&file).await,
            Err(SocketError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    }
}

//! The client side of a connection: connect, say `Hello`, and (for admins) ask questions.

use std::path::Path;

use crate::proto::WireError;
use crate::proto::admin::{AdminReply, AdminRequest};
use crate::socket::{self, LocalStream, SocketError};
use crate::{Connection, FrameError, Hello, HelloReply, Limits, Role};

/// Why a client could not talk to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("the server refused the connection: {0}")]
    Refused(String),
    #[error("connection failed: {0}")]
    Frame(#[from] FrameError),
    #[error("the server closed the connection")]
    Closed,
    #[error("the server answered: {0}")]
    Server(WireError),
}

/// Connects to the socket at `path` and completes the handshake as `role`.
pub async fn connect(
    path: &Path,
    role: Role,
    limits: Limits,
) -> Result<Connection<LocalStream>, ClientError> {
    connect_with_pid(path, role, limits)
        .await
        .map(|(conn, _)| conn)
}

/// Like [`connect`], also returning the server's process id (from its `Welcome`).
pub async fn connect_with_pid(
    path: &Path,
    role: Role,
    limits: Limits,
) -> Result<(Connection<LocalStream>, u32), ClientError> {
    let stream = socket::connect_trusted(path).await?;
    let mut conn = Connection::new(stream, limits);
    conn.write_frame(&Hello::new(role)).await?;
    match conn.read_frame::<HelloReply>().await? {
        Some(HelloReply::Welcome { server_pid, .. }) => Ok((conn, server_pid)),
        Some(HelloReply::Refused { reason }) => Err(ClientError::Refused(reason)),
        None => Err(ClientError::Closed),
    }
}

/// An admin connection to the cache manager.
#[derive(Debug)]
pub struct AdminClient {
    conn: Connection<LocalStream>,
    /// The cache manager's process id.
    pub server_pid: u32,
}

impl AdminClient {
    /// Connects to the cache manager's socket at `path` as `role` (Admin or Frontend).
    pub async fn connect(path: &Path, role: Role) -> Result<Self, ClientError> {
        let (conn, server_pid) = connect_with_pid(path, role, Limits::default()).await?;
        Ok(Self { conn, server_pid })
    }

    /// Sends one request and waits for its reply; an error reply becomes [`ClientError::Server`].
    pub async fn request(&mut self, request: &AdminRequest) -> Result<AdminReply, ClientError> {
        self.conn.write_frame(request).await?;
        match self.conn.read_frame::<AdminReply>().await? {
            Some(AdminReply::Error(e)) => Err(ClientError::Server(e)),
            Some(reply) => Ok(reply),
            None => Err(ClientError::Closed),
        }
    }
}

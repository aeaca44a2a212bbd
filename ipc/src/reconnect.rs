//! Keeping one client connection up, for the processes that depend on another: connect (within
//! a timeout, since a hung server may accept and never answer the handshake), run a session on
//! the connection until it ends, wait with exponential backoff (back to the first step after a
//! connection that was made), and connect again, until the session says stop. The daemon's
//! cache-manager client and the front end's daemon link are this loop with their own
//! [`Session`].

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::client::{ClientError, connect};
use crate::socket::LocalStream;
use crate::{Connection, Limits, Role};

/// Whether to keep trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Retry,
    Stop,
}

/// What runs on each connection, and what happens between attempts.
pub trait Session {
    /// Serves one connection until it ends.
    fn run(&mut self, conn: Connection<LocalStream>) -> impl Future<Output = Next> + Send;
    /// The server could not be reached (or did not answer the handshake in time).
    fn unreachable(&mut self, error: &ClientError) -> Next;
    /// Before each wait between attempts.
    fn between(&mut self) -> Next {
        Next::Retry
    }
}

/// Where to connect, and how patiently.
#[derive(Debug, Clone)]
pub struct Reconnect {
    pub socket: PathBuf,
    pub role: Role,
    pub limits: Limits,
    pub connect_timeout: Duration,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Reconnect {
    /// Runs `session` on connection after connection until it says [`Next::Stop`].
    pub async fn run(&self, session: &mut impl Session) {
        let mut backoff = self.first_backoff;
        loop {
            let attempt = tokio::time::timeout(
                self.connect_timeout,
                connect(&self.socket, self.role, self.limits),
            );
            let next = match attempt.await.unwrap_or(Err(ClientError::Closed)) {
                Ok(conn) => {
                    backoff = self.first_backoff;
                    session.run(conn).await
                }
                Err(e) => session.unreachable(&e),
            };
            if next == Next::Stop || session.between() == Next::Stop {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.max_backoff);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake;

    struct Counting {
        sessions: u32,
        unreachable: u32,
    }

    impl Session for Counting {
        async fn run(&mut self, conn: Connection<LocalStream>) -> Next {
            drop(conn);
            self.sessions += 1;
            if self.sessions == 2 {
                Next::Stop
            } else {
                Next::Retry
            }
        }
        fn unreachable(&mut self, _: &ClientError) -> Next {
            self.unreachable += 1;
            Next::Retry
        }
    }

    #[tokio::test]
    async fn it_waits_for_the_server_and_reconnects_until_told_to_stop() {
        let dir = tempfile::Builder::new()
            .prefix("mxr")
            .tempdir_in("/tmp")
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = dir.path().join("s.sock");
        let reconnect = Reconnect {
            socket: socket.clone(),
            role: Role::Admin,
            limits: Limits::default(),
            connect_timeout: Duration::from_secs(30),
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
        };
        let mut session = Counting {
            sessions: 0,
            unreachable: 0,
        };
        // The server comes up only after the client has tried a few times.
        let server = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let listener = crate::socket::bind(&socket).await.unwrap();
            loop {
                let stream = listener.accept().await.unwrap();
                let _ = handshake::accept(
                    stream,
                    Limits::default(),
                    Duration::from_secs(5),
                    &[Role::Admin],
                )
                .await;
            }
        });
        reconnect.run(&mut session).await;
        server.abort();
        assert_eq!(session.sessions, 2);
        assert!(session.unreachable >= 1);
    }
}

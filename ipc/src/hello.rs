//! The handshake: the first frame of every connection is a [`Hello`], answered by a
//! [`HelloReply`]. A peer speaking another protocol version is refused with a message that names
//! both versions, then the connection is closed.

use serde::{Deserialize, Serialize};

use crate::codec;

/// The wire protocol version. Bump it on any incompatible change to a message in this crate.
pub const PROTOCOL_VERSION: u32 = 7;

/// Who is connecting, which decides the conversation that follows the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// An inference worker (`mlxcel-daemon`): speaks [`crate::proto::cache`].
    Daemon,
    /// An operator tool (`mlxcelctl`): speaks [`crate::proto::admin`].
    Admin,
    /// The HTTP front end: speaks [`crate::proto::admin`] to the cache manager.
    Frontend,
}

/// The first frame a client sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must stay the first field: a server reads it even when the rest does not decode.
    pub protocol_version: u32,
    /// What the client is.
    pub role: Role,
    /// The client's process id, for logs.
    pub pid: u32,
}

impl Hello {
    /// A hello for this process in `role`.
    pub fn new(role: Role) -> Self {
        Self {
            protocol_version: PROTOCOL_VERSION,
            role,
            pid: std::process::id(),
        }
    }
}

/// The server's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Accepted: the conversation for the client's role follows.
    Welcome {
        /// The server's protocol version (equal to the client's).
        protocol_version: u32,
        /// The server's process id.
        server_pid: u32,
    },
    /// Refused; the server closes the connection after sending this.
    Refused {
        /// Why, in words meant for a person.
        reason: String,
    },
}

/// Checks a hello payload, returning the hello or the refusal text to send back.
pub fn check_hello(payload: &[u8], accepted_roles: &[Role]) -> Result<Hello, String> {
    let hello: Hello = match codec::decode(payload) {
        Ok(h) => h,
        Err(e) => {
            // The version comes first; if at least that decodes, say which version spoke.
            return Err(match codec::decode_prefix::<u32>(payload) {
                Ok((v, _)) if v != PROTOCOL_VERSION => version_mismatch(v),
                _ => format!("the first frame must be a Hello handshake: {e}"),
            });
        }
    };
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(version_mismatch(hello.protocol_version));
    }
    if !accepted_roles.contains(&hello.role) {
        return Err(format!(
            "this server does not serve the {:?} role",
            hello.role
        ));
    }
    Ok(hello)
}

fn version_mismatch(client: u32) -> String {
    format!(
        "protocol version mismatch: client speaks {client}, server speaks {PROTOCOL_VERSION}; \
         run matching versions of the mlxcel binaries"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_version_is_named_even_when_the_rest_does_not_decode() {
        let payload = codec::encode(&(99u32, 250u8)).unwrap();
        let err = check_hello(&payload, &[Role::Admin]).unwrap_err();
        assert!(err.contains("client speaks 99"), "{err}");
    }

    #[test]
    fn role_must_be_served() {
        let payload = codec::encode(&Hello::new(Role::Daemon)).unwrap();
        assert!(
            check_hello(&payload, &[Role::Admin])
                .unwrap_err()
                .contains("Daemon")
        );
        assert_eq!(
            check_hello(&payload, &[Role::Daemon]).unwrap().role,
            Role::Daemon
        );
    }
}

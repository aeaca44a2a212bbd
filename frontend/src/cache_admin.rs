//! Questions to the cache manager (stats, entries, evict) over its admin protocol, one short
//! connection per question so a restarted manager is picked up without bookkeeping.

use std::path::PathBuf;
use std::time::Duration;

use mlxcel_ipc::Role;
use mlxcel_ipc::client::{AdminClient, ClientError};
use mlxcel_ipc::proto::ErrorCode;
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, CacheStats};

use crate::error::ApiError;

/// How to reach the cache manager.
#[derive(Debug, Clone)]
pub struct CacheAdmin {
    pub socket: PathBuf,
    pub timeout: Duration,
}

impl CacheAdmin {
    /// Sends `request`; an unreachable manager is a 503, a refused request a 400/404.
    pub async fn request(&self, request: &AdminRequest) -> Result<AdminReply, ApiError> {
        let ask = async {
            let mut client = AdminClient::connect(&self.socket, Role::Frontend).await?;
            client.request(request).await
        };
        match tokio::time::timeout(self.timeout, ask).await {
            Err(_) => Err(unavailable(format!("no answer within {:?}", self.timeout))),
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(ClientError::Server(e))) => Err(match e.code {
                ErrorCode::NotFound => ApiError::NotFound(e.message),
                ErrorCode::BadRequest => ApiError::InvalidParam {
                    param: None,
                    message: e.message,
                },
                _ => unavailable(e.message),
            }),
            Ok(Err(e)) => Err(unavailable(e.to_string())),
        }
    }

    /// The ledger's figures.
    pub async fn stats(&self) -> Result<CacheStats, ApiError> {
        match self.request(&AdminRequest::Stats).await? {
            AdminReply::Stats(s) => Ok(*s),
            other => Err(unavailable(format!("unexpected reply {other:?}"))),
        }
    }
}

fn unavailable(reason: String) -> ApiError {
    ApiError::Unavailable {
        what: "the cache manager",
        reason,
    }
}

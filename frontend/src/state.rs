//! What every handler shares.

use std::sync::Arc;

use crate::cache_admin::CacheAdmin;
use crate::daemon_link::DaemonLink;
use crate::metrics::Metrics;
use crate::queue::WaitQueue;

/// The application state, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub daemon: DaemonLink,
    pub cache: CacheAdmin,
    pub queue: WaitQueue,
    pub metrics: Arc<Metrics>,
    /// The API keys, their tenants and the admin key (none = no authentication).
    pub keys: Arc<crate::tenants::Keys>,
    /// Which `Host` and `Origin` headers are served.
    pub gate: Arc<crate::gate::Gate>,
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive.
    pub body_timeout: std::time::Duration,
    /// How answers and prompts are treated.
    pub text: TextOptions,
    /// The last answers, to tell why a next turn misses the cache.
    pub recall: Arc<crate::recall::Recall>,
}

/// How answers and prompts are treated (settings of the front end).
#[derive(Debug, Clone, Copy, Default)]
pub struct TextOptions {
    /// Keep reasoning in the answer's text.
    pub reasoning_inline: bool,
    /// Drop Claude Code's per-request billing line from system prompts.
    pub strip_billing_header: bool,
}

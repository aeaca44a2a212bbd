//! `mlxcel-frontend`: the OpenAI- and Anthropic-compatible HTTP APIs over the daemon.
//!
//! The front end owns everything about text: it validates requests, renders chat templates,
//! tokenizes (with the tokenizer the daemon hands over as data: no MLX, no model files here),
//! sends token ids to the daemon over its socket, and turns the streamed token ids back into
//! text (incremental detokenization, stop strings) as JSON bodies or SSE streams. It also
//! answers the operations routes by asking the daemon and the cache manager.
//!
//! # Layout
//! - [`http_server`]: the HTTP/1.1 accept loop with header timeouts and a graceful drain.
//! - [`routes`]: the router, bearer-token check, request ids; one file per group of routes;
//!   [`state`]: what every handler shares.
//! - [`gate`]: the door against browsers (`Host` and `Origin` checks); [`tenants`]: API keys,
//!   their tenants and the admin key.
//! - [`stall_guard`]: the write timeout that drops a client which stopped reading.
//! - [`body`]: the JSON body extractor with OpenAI-shaped refusals; [`fields`]: every API's
//!   top-level fields, honoured, ignored (and why) or refused.
//! - [`openai`], [`responses`], [`anthropic`]: the three APIs' wire shapes, each converted into
//!   one [`chat::Conversation`] and answered from one [`answer::Answer`].
//! - [`chat`]: the conversation, its rendering (tools, reasoning, breakpoints), tool-call
//!   formats, grammars, and the reply parser.
//! - [`validate`]: the checks every API shares → [`validate::ValidRequest`], the only type
//!   sent on.
//! - [`text`]: the model's tokenizer, chat template, incremental detokenizer, stop strings.
//! - [`daemon_link`]: the connection to the daemon (reconnecting) and per-request streams.
//! - [`completion`]: one generation's token events → text pieces and a finish;
//!   [`answer`]: those pieces split into reasoning, text and tool calls.
//! - [`respond`]: an answer as any API's SSE stream; [`recall`]: the last answers, to tell
//!   why an agent's next turn misses the cache.
//! - [`queue`]: the bound on waiting requests (429).
//! - [`cache_admin`]: questions to the cache manager.
//! - [`metrics`]: counters, histograms and the Prometheus text format.
//! - [`error`]: the one error type and its HTTP mapping.
//! - [`config`]: command-line flags.
//! - [`fuzzing`]: arbitrary bytes through the request parsers (for `fuzz/` and its replay).

pub mod answer;
pub mod anthropic;
pub mod body;
pub mod cache_admin;
pub mod chat;
pub mod completion;
pub mod config;
pub mod daemon_link;
pub mod error;
pub mod fields;
pub mod fuzzing;
pub mod gate;
pub mod http_server;
pub mod metrics;
pub mod openai;
pub mod queue;
pub mod recall;
pub mod respond;
pub mod responses;
pub mod routes;
pub mod stall_guard;
pub mod state;
pub mod tenants;
pub mod text;
pub mod validate;

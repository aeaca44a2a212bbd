//! A [`Completion`]'s pieces as OpenAI responses: one JSON body, or an SSE stream of chunks.
//!
//! [`Chunker`] is the pure part (pieces in, chunk bodies out) and is unit-tested without a
//! server; [`stream`] drives it from a task that notices a client that went away and drops
//! the completion, which cancels the request in the daemon.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::completion::{Completion, Piece};
use crate::error::ApiError;
use crate::openai::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatLogprobs, ChatResponse,
    CompletionChoice, CompletionLogprobs, CompletionResponse, Delta, TokenLogprob, Usage,
};

/// Which API shape to answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// Builds response bodies for one request.
#[derive(Debug, Clone)]
pub struct Chunker {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Report logprobs (chat: also as each token's own top alternative).
    pub logprobs: bool,
    pub top_logprobs: bool,
    /// Text bytes sent so far (completions' `text_offset`).
    offset: usize,
}

/// Seconds since the epoch, for `created`.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Chunker {
    pub fn new(kind: Kind, id: String, model: String) -> Self {
        Self {
            kind,
            id,
            created: now_secs(),
            model,
            include_usage: false,
            logprobs: false,
            top_logprobs: false,
            offset: 0,
        }
    }

    fn usage_field(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }

    fn chat_chunk(
        &self,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> String {
        let choice = ChatChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason: finish,
        };
        to_json(&self.chat_chunk_with(vec![choice], self.usage_field()))
    }

    fn chat_chunk_with(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn completion_chunk(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> String {
        let choice = CompletionChoice {
            index: 0,
            text,
            logprobs,
            finish_reason: finish,
        };
        to_json(&self.completion_with(vec![choice], self.usage_field()))
    }

    /// A `text_completion` object (a whole response, or one chunk of a stream).
    fn completion_with(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// The chunk that opens a stream (chat: the assistant role with empty content).
    pub fn opening(&self) -> Option<String> {
        (self.kind == Kind::Chat).then(|| {
            let delta = Delta {
                role: Some("assistant"),
                content: Some(String::new()),
            };
            self.chat_chunk(delta, None, None)
        })
    }

    /// The chunks for one piece (the final piece may add a usage chunk).
    pub fn piece(&mut self, piece: &Piece) -> Vec<String> {
        match piece {
            Piece::Text { text, logprobs } => {
                let chunk = match self.kind {
                    Kind::Chat => self.chat_chunk(
                        Delta {
                            role: None,
                            content: Some(text.clone()),
                        },
                        self.chat_logprobs(logprobs),
                        None,
                    ),
                    Kind::Completion => {
                        let lp = self.completion_logprobs(logprobs);
                        self.completion_chunk(text.clone(), lp, None)
                    }
                };
                self.offset += text.len();
                vec![chunk]
            }
            Piece::Finished {
                finish_reason,
                usage,
            } => {
                let mut out = vec![match self.kind {
                    Kind::Chat => self.chat_chunk(Delta::default(), None, Some(finish_reason)),
                    Kind::Completion => {
                        self.completion_chunk(String::new(), None, Some(finish_reason))
                    }
                }];
                if self.include_usage {
                    out.push(self.usage_chunk(*usage));
                }
                out
            }
        }
    }

    /// The last chunk of `include_usage` streams: no choices, the usage.
    fn usage_chunk(&self, usage: Usage) -> String {
        match self.kind {
            Kind::Chat => to_json(&self.chat_chunk_with(Vec::new(), Some(Some(usage)))),
            Kind::Completion => to_json(&self.completion_with(Vec::new(), Some(Some(usage)))),
        }
    }

    fn chat_logprobs(&self, tokens: &[TokenLogprob]) -> Option<ChatLogprobs> {
        self.logprobs
            .then(|| ChatLogprobs::new(tokens, self.top_logprobs))
    }

    fn completion_logprobs(&self, tokens: &[TokenLogprob]) -> Option<CompletionLogprobs> {
        self.logprobs
            .then(|| CompletionLogprobs::new(tokens, self.offset))
    }

    /// The whole response of a non-streaming request.
    pub fn body(
        &self,
        text: String,
        tokens: &[TokenLogprob],
        finish: &'static str,
        usage: Usage,
    ) -> Response {
        match self.kind {
            Kind::Chat => Json(ChatResponse {
                id: self.id.clone(),
                object: "chat.completion",
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: "assistant",
                        content: text,
                    },
                    logprobs: self.chat_logprobs(tokens),
                    finish_reason: finish,
                }],
                usage,
            })
            .into_response(),
            Kind::Completion => Json(self.completion_with(
                vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: self.completion_logprobs(tokens),
                    finish_reason: Some(finish),
                }],
                Some(Some(usage)),
            ))
            .into_response(),
        }
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

/// Runs `completion` to its end and answers with one body.
pub async fn collect(mut completion: Completion, chunker: Chunker) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(piece) = completion.next().await {
        match piece? {
            Piece::Text { text: t, logprobs } => {
                text.push_str(&t);
                tokens.extend(logprobs);
            }
            Piece::Finished {
                finish_reason,
                usage,
            } => return Ok(chunker.body(text, &tokens, finish_reason, usage)),
        }
    }
    Err(ApiError::Generation(
        "the generation ended without finishing".into(),
    ))
}

/// Answers with an SSE stream: the chunks, then `data: [DONE]`; an error after the stream
/// started becomes one `data: {"error": ...}` event and the stream ends.
pub fn stream(mut completion: Completion, mut chunker: Chunker) -> Response {
    let (tx, rx) = mpsc::channel::<String>(32);
    tokio::spawn(async move {
        if let Some(first) = chunker.opening()
            && tx.send(first).await.is_err()
        {
            return;
        }
        loop {
            let piece = tokio::select! {
                // The client went away: dropping `completion` cancels the request.
                _ = tx.closed() => return,
                p = completion.next() => p,
            };
            let chunks = match piece {
                None => vec!["[DONE]".to_string()],
                Some(Ok(piece)) => chunker.piece(&piece),
                Some(Err(e)) => {
                    tracing::warn!(code = e.code(), "stream ended by an error: {e}");
                    let _ = tx.send(to_json(&e.body())).await;
                    return;
                }
            };
            let done = chunks.last().is_some_and(|c| c == "[DONE]");
            for chunk in chunks {
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
        }
    });
    let events = stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|data| (Ok::<_, Infallible>(SseEvent::default().data(data)), rx))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::response::PromptTokensDetails;
    use serde_json::Value;

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
            total_tokens: 12,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
        }
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn a_chat_stream_opens_with_the_role_and_ends_with_usage() {
        let mut c = Chunker::new(Kind::Chat, "chatcmpl-1".into(), "m".into());
        c.include_usage = true;
        let open = parse(&c.opening().unwrap());
        assert_eq!(open["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(open["object"], "chat.completion.chunk");
        assert!(open["usage"].is_null() && open.as_object().unwrap().contains_key("usage"));
        let text = c.piece(&Piece::Text {
            text: "Hi".into(),
            logprobs: vec![],
        });
        let text = parse(&text[0]);
        assert_eq!(text["choices"][0]["delta"]["content"], "Hi");
        assert!(text["choices"][0]["delta"].get("role").is_none());
        let end = c.piece(&Piece::Finished {
            finish_reason: "stop",
            usage: usage(),
        });
        assert_eq!(end.len(), 2);
        assert_eq!(parse(&end[0])["choices"][0]["finish_reason"], "stop");
        let last = parse(&end[1]);
        assert_eq!(last["choices"].as_array().unwrap().len(), 0);
        assert_eq!(last["usage"]["total_tokens"], 12);
        assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }

    #[test]
    fn completion_chunks_carry_text_and_offsets() {
        let mut c = Chunker::new(Kind::Completion, "cmpl-1".into(), "m".into());
        c.logprobs = true;
        assert!(c.opening().is_none());
        let lp = |t: &str| TokenLogprob {
            token: t.into(),
            logprob: -0.5,
        };
        c.piece(&Piece::Text {
            text: "ab".into(),
            logprobs: vec![lp("ab")],
        });
        let second = parse(
            &c.piece(&Piece::Text {
                text: "c".into(),
                logprobs: vec![lp("c")],
            })[0],
        );
        assert_eq!(second["object"], "text_completion");
        assert_eq!(second["choices"][0]["text"], "c");
        assert_eq!(second["choices"][0]["logprobs"]["text_offset"][0], 2);
        assert!(second.get("usage").is_none());
        let end = c.piece(&Piece::Finished {
            finish_reason: "length",
            usage: usage(),
        });
        assert_eq!(end.len(), 1);
        assert_eq!(parse(&end[0])["choices"][0]["finish_reason"], "length");
    }
}

//! An [`Answer`] as a server-sent event stream, in any API's shape: a [`Writer`] turns events
//! into frames (pure, unit-tested per API); [`stream`] drives it from a task that notices a
//! client that went away and drops the answer, which cancels the request in the daemon.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::answer::{Answer, Event};
use crate::error::ApiError;

/// One server-sent event: its `event:` name (if the API names events) and its data.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: Option<&'static str>,
    pub data: String,
}

impl Frame {
    /// An unnamed event (OpenAI chat and completions).
    pub fn data(data: String) -> Self {
        Self { event: None, data }
    }

    /// A named event whose data is `value` (Responses, Anthropic Messages).
    pub fn named<T: Serialize>(event: &'static str, value: &T) -> Self {
        Self {
            event: Some(event),
            data: to_json(value),
        }
    }
}

/// Turns an answer's events into one API's frames.
pub trait Writer: Send + 'static {
    /// What opens the stream.
    fn opening(&mut self) -> Vec<Frame>;
    /// The frames of one event.
    fn event(&mut self, event: &Event) -> Vec<Frame>;
    /// What ends the stream after the last event.
    fn closing(&mut self) -> Vec<Frame>;
    /// An error after the stream started.
    fn error(&mut self, error: &ApiError) -> Vec<Frame>;
}

/// How an API keeps an idle stream (a long prefill) alive.
pub enum Idle {
    /// An SSE comment.
    Comment,
    /// A named event with this data (Anthropic's `ping`).
    Event(&'static str, &'static str),
}

/// Seconds since the epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// JSON text of `value` (plain data: serializing cannot fail).
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

/// Answers with an SSE stream of `writer`'s frames for `answer`.
pub fn stream(mut answer: Answer, mut writer: impl Writer, idle: Idle) -> Response {
    let (tx, rx) = mpsc::channel::<Frame>(32);
    tokio::spawn(async move {
        for frame in writer.opening() {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        loop {
            let event = tokio::select! {
                // The client went away: dropping `answer` cancels the request.
                _ = tx.closed() => return,
                e = answer.next() => e,
            };
            let (frames, last) = match event {
                None => (writer.closing(), true),
                Some(Ok(e)) => (writer.event(&e), false),
                Some(Err(e)) => {
                    tracing::warn!(code = e.code(), "stream ended by an error: {e}");
                    (writer.error(&e), true)
                }
            };
            for frame in frames {
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    let events = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| {
            let mut e = SseEvent::default().data(f.data);
            if let Some(name) = f.event {
                e = e.event(name);
            }
            (Ok::<_, Infallible>(e), rx)
        })
    });
    let keep_alive = match idle {
        Idle::Comment => KeepAlive::default(),
        Idle::Event(name, data) => KeepAlive::new()
            .interval(Duration::from_secs(10))
            .event(SseEvent::default().event(name).data(data)),
    };
    Sse::new(events).keep_alive(keep_alive).into_response()
}

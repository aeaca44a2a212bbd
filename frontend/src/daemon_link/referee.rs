//! The checks every daemon event passes before it reaches a request. The daemon is another
//! process; a bug or a compromise there must not reach a client as garbage or panic the front
//! end. A lie (an event for a request never sent, a token outside the vocabulary, a log
//! probability that is not one, more tokens than were asked for, usage figures that disagree
//! with what was sent and received, a garbled or oversized frame) is counted
//! (`mlxcel_daemon_protocol_violations_total`) and logged; the front end keeps its own figures,
//! and a request whose stream cannot be trusted fails with a clear error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mlxcel_ipc::proto::daemon::{FinishReason, Usage};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use tokio::sync::mpsc::UnboundedSender;

use super::Event;

/// One request open on the connection, and what the front end knows of it.
pub struct Open {
    pub events: UnboundedSender<Event>,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// Tokens delivered so far.
    pub sent: u32,
}

/// What to do with a token.
pub enum Verdict {
    /// Deliver it; the request goes on.
    Deliver(Event),
    /// Deliver this final event, forget the request and cancel it in the daemon.
    End(Event),
}

/// Counts the daemon's lies; shared by every connection of one front end.
#[derive(Clone, Debug, Default)]
pub struct Referee {
    lies: Arc<AtomicU64>,
}

impl Referee {
    /// Lies counted so far.
    pub fn lies(&self) -> u64 {
        self.lies.load(Ordering::Relaxed)
    }

    /// Counts one lie and logs what it was.
    pub fn lie(&self, what: std::fmt::Arguments<'_>) {
        self.lies.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("the daemon broke the protocol: {what}");
    }

    /// Checks token `token` (with `logprob`) of open request `id`, whose tokenizer has `vocab`
    /// entries.
    pub fn token(
        &self,
        open: &mut Open,
        id: u64,
        vocab: u32,
        token: u32,
        logprob: Option<f32>,
    ) -> Verdict {
        // A log-probability is at most 0 (NaN is not one either).
        let bad_logprob = logprob.filter(|lp| lp.is_nan() || *lp > 0.0);
        let broken = if token >= vocab {
            Some(format!(
                "the daemon sent token id {token}, outside the vocabulary of {vocab}"
            ))
        } else {
            bad_logprob.map(|lp| format!("the daemon sent a log-probability of {lp}"))
        };
        if let Some(message) = broken {
            self.lie(format_args!("request {id}: {message}"));
            return Verdict::End(Event::Failed(WireError::new(ErrorCode::Internal, message)));
        }
        if open.sent >= open.max_tokens {
            self.lie(format_args!(
                "request {id}: a token beyond the {} asked for",
                open.max_tokens
            ));
            return Verdict::End(Event::Done {
                finish: FinishReason::Length,
                usage: Usage {
                    prompt_tokens: open.prompt_tokens,
                    generated_tokens: open.sent,
                    ..Usage::default()
                },
            });
        }
        open.sent += 1;
        Verdict::Deliver(Event::Token { token, logprob })
    }

    /// The final usage of request `id`: the daemon's timings, the front end's own counts where
    /// the daemon's disagree with what was sent and received (each disagreement is a lie).
    pub fn usage(&self, open: &Open, id: u64, claimed: Usage) -> Usage {
        let mut usage = claimed;
        if claimed.prompt_tokens != open.prompt_tokens {
            self.lie(format_args!(
                "request {id}: {} prompt tokens claimed, {} sent",
                claimed.prompt_tokens, open.prompt_tokens
            ));
            usage.prompt_tokens = open.prompt_tokens;
        }
        if claimed.generated_tokens != open.sent {
            self.lie(format_args!(
                "request {id}: {} tokens claimed, {} received",
                claimed.generated_tokens, open.sent
            ));
            usage.generated_tokens = open.sent;
        }
        if claimed.cached_tokens > usage.prompt_tokens {
            self.lie(format_args!(
                "request {id}: {} cached tokens claimed of a {}-token prompt",
                claimed.cached_tokens, usage.prompt_tokens
            ));
            usage.cached_tokens = 0;
        }
        if claimed.pinned_tokens > usage.prompt_tokens {
            self.lie(format_args!(
                "request {id}: {} pinned tokens claimed of a {}-token prompt",
                claimed.pinned_tokens, usage.prompt_tokens
            ));
            usage.pinned_tokens = 0;
        }
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(max_tokens: u32) -> (Open, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let open = Open {
            events,
            prompt_tokens: 10,
            max_tokens,
            sent: 0,
        };
        (open, rx)
    }

    #[test]
    fn honest_tokens_and_usage_pass_and_count_nothing() {
        let referee = Referee::default();
        let (mut o, _rx) = open(2);
        assert!(matches!(
            referee.token(&mut o, 1, 100, 5, Some(-0.5)),
            Verdict::Deliver(_)
        ));
        assert!(matches!(
            referee.token(&mut o, 1, 100, 99, Some(0.0)),
            Verdict::Deliver(_)
        ));
        let claimed = Usage {
            prompt_tokens: 10,
            cached_tokens: 10,
            generated_tokens: 2,
            ..Usage::default()
        };
        assert_eq!(referee.usage(&o, 1, claimed), claimed);
        assert_eq!(referee.lies(), 0);
    }

    #[test]
    fn each_kind_of_lie_is_counted_and_the_front_ends_figures_win() {
        let referee = Referee::default();
        let (mut o, _rx) = open(1);
        assert!(matches!(
            referee.token(&mut o, 1, 100, 100, None),
            Verdict::End(Event::Failed(_))
        ));
        assert!(matches!(
            referee.token(&mut o, 1, 100, 1, Some(f32::NAN)),
            Verdict::End(Event::Failed(_))
        ));
        assert!(matches!(
            referee.token(&mut o, 1, 100, 1, Some(0.5)),
            Verdict::End(Event::Failed(_))
        ));
        assert!(matches!(
            referee.token(&mut o, 1, 100, 1, None),
            Verdict::Deliver(_)
        ));
        match referee.token(&mut o, 1, 100, 1, None) {
            Verdict::End(Event::Done { finish, usage }) => {
                assert_eq!(finish, FinishReason::Length);
                assert_eq!((usage.prompt_tokens, usage.generated_tokens), (10, 1));
            }
            _ => panic!("a token beyond max_tokens ends the request"),
        }
        assert_eq!(referee.lies(), 4);
        let usage = referee.usage(
            &o,
            1,
            Usage {
                prompt_tokens: u32::MAX,
                cached_tokens: u32::MAX,
                generated_tokens: 0,
                ..Usage::default()
            },
        );
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.generated_tokens
            ),
            (10, 0, 1)
        );
        assert_eq!(referee.lies(), 7);
    }
}

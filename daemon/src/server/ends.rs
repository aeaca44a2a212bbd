//! How each request of a connection ends: exactly one `Done` or `Failed` per `Generate`,
//! whether the engine ends it or a cancel does. A cancel is answered by the server at once
//! (`Done { finish: Cancelled }`) instead of after the engine's current step, which can be a
//! long prefill; whatever the engine still sends for that request is dropped.

use std::collections::HashSet;

use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FinishReason, RequestId, Usage};

/// The live and the cancelled requests of one connection.
#[derive(Debug, Default)]
pub struct Ends {
    live: HashSet<RequestId>,
    /// Answered as cancelled; the engine's own end for them is still to come.
    cancelled: HashSet<RequestId>,
}

impl Ends {
    /// A `Generate` arrived.
    pub fn started(&mut self, id: RequestId) {
        self.live.insert(id);
    }

    /// A cancel for `id`: the answer to send now, if the request was still live.
    pub fn cancel(&mut self, id: RequestId) -> Option<DaemonToFrontend> {
        if !self.live.remove(&id) {
            return None;
        }
        self.cancelled.insert(id);
        Some(DaemonToFrontend::Done {
            request_id: id,
            finish: FinishReason::Cancelled,
            usage: Usage::default(),
        })
    }

    /// Whether an event from the engine is to be written (false: its request was already
    /// answered as cancelled).
    pub fn pass(&mut self, msg: &DaemonToFrontend) -> bool {
        match msg {
            DaemonToFrontend::Token { request_id, .. } => !self.cancelled.contains(request_id),
            DaemonToFrontend::Done { request_id, .. }
            | DaemonToFrontend::Failed { request_id, .. } => {
                if self.cancelled.remove(request_id) {
                    return false;
                }
                self.live.remove(request_id);
                true
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: RequestId) -> DaemonToFrontend {
        DaemonToFrontend::Token {
            request_id: id,
            token: 7,
            logprob: None,
        }
    }

    fn done(id: RequestId) -> DaemonToFrontend {
        DaemonToFrontend::Done {
            request_id: id,
            finish: FinishReason::Length,
            usage: Usage::default(),
        }
    }

    #[test]
    fn a_cancel_is_answered_once_and_the_engines_later_events_are_dropped() {
        let mut e = Ends::default();
        e.started(1);
        e.started(2);
        assert!(e.pass(&token(1)));
        let answer = e.cancel(1).expect("a live request is answered");
        assert!(matches!(
            answer,
            DaemonToFrontend::Done {
                request_id: 1,
                finish: FinishReason::Cancelled,
                ..
            }
        ));
        assert!(e.cancel(1).is_none(), "answered once");
        assert!(
            !e.pass(&token(1)) && !e.pass(&done(1)),
            "nothing after the answer"
        );
        assert!(
            e.pass(&token(2)) && e.pass(&done(2)),
            "others are untouched"
        );
        // A request that already ended is not answered again.
        assert!(e.cancel(2).is_none());
        assert!(e.live.is_empty() && e.cancelled.is_empty());
    }
}

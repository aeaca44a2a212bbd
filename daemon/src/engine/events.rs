//! Where a connection's request events go: a bounded queue to that connection's writer.
//!
//! The engine serves every connection from one thread, so it never waits on a queue: a send that
//! finds the queue full means the front end has stopped reading (its socket buffer and then
//! `backlog` events are full). The sink then marks the connection stuck, and the server closes
//! it: the engine hears `ConnectionClosed`, cancels its requests and frees their blocks. Memory
//! per connection is bounded by the backlog, not by `max_tokens` times the requests running.

use mlxcel_ipc::proto::daemon::DaemonToFrontend;
use tokio::sync::mpsc::{self, Receiver, Sender, error::TrySendError};
use tokio_util::sync::CancellationToken;

/// The engine's end of one connection's event queue.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: Sender<DaemonToFrontend>,
    stuck: CancellationToken,
    conn: u64,
}

/// The server's end: the events to write, and a token cancelled when the queue overflowed.
pub struct EventQueue {
    pub rx: Receiver<DaemonToFrontend>,
    pub stuck: CancellationToken,
}

/// A queue of at most `backlog` events (at least 1) for connection `conn`.
pub fn event_queue(conn: u64, backlog: usize) -> (EventSink, EventQueue) {
    let (tx, rx) = mpsc::channel(backlog.max(1));
    let stuck = CancellationToken::new();
    let sink = EventSink {
        tx,
        stuck: stuck.clone(),
        conn,
    };
    (sink, EventQueue { rx, stuck })
}

impl EventSink {
    /// Queues `event`, never waiting. A full queue marks the connection stuck (the event is
    /// dropped: the connection is closed and its requests cancelled); a closed one is ignored
    /// (the connection already went).
    pub fn send(&self, event: DaemonToFrontend) {
        match self.tx.try_send(event) {
            Ok(()) | Err(TrySendError::Closed(_)) => {}
            Err(TrySendError::Full(_)) => {
                // Only the engine's thread sends: the first overflow is the one to log.
                if !self.stuck.is_cancelled() {
                    tracing::warn!(
                        conn = self.conn,
                        backlog = self.tx.max_capacity(),
                        "a front end stopped reading its events: closing its connection and \
                         cancelling its requests"
                    );
                }
                self.stuck.cancel();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlxcel_ipc::proto::daemon::{FinishReason, Usage};

    fn done(request_id: u64) -> DaemonToFrontend {
        DaemonToFrontend::Done {
            request_id,
            finish: FinishReason::Stop,
            usage: Usage::default(),
        }
    }

    #[tokio::test]
    async fn a_full_queue_marks_the_connection_stuck_and_keeps_what_was_queued() {
        let (sink, mut queue) = event_queue(7, 2);
        sink.send(done(1));
        sink.send(done(2));
        assert!(!queue.stuck.is_cancelled());
        sink.send(done(3));
        assert!(queue.stuck.is_cancelled());
        let mut got = Vec::new();
        while let Ok(DaemonToFrontend::Done { request_id, .. }) = queue.rx.try_recv() {
            got.push(request_id);
        }
        assert_eq!(got, vec![1, 2]);
    }

    #[tokio::test]
    async fn a_closed_queue_is_not_stuck() {
        let (sink, queue) = event_queue(7, 1);
        drop(queue.rx);
        sink.send(done(1));
        sink.send(done(2));
        assert!(!queue.stuck.is_cancelled());
    }
}

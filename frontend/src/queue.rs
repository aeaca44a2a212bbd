//! The waiting queue's bound: requests admitted but not yet producing tokens. Beyond
//! `--max-queue` of them a new request gets 429 instead of waiting without limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::ApiError;

/// Counts waiting requests against a limit.
#[derive(Debug, Clone)]
pub struct WaitQueue {
    waiting: Arc<AtomicUsize>,
    limit: usize,
}

/// A place in the queue, given back on drop (at the first token, or when the request ends).
#[derive(Debug)]
pub struct QueueSlot {
    waiting: Arc<AtomicUsize>,
}

impl WaitQueue {
    pub fn new(limit: usize) -> Self {
        Self {
            waiting: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Takes a place, or 429 when `limit` requests already wait.
    pub fn enter(&self) -> Result<QueueSlot, ApiError> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .map_err(|_| ApiError::QueueFull { limit: self.limit })?;
        Ok(QueueSlot {
            waiting: self.waiting.clone(),
        })
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_holds_and_slots_come_back() {
        let q = WaitQueue::new(2);
        let a = q.enter().unwrap();
        let _b = q.enter().unwrap();
        assert!(matches!(q.enter(), Err(ApiError::QueueFull { limit: 2 })));
        drop(a);
        assert_eq!(q.waiting(), 1);
        assert!(q.enter().is_ok());
    }
}

//! Where a busy period's time went: prefill, the batched decode forward, sampling, and the
//! rest of the step (admission, retiring, publishing). Logged when the engine goes idle, so a
//! slow served decode can be told apart from a slow model.

use std::time::{Duration, Instant};

/// Phases of a step.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    Prefill,
    Model,
    Sampling,
    Other,
}

/// Time per phase since the engine last went idle.
#[derive(Debug, Default)]
pub struct StepClock {
    spent: [Duration; 4],
    decode_steps: u64,
    decode_rows: u64,
    prefill_tokens: u64,
    started: Option<Instant>,
}

impl StepClock {
    /// Adds the time since `since` to `phase`; returns now, the start of the next phase.
    pub fn lap(&mut self, phase: Phase, since: Instant) -> Instant {
        let now = Instant::now();
        self.started.get_or_insert(since);
        self.spent[phase as usize] += now.saturating_duration_since(since);
        now
    }

    /// Counts one batched decode step of `rows` sequences.
    pub fn decoded(&mut self, rows: usize) {
        self.decode_steps += 1;
        self.decode_rows += rows as u64;
    }

    /// Counts `n` prompt tokens computed.
    pub fn prefilled(&mut self, n: usize) {
        self.prefill_tokens += n as u64;
    }

    /// Logs the busy period that just ended, if any, and starts over.
    pub fn report(&mut self) {
        let Some(started) = self.started else {
            return;
        };
        if self.decode_steps == 0 && self.prefill_tokens == 0 {
            *self = StepClock::default();
            return;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per_step = |d: Duration| ms(d) / self.decode_steps.max(1) as f64;
        let [prefill, model, sampling, other] = self.spent;
        tracing::info!(
            busy_ms = format!("{:.0}", ms(started.elapsed())),
            prefill_tokens = self.prefill_tokens,
            prefill_ms = format!("{:.0}", ms(prefill)),
            decode_steps = self.decode_steps,
            mean_batch = format!(
                "{:.1}",
                self.decode_rows as f64 / self.decode_steps.max(1) as f64
            ),
            model_ms_per_step = format!("{:.1}", per_step(model)),
            sampling_ms_per_step = format!("{:.2}", per_step(sampling)),
            other_ms_per_step = format!("{:.2}", per_step(other)),
            "engine idle: where the busy period went"
        );
        *self = StepClock::default();
    }
}

//! Where a busy period's time went: prefill, the batched decode forward, sampling, and the
//! rest of the step (admission, retiring, publishing). Logged when the engine goes idle, so a
//! slow served decode can be told apart from a slow model, and summed since start
//! ([`StepTotals`], published with the vitals: `/metrics` and the throughput bench read it).

use std::time::Instant;

use mlxcel_ipc::proto::daemon::StepTotals;

/// Phases of a step.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    Prefill,
    Model,
    Sampling,
    Other,
}

/// Time per phase and work done since the engine started; a busy period is the difference
/// from the totals at the last report.
#[derive(Debug, Default)]
pub struct StepClock {
    /// Everything since the engine started.
    totals: StepTotals,
    /// The totals at the last report.
    reported: StepTotals,
    /// When the busy period's first phase began.
    started: Option<Instant>,
}

impl StepClock {
    /// Adds the time since `since` to `phase`; returns now, the start of the next phase.
    pub fn lap(&mut self, phase: Phase, since: Instant) -> Instant {
        let now = Instant::now();
        self.started.get_or_insert(since);
        let us =
            u64::try_from(now.saturating_duration_since(since).as_micros()).unwrap_or(u64::MAX);
        let t = &mut self.totals;
        let total = match phase {
            Phase::Prefill => &mut t.prefill_us,
            Phase::Model => &mut t.model_us,
            Phase::Sampling => &mut t.sampling_us,
            Phase::Other => &mut t.other_us,
        };
        *total = total.saturating_add(us);
        now
    }

    /// Counts one batched decode step of `rows` sequences.
    pub fn decoded(&mut self, rows: usize) {
        self.totals.decode_steps += 1;
        self.totals.decode_rows += rows as u64;
    }

    /// Counts `n` prompt tokens computed.
    pub fn prefilled(&mut self, n: usize) {
        self.totals.prefill_tokens += n as u64;
    }

    /// Counts one prefill forward pass over `chunks` sequences' chunks.
    pub fn prefill_pass(&mut self, chunks: usize) {
        self.totals.prefill_passes += 1;
        self.totals.prefill_chunks += chunks as u64;
    }

    /// Everything since the engine started (with the grammar masks computed).
    pub fn totals(&self) -> StepTotals {
        let (masks, took) = mlxcel_grammar::mask_totals();
        StepTotals {
            masks,
            mask_us: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            ..self.totals
        }
    }

    /// Logs the busy period that just ended, if it did any work, and starts over.
    pub fn report(&mut self) {
        let Some(started) = self.started.take() else {
            return;
        };
        let (now, start) = (
            self.totals,
            std::mem::replace(&mut self.reported, self.totals),
        );
        let steps = now.decode_steps - start.decode_steps;
        let prefill_tokens = now.prefill_tokens - start.prefill_tokens;
        if steps == 0 && prefill_tokens == 0 {
            return;
        }
        let ms = |us: u64| us as f64 / 1e3;
        let per_step = |us: u64| ms(us) / steps.max(1) as f64;
        tracing::info!(
            busy_ms = format!("{:.0}", started.elapsed().as_secs_f64() * 1e3),
            prefill_tokens,
            prefill_ms = format!("{:.0}", ms(now.prefill_us - start.prefill_us)),
            decode_steps = steps,
            mean_batch = format!(
                "{:.1}",
                (now.decode_rows - start.decode_rows) as f64 / steps.max(1) as f64
            ),
            model_ms_per_step = format!("{:.1}", per_step(now.model_us - start.model_us)),
            sampling_ms_per_step = format!("{:.2}", per_step(now.sampling_us - start.sampling_us)),
            other_ms_per_step = format!("{:.2}", per_step(now.other_us - start.other_us)),
            "engine idle: where the busy period went"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_every_busy_period_and_survive_the_reports() {
        let mut clock = StepClock::default();
        let t0 = Instant::now();
        clock.prefilled(100);
        let t1 = clock.lap(Phase::Prefill, t0);
        clock.decoded(3);
        let t2 = clock.lap(Phase::Model, t1);
        clock.lap(Phase::Sampling, t2);
        let first = clock.totals();
        clock.report();
        assert_eq!(
            clock.totals(),
            first,
            "a report starts a new period, not new totals"
        );
        clock.decoded(5);
        clock.lap(Phase::Model, Instant::now());
        clock.report();
        let t = clock.totals();
        assert_eq!(
            (t.prefill_tokens, t.decode_steps, t.decode_rows),
            (100, 2, 8)
        );
        assert!(t.model_us >= first.model_us);
        assert_eq!(t.prefill_us, first.prefill_us);
    }
}

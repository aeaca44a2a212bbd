//! The front end's own counters and histograms, and the Prometheus text format for them and
//! for the figures gathered from the daemon and the cache manager (`GET /metrics`).
//!
//! Names follow Prometheus conventions: one `mlxcel_` prefix, base units (`_seconds`,
//! `_bytes`), `_total` on counters, low-cardinality labels only.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::openai::response::Usage;

/// Latency bucket bounds in seconds (TTFT and request duration).
const BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A cumulative histogram over [`BUCKETS`].
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn write(&self, out: &mut Exposition, name: &str, help: &str) {
        out.header(name, help, "histogram");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out.text, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out.text, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out.text, "{name}_sum {sum}");
        let _ = writeln!(out.text, "{name}_count {count}");
    }
}

/// Everything the front end counts itself.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP responses by (route, status).
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generations: AtomicU64,
    generation_failures: AtomicU64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Time from sending a generation to its end.
    pub duration: Histogram,
}

impl Metrics {
    pub fn response(&self, route: &str, status: u16) {
        let mut map = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((route.to_string(), status)).or_default() += 1;
    }

    pub fn finished(&self, usage: &Usage, elapsed: Duration) {
        self.generations.fetch_add(1, Ordering::Relaxed);
        let add = |c: &AtomicU64, v: u32| c.fetch_add(u64::from(v), Ordering::Relaxed);
        add(&self.prompt_tokens, usage.prompt_tokens);
        add(&self.completion_tokens, usage.completion_tokens);
        add(
            &self.cached_tokens,
            usage.prompt_tokens_details.cached_tokens,
        );
        self.duration.observe(elapsed);
    }

    pub fn generation_failed(&self) {
        self.generation_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the front end's metrics.
    pub fn write(&self, out: &mut Exposition) {
        out.header(
            "mlxcel_http_responses_total",
            "HTTP responses by route and status.",
            "counter",
        );
        let map = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        for ((route, status), n) in map.iter() {
            let _ = writeln!(
                out.text,
                "mlxcel_http_responses_total{{route=\"{}\",status=\"{status}\"}} {n}",
                escape(route)
            );
        }
        drop(map);
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.counter(
            "mlxcel_generations_total",
            "Generations that finished (any finish reason).",
            load(&self.generations),
        );
        out.counter(
            "mlxcel_generation_failures_total",
            "Generations that failed (daemon error or lost connection).",
            load(&self.generation_failures),
        );
        out.counter(
            "mlxcel_prompt_tokens_total",
            "Prompt tokens of finished generations.",
            load(&self.prompt_tokens),
        );
        out.counter(
            "mlxcel_cached_prompt_tokens_total",
            "Prompt tokens served from the prefix cache.",
            load(&self.cached_tokens),
        );
        out.counter(
            "mlxcel_completion_tokens_total",
            "Tokens returned to clients.",
            load(&self.completion_tokens),
        );
        self.ttft.write(
            out,
            "mlxcel_time_to_first_token_seconds",
            "Time from sending a generation to its first token.",
        );
        self.duration.write(
            out,
            "mlxcel_generation_duration_seconds",
            "Time from sending a generation to its end.",
        );
    }
}

/// A Prometheus text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    pub text: String,
}

impl Exposition {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, help, "gauge");
        let _ = writeln!(self.text, "{name} {value}");
    }

    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, help, "counter");
        let _ = writeln!(self.text, "{name} {value}");
    }

    /// One metric with a label taking several values.
    pub fn labelled(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        label: &str,
        values: &[(&str, u64)],
    ) {
        self.header(name, help, kind);
        for (v, n) in values {
            let _ = writeln!(self.text, "{name}{{{label}=\"{}\"}} {n}", escape(v));
        }
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_count_everything() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(300));
        h.observe(Duration::from_secs(1000));
        let mut out = Exposition::default();
        h.write(&mut out, "x_seconds", "x");
        assert!(out.text.contains("x_seconds_bucket{le=\"0.01\"} 1\n"));
        assert!(out.text.contains("x_seconds_bucket{le=\"0.5\"} 2\n"));
        assert!(out.text.contains("x_seconds_bucket{le=\"300\"} 2\n"));
        assert!(out.text.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(out.text.contains("x_seconds_count 3\n"));
        assert!(out.text.contains("x_seconds_sum 1000.305\n"));
    }
}

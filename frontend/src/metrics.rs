//! The front end's own counters and histograms, and the figures gathered from the daemon and
//! the cache manager, in the OpenMetrics text format (`GET /metrics`) through
//! `prometheus-client`.
//!
//! Names follow Prometheus conventions: one `mlxcel_` prefix, base units (`_seconds`,
//! `_bytes`), `_total` on counters, low-cardinality labels only.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeCounterValue;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{Atomic, ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram as PromHistogram;
use prometheus_client::registry::Registry;

use crate::completion::Tally;

/// Latency bucket bounds in seconds (TTFT and request duration).
const BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A cumulative histogram over [`BUCKETS`].
#[derive(Debug, Clone)]
pub struct Histogram(PromHistogram);

impl Default for Histogram {
    fn default() -> Self {
        Self(PromHistogram::new(BUCKETS))
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

/// The labels of `mlxcel_http_responses_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Response {
    route: String,
    status: u16,
}

/// The labels of `mlxcel_prefix_misses_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Miss {
    reason: &'static str,
}

/// Everything the front end counts itself.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP responses by (route, status).
    responses: Family<Response, Counter>,
    prompt_tokens: Counter,
    completion_tokens: Counter,
    cached_tokens: Counter,
    generations: Counter,
    generation_failures: Counter,
    /// Prompts that miss the cache where an earlier answer should have hit, by why.
    misses: Family<Miss, Counter>,
    /// Time to first token.
    pub ttft: Histogram,
    /// Time from sending a generation to its end.
    pub duration: Histogram,
}

impl Metrics {
    pub fn response(&self, route: &str, status: u16) {
        let labels = Response {
            route: route.to_string(),
            status,
        };
        self.responses.get_or_create(&labels).inc();
    }

    pub fn finished(&self, usage: &Tally, elapsed: Duration) {
        self.generations.inc();
        self.prompt_tokens.inc_by(u64::from(usage.prompt));
        self.completion_tokens.inc_by(u64::from(usage.completion));
        self.cached_tokens.inc_by(u64::from(usage.cached));
        self.duration.observe(elapsed);
    }

    /// Counts a prompt that cannot reuse an earlier answer's cached blocks, and why.
    pub fn missed(&self, reason: &'static str) {
        self.misses.get_or_create(&Miss { reason }).inc();
    }

    pub fn generation_failed(&self) {
        self.generation_failures.inc();
    }

    /// Adds the front end's metrics to `out`.
    pub fn write(&self, out: &mut Exposition) {
        let r = &mut out.registry;
        r.register(
            "mlxcel_http_responses",
            "HTTP responses by route and status",
            self.responses.clone(),
        );
        r.register(
            "mlxcel_prefix_misses",
            "Prompts that re-render an earlier answer of theirs differently from the tokens it \
             was generated as, so the cache cannot reuse it (reason: rerendered_answer)",
            self.misses.clone(),
        );
        let counters = [
            (
                "mlxcel_generations",
                "Generations that finished (any finish reason)",
                &self.generations,
            ),
            (
                "mlxcel_generation_failures",
                "Generations that failed (daemon error or lost connection)",
                &self.generation_failures,
            ),
            (
                "mlxcel_prompt_tokens",
                "Prompt tokens of finished generations",
                &self.prompt_tokens,
            ),
            (
                "mlxcel_cached_prompt_tokens",
                "Prompt tokens served from the prefix cache",
                &self.cached_tokens,
            ),
            (
                "mlxcel_completion_tokens",
                "Tokens returned to clients",
                &self.completion_tokens,
            ),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        r.register(
            "mlxcel_time_to_first_token_seconds",
            "Time from sending a generation to its first token",
            self.ttft.0.clone(),
        );
        r.register(
            "mlxcel_generation_duration_seconds",
            "Time from sending a generation to its end",
            self.duration.0.clone(),
        );
    }
}

/// One scrape's metrics being gathered, then encoded with [`Exposition::text`].
#[derive(Debug, Default)]
pub struct Exposition {
    registry: Registry,
}

/// The help text without the full stop the encoder adds.
fn help(text: &str) -> &str {
    text.strip_suffix('.').unwrap_or(text)
}

impl Exposition {
    pub fn gauge(&mut self, name: &str, text: &str, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        self.registry
            .register(name, help(text), ConstGauge::new(value));
    }

    /// A counter; `name` ends in `_total`, which the encoder writes itself.
    pub fn counter(&mut self, name: &str, text: &str, value: u64) {
        let base = name.strip_suffix("_total").unwrap_or(name);
        self.registry
            .register(base, help(text), ConstCounter::new(value));
    }

    /// One counter with a label taking several values.
    pub fn labelled(&mut self, name: &str, text: &str, label: &str, values: &[(&str, u64)]) {
        self.labelled_counter::<u64, AtomicU64>(name, text, label, values);
    }

    /// One counter of seconds (a float) with a label taking several values.
    pub fn labelled_seconds(
        &mut self,
        name: &str,
        text: &str,
        label: &str,
        values: &[(&str, f64)],
    ) {
        self.labelled_counter::<f64, AtomicU64>(name, text, label, values);
    }

    fn labelled_counter<N, A>(&mut self, name: &str, text: &str, label: &str, values: &[(&str, N)])
    where
        N: Copy + EncodeCounterValue + std::fmt::Debug + Send + Sync + 'static,
        A: Atomic<N> + Default + std::fmt::Debug + Send + Sync + 'static,
    {
        let family = Family::<Vec<(String, String)>, Counter<N, A>>::default();
        for (v, n) in values {
            family
                .get_or_create(&vec![(label.to_string(), v.to_string())])
                .inc_by(*n);
        }
        let base = name.strip_suffix("_total").unwrap_or(name);
        self.registry.register(base, help(text), family);
    }

    /// The OpenMetrics text of everything gathered.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counters_get_their_suffix() {
        let m = Metrics::default();
        m.ttft.observe(Duration::from_millis(5));
        m.ttft.observe(Duration::from_millis(300));
        m.ttft.observe(Duration::from_secs(1000));
        m.response("/v1/models", 200);
        let mut out = Exposition::default();
        m.write(&mut out);
        out.counter("x_things_total", "Things.", 3);
        out.gauge("x_level", "Level.", 7);
        out.labelled("x_by_reason_total", "By reason.", "reason", &[("a", 1)]);
        out.labelled_seconds("x_seconds_total", "Time.", "phase", &[("p", 1.5)]);
        let text = out.text();
        let t = "mlxcel_time_to_first_token_seconds";
        assert!(
            text.contains(&format!("{t}_bucket{{le=\"0.01\"}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{t}_bucket{{le=\"0.5\"}} 2\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{t}_bucket{{le=\"300.0\"}} 2\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{t}_bucket{{le=\"+Inf\"}} 3\n")),
            "{text}"
        );
        assert!(text.contains(&format!("{t}_count 3\n")), "{text}");
        assert!(text.contains(&format!("{t}_sum 1000.305\n")), "{text}");
        assert!(
            text.contains("mlxcel_http_responses_total{route=\"/v1/models\",status=\"200\"} 1\n")
        );
        assert!(text.contains("# HELP x_things Things.\n"), "{text}");
        assert!(text.contains("x_things_total 3\n"));
        assert!(text.contains("x_level 7\n"));
        assert!(text.contains("x_by_reason_total{reason=\"a\"} 1\n"));
        assert!(
            text.contains("x_seconds_total{phase=\"p\"} 1.5\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}

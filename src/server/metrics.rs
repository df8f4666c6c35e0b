//! Prometheus metrics of the server, kept in atomics and written as the text exposition
//! format by `GET /metrics`. No registry crate: a handful of counters, gauges and
//! fixed-bucket histograms is all the server needs.

use crate::generation::outcome::{FailReason, PageOutcome, PageStatus};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A histogram with fixed upper bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// Sum of observations in microseconds.
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// A histogram with these bucket upper bounds (ascending, `+Inf` implied).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation of `secs` seconds.
    pub fn observe(&self, secs: f64) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if secs <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_us
            .fetch_add((secs.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let n = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {n}");
    }
}

const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const REQUEST_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Everything `/metrics` reports.
pub struct Metrics {
    /// Responses by (route, status code).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub request_duration: Histogram,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens per second of the last decoder step (f64 bits).
    pub step_tokens_per_s: AtomicU64,
    /// How `/v1/ocr`'s pages ended.
    pub pages: PageCounts,
}

/// `/v1/ocr`'s pages by outcome (issue 38): `ok`, `retried`, `failed` by reason, and the
/// attempts that were tried again.
#[derive(Default)]
pub struct PageCounts {
    ok: AtomicU64,
    retried: AtomicU64,
    /// Failed pages by reason, in [`FAIL_REASONS`]' order.
    failed: [AtomicU64; 3],
    retries: AtomicU64,
}

const FAIL_REASONS: [FailReason; 3] = [FailReason::Length, FailReason::Loop, FailReason::Error];

impl PageCounts {
    /// Counts a page that ended with `outcome`.
    pub fn count(&self, outcome: &PageOutcome) {
        let n = match (outcome.status, outcome.reason) {
            (PageStatus::Ok, _) => &self.ok,
            (PageStatus::Retried, _) => &self.retried,
            (PageStatus::Failed, r) => {
                let r = r.unwrap_or(FailReason::Error);
                &self.failed[FAIL_REASONS.iter().position(|x| *x == r).unwrap_or(2)]
            }
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an attempt that is tried again.
    pub fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String) {
        let name = "ocrctl_ocr_pages_total";
        let _ = writeln!(
            out,
            "# HELP {name} /v1/ocr pages by outcome: ok, retried (ok after a retry), failed by reason.\n# TYPE {name} counter"
        );
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{status=\"ok\"}} {}", load(&self.ok));
        let _ = writeln!(out, "{name}{{status=\"retried\"}} {}", load(&self.retried));
        for (r, n) in FAIL_REASONS.iter().zip(&self.failed) {
            let _ = writeln!(
                out,
                "{name}{{status=\"failed\",reason=\"{r}\"}} {}",
                load(n)
            );
        }
        let name = "ocrctl_ocr_page_retries_total";
        let _ = writeln!(
            out,
            "# HELP {name} /v1/ocr attempts that ended at max_tokens or in a loop and were tried again.\n# TYPE {name} counter\n{name} {}",
            load(&self.retries)
        );
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            request_duration: Histogram::new(REQUEST_BUCKETS),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            step_tokens_per_s: AtomicU64::new(0),
            pages: PageCounts::default(),
        }
    }
}

/// Gauges read at scrape time.
pub struct Gauges {
    pub queue_depth: usize,
    pub batch_size: usize,
    pub ready: bool,
    /// GPU memory this process holds, bytes (None: no GPU or nvidia-smi missing).
    pub gpu_memory_bytes: Option<u64>,
    /// Resident host memory, bytes.
    pub rss_bytes: Option<u64>,
    /// Bytes of images being decoded now, and the most ever at once (see `DecodeBudget`).
    pub decode_bytes: u64,
    pub decode_peak_bytes: u64,
    /// Bytes of request bodies held now, and the most ever at once (see `BodyBudget`).
    pub body_bytes: u64,
    pub body_peak_bytes: u64,
    /// Each engine (one per device), labelled `device`.
    pub engines: Vec<EngineGauges>,
}

/// One engine's figures at scrape time.
pub struct EngineGauges {
    /// The `device` label (`cpu:0`, `gpu:1`).
    pub device: String,
    pub ready: bool,
    pub batch_size: usize,
    /// Tokens in hand (prompt + remaining new tokens of its running requests).
    pub load_tokens: u64,
    pub admitted: u64,
    pub generated: u64,
    pub activity: super::queue::Activity,
}

impl Metrics {
    /// Counts one response of `route` with `status`.
    pub fn count_request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    /// Responses counted for `route` with `status` (for tests).
    pub fn requests(&self, route: &str, status: u16) -> u64 {
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(route.to_string(), status)).copied().unwrap_or(0)
    }

    /// The Prometheus text exposition of all metrics.
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        self.write_requests(&mut out);
        write_rows(&mut out, self.model_rows(g));
        for (h, name, help) in self.histograms() {
            h.write(&mut out, name, help);
        }
        self.pages.write(&mut out);
        write_rows(&mut out, memory_rows(g));
        write_engines(&mut out, &g.engines);
        write_rows(&mut out, process_rows(g));
        out
    }

    /// `ocrctl_requests_total` by route and status code.
    fn write_requests(&self, out: &mut String) {
        out.push_str("# HELP ocrctl_requests_total HTTP responses by route and status code.\n# TYPE ocrctl_requests_total counter\n");
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((route, status), n) in m.iter() {
            let _ = writeln!(
                out,
                "ocrctl_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
    }

    /// The model's readiness, the queue and batch, and the token counters.
    fn model_rows(&self, g: &Gauges) -> [Row; 6] {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        [
            (
                "ocrctl_model_ready",
                Kind::Gauge,
                "1 once the model is loaded.",
                Sample::Real(g.ready as u8 as f64),
            ),
            (
                "ocrctl_queue_depth",
                Kind::Gauge,
                "Requests waiting for a batch slot.",
                Sample::Real(g.queue_depth as f64),
            ),
            (
                "ocrctl_batch_size",
                Kind::Gauge,
                "Requests in the running decode batch.",
                Sample::Real(g.batch_size as f64),
            ),
            (
                "ocrctl_prompt_tokens_total",
                Kind::Counter,
                "Prompt tokens of admitted requests.",
                Sample::Count(load(&self.prompt_tokens)),
            ),
            (
                "ocrctl_generated_tokens_total",
                Kind::Counter,
                "Tokens generated.",
                Sample::Count(load(&self.generated_tokens)),
            ),
            (
                "ocrctl_decode_tokens_per_second",
                Kind::Gauge,
                "Tokens per second of the last decoder step (all sequences of the batch).",
                Sample::Real(f64::from_bits(load(&self.step_tokens_per_s))),
            ),
        ]
    }

    /// The latency histograms with their names and help.
    fn histograms(&self) -> [(&Histogram, &'static str, &'static str); 3] {
        [
            (
                &self.time_to_first_token,
                "ocrctl_time_to_first_token_seconds",
                "From request accepted to its first token.",
            ),
            (
                &self.inter_token_latency,
                "ocrctl_inter_token_latency_seconds",
                "Between consecutive tokens of a request.",
            ),
            (
                &self.request_duration,
                "ocrctl_request_duration_seconds",
                "From request accepted to its last token.",
            ),
        ]
    }
}

/// A metric's `# TYPE`.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        })
    }
}

/// A sample's value: a count as an integer, any other figure as a float.
enum Sample {
    Count(u64),
    Real(f64),
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sample::Count(n) => write!(f, "{n}"),
            Sample::Real(v) => write!(f, "{v}"),
        }
    }
}

/// One metric without labels: name, type, help, value.
type Row = (&'static str, Kind, &'static str, Sample);

/// Writes each row as its `# HELP`, `# TYPE` and one sample.
fn write_rows(out: &mut String, rows: impl IntoIterator<Item = Row>) {
    for (name, kind, help, v) in rows {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    }
}

/// The bytes of images being decoded and of request bodies held, now and at their peak.
fn memory_rows(g: &Gauges) -> [Row; 4] {
    [
        (
            "ocrctl_image_decode_bytes",
            Kind::Gauge,
            "Estimated bytes of request images being decoded now.",
            Sample::Real(g.decode_bytes as f64),
        ),
        (
            "ocrctl_image_decode_peak_bytes",
            Kind::Gauge,
            "Most estimated bytes of request images ever decoded at once.",
            Sample::Real(g.decode_peak_bytes as f64),
        ),
        (
            "ocrctl_request_body_bytes",
            Kind::Gauge,
            "Bytes of request bodies held now.",
            Sample::Real(g.body_bytes as f64),
        ),
        (
            "ocrctl_request_body_peak_bytes",
            Kind::Gauge,
            "Most bytes of request bodies ever held at once.",
            Sample::Real(g.body_peak_bytes as f64),
        ),
    ]
}

/// The process's GPU and resident memory, where known.
fn process_rows(g: &Gauges) -> impl Iterator<Item = Row> {
    let gpu = g.gpu_memory_bytes.map(|b| {
        (
            "ocrctl_gpu_memory_used_bytes",
            Kind::Gauge,
            "GPU memory held by this process (nvidia-smi).",
            Sample::Real(b as f64),
        )
    });
    let rss = g.rss_bytes.map(|b| {
        (
            "ocrctl_resident_memory_bytes",
            Kind::Gauge,
            "Resident host memory of this process.",
            Sample::Real(b as f64),
        )
    });
    gpu.into_iter().chain(rss)
}

/// Each per-engine metric, one sample per engine labelled `device`.
fn write_engines(out: &mut String, engines: &[EngineGauges]) {
    for (name, kind, help, f) in PER_ENGINE {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for e in engines {
            let _ = writeln!(out, "{name}{{device=\"{}\"}} {}", e.device, f(e));
        }
    }
}

/// The per-engine metrics: name, type, help and the figure of an engine.
#[allow(clippy::type_complexity)]
const PER_ENGINE: [(&str, Kind, &str, fn(&EngineGauges) -> f64); 13] = [
    (
        "ocrctl_engine_ready",
        Kind::Gauge,
        "1 while this device's engine serves.",
        |e| e.ready as u8 as f64,
    ),
    (
        "ocrctl_engine_batch_size",
        Kind::Gauge,
        "Requests in this device's decode batch.",
        |e| e.batch_size as f64,
    ),
    (
        "ocrctl_engine_load_tokens",
        Kind::Gauge,
        "Tokens in hand on this device: prompt + remaining new tokens of its requests.",
        |e| e.load_tokens as f64,
    ),
    (
        "ocrctl_engine_requests_total",
        Kind::Counter,
        "Requests this device's engine admitted.",
        |e| e.admitted as f64,
    ),
    (
        "ocrctl_engine_generated_tokens_total",
        Kind::Counter,
        "Tokens this device's engine generated.",
        |e| e.generated as f64,
    ),
    (
        "ocrctl_engine_pages_decoding",
        Kind::Gauge,
        "Pages in this device's decode step.",
        |e| e.activity.decoding as f64,
    ),
    (
        "ocrctl_engine_pages_staging",
        Kind::Gauge,
        "Pages whose images are encoded (or prompts prefilled) beside the decode steps.",
        |e| e.activity.staging as f64,
    ),
    (
        "ocrctl_engine_pages_waiting_for_kv",
        Kind::Gauge,
        "Pages waiting for KV cache blocks: new, or preempted to be recomputed.",
        |e| e.activity.queued_for_kv as f64,
    ),
    (
        "ocrctl_engine_kv_free",
        Kind::Gauge,
        "Free KV cache slots (GQA) or blocks (paged); -1 when caches grow without a pool.",
        |e| e.activity.kv_free.map_or(-1.0, |f| f as f64),
    ),
    (
        "ocrctl_engine_decode_steps_total",
        Kind::Counter,
        "Decode steps run.",
        |e| e.activity.stats.steps as f64,
    ),
    (
        "ocrctl_engine_overlapped_steps_total",
        Kind::Counter,
        "Decode steps run while pages were encoded or prefilled beside them.",
        |e| e.activity.stats.overlapped_steps as f64,
    ),
    (
        "ocrctl_engine_preemptions_total",
        Kind::Counter,
        "Pages preempted by a full paged KV cache (recomputed later).",
        |e| e.activity.stats.preemptions as f64,
    ),
    (
        "ocrctl_engine_requeued_total",
        Kind::Counter,
        "Pages of a decode step lost to a CUDA stream-capture collision, recomputed.",
        |e| e.activity.stats.requeued as f64,
    ),
];

/// Resident set size of this process from `/proc/self/statm` (Linux).
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_counters_gauges_and_cumulative_buckets() {
        let m = Metrics::default();
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/chat/completions", 429);
        m.time_to_first_token.observe(0.07);
        m.time_to_first_token.observe(3.0);
        m.pages.count(&PageOutcome::finished(1));
        m.pages.count(&PageOutcome::finished(3));
        m.pages.count(&PageOutcome::failed(FailReason::Loop, 3));
        m.pages.count_retry();
        let text = m.render(&Gauges {
            queue_depth: 2,
            batch_size: 4,
            ready: true,
            gpu_memory_bytes: None,
            rss_bytes: Some(10),
            decode_bytes: 0,
            decode_peak_bytes: 7,
            body_bytes: 0,
            body_peak_bytes: 2048,
            engines: ["cpu:0", "cpu:1"]
                .iter()
                .enumerate()
                .map(|(i, d)| EngineGauges {
                    device: d.to_string(),
                    ready: i == 0,
                    batch_size: 3 - i,
                    load_tokens: 100,
                    admitted: 5 + i as u64,
                    generated: 40,
                    activity: super::super::queue::Activity {
                        decoding: 2,
                        staging: 1,
                        queued_for_kv: 0,
                        kv_free: (i == 0).then_some(7),
                        stats: crate::generation::engine::EngineStats {
                            steps: 30,
                            overlapped_steps: 12,
                            preemptions: 0,
                            requeued: 0,
                        },
                    },
                })
                .collect(),
        });
        assert!(text.contains(
            "ocrctl_engine_ready{device=\"cpu:0\"} 1\nocrctl_engine_ready{device=\"cpu:1\"} 0\n"
        ));
        assert!(text.contains("# TYPE ocrctl_engine_requests_total counter\nocrctl_engine_requests_total{device=\"cpu:0\"} 5\n"));
        assert!(text.contains("ocrctl_engine_batch_size{device=\"cpu:1\"} 2\n"));
        assert!(text.contains("ocrctl_engine_overlapped_steps_total{device=\"cpu:0\"} 12\n"));
        assert!(text.contains(
            "ocrctl_engine_kv_free{device=\"cpu:0\"} 7\nocrctl_engine_kv_free{device=\"cpu:1\"} -1\n"
        ));
        assert!(text.contains("ocrctl_image_decode_peak_bytes 7\n"));
        assert!(text.contains("ocrctl_request_body_peak_bytes 2048\n"));
        assert!(
            text.contains("ocrctl_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2")
        );
        assert!(text.contains("status=\"429\"} 1"));
        assert!(text.contains("ocrctl_queue_depth 2\n"));
        assert!(text.contains("ocrctl_batch_size 4\n"));
        assert!(text.contains("ocrctl_time_to_first_token_seconds_bucket{le=\"0.05\"} 0"));
        assert!(text.contains("ocrctl_time_to_first_token_seconds_bucket{le=\"0.1\"} 1"));
        assert!(text.contains("ocrctl_time_to_first_token_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("ocrctl_time_to_first_token_seconds_count 2"));
        assert!(!text.contains("gpu_memory"));
        assert!(text.contains(
            "# TYPE ocrctl_ocr_pages_total counter\nocrctl_ocr_pages_total{status=\"ok\"} 1\n\
             ocrctl_ocr_pages_total{status=\"retried\"} 1\n\
             ocrctl_ocr_pages_total{status=\"failed\",reason=\"length\"} 0\n\
             ocrctl_ocr_pages_total{status=\"failed\",reason=\"loop\"} 1\n\
             ocrctl_ocr_pages_total{status=\"failed\",reason=\"error\"} 0\n"
        ));
        assert!(text.contains("ocrctl_ocr_page_retries_total 1\n"));
        assert_eq!(m.requests("/v1/chat/completions", 200), 2);
    }
}

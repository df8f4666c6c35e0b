//! Log output of the library's `tracing` events: plain lines for people (default), or one
//! JSON object per event for log collectors (`--log-format json`, `OCRCTL_LOG_FORMAT`).
//!
//! The level comes from `RUST_LOG` (e.g. `RUST_LOG=ocrctl=debug` adds one line per request,
//! `trace` one per engine step); by default ocrctl's own events at `info` and above, other
//! crates' at `warn`. Plain lines read `ocrctl: message key=value …` (`warning:` / `error:`
//! after the prefix for those levels) on stderr; JSON lines carry the level, target, fields
//! and the current spans (request id, engine).

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `ocrctl: message key=value` lines.
    Plain,
    /// One JSON object per event.
    Json,
}

/// Installs the subscriber for the whole process (once, at start).
pub fn init(format: LogFormat) {
    // ONNX Runtime's lines below warnings reach tracing only when OCRCTL_ORT_LOG asks.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("warn,ocrctl=info,ocrctl_exporters=info,onnxruntime=info")
    });
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests calling into main twice) keeps the first: ignore the error.
    let _ = match format {
        LogFormat::Plain => b.event_format(Plain).try_init(),
        LogFormat::Json => b.json().with_current_span(true).try_init(),
    };
}

/// The plain line format.
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // ocrctl's own events as `ocrctl:`; others (ONNX Runtime's log) by their target.
        let target = event.metadata().target();
        let who = if target.starts_with("ocrctl") {
            "ocrctl"
        } else {
            target
        };
        match *event.metadata().level() {
            Level::ERROR => write!(w, "{who}: error: ")?,
            Level::WARN => write!(w, "{who}: warning: ")?,
            _ => write!(w, "{who}: ")?,
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

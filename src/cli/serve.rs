//! `ocrctl serve`: the OpenAI-compatible HTTP server (see [`ocrctl::server`]).
//!
//! ```text
//! ocrctl serve --model out/m --profile 16gb --port 8000 --api-key "$KEY"
//! ```
//!
//! Every option can also come from an `OCRCTL_*` environment variable (`OCRCTL_MODEL`,
//! `OCRCTL_PROFILE`, `OCRCTL_PORT`, …). The model loads on the engine thread while the
//! server already answers: `/health` is 503 until it is ready. `--devices 0,1,2,3` runs one
//! engine per device behind the one HTTP front and queue (see [`ocrctl::server::queue`]);
//! the server is ready while one engine is, and `/health` names those that are not. When no
//! engine is left — every one failed to load (status 1) or died while serving (status 70) —
//! the process exits, so that a supervisor restarts it.

use anyhow::Context;
use clap::Args;
use ocrctl::generation::engine::{Engine, GenRequest};
use ocrctl::generation::pipeline::PagePipeline;
use ocrctl::generation::sampling::LoopGuard;
use ocrctl::model::export::Export;
use ocrctl::model::preprocess::DEFAULT_MAX_PIXELS;
use ocrctl::profile::Profile;
use ocrctl::runtime::devices::{self, Device};
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl::server::{worker, AppState, ServerConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exit status when the model cannot be loaded.
const EXIT_LOAD_FAILED: i32 = 1;
/// Exit status when the engine thread died while serving (EX_SOFTWARE).
const EXIT_ENGINE_DIED: i32 = 70;

/// Arguments of `ocrctl serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Exported model directory (from `ocrctl export`).
    #[arg(long, env = "OCRCTL_MODEL")]
    model: PathBuf,
    #[command(flatten)]
    rt: crate::cli::common::RuntimeArgs,
    /// Address to listen on.
    #[arg(long, env = "OCRCTL_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the chosen address is printed).
    #[arg(long, env = "OCRCTL_PORT", default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics (compared in constant time;
    /// /health stays open).
    #[arg(long, env = "OCRCTL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Serve /metrics without the API key (for a scraper that cannot send it).
    #[arg(long, env = "OCRCTL_OPEN_METRICS")]
    open_metrics: bool,
    /// Fetch `http://` image URLs given in requests (off: only data: URLs are accepted).
    #[arg(long, env = "OCRCTL_ALLOW_REMOTE_IMAGES")]
    allow_remote_images: bool,
    /// Model name for /v1/models and requests' `model` (default: the model directory's name).
    #[arg(long, env = "OCRCTL_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Seconds a request may take from arrival to its last token (queue wait included).
    #[arg(long, env = "OCRCTL_REQUEST_TIMEOUT", default_value_t = 600)]
    request_timeout: u64,
    /// Asynchronous OCR jobs (`/v1/ocr/jobs`) kept at once, running or finished.
    #[arg(long, env = "OCRCTL_MAX_JOBS", default_value_t = 64)]
    max_jobs: usize,
    /// Seconds a finished job (and its text) is kept for `GET /v1/ocr/jobs/{id}/result`.
    #[arg(long, env = "OCRCTL_JOB_TTL", default_value_t = 3600)]
    job_ttl: u64,
    /// Pages of one document uploaded to /v1/ocr (default: the profile's
    /// max_pages_per_request, 500 in the built-in ones); they are rendered, queued and run 16
    /// at a time, so memory does not grow with the count.
    #[arg(long, env = "OCRCTL_MAX_PAGES_PER_REQUEST")]
    max_pages_per_request: Option<usize>,
    /// Pages of one job's document (a job holds 16 of them in memory at a time).
    #[arg(long, env = "OCRCTL_MAX_JOB_PAGES", default_value_t = 2000)]
    max_job_pages: usize,
    /// Seconds running requests may take to finish after SIGTERM.
    #[arg(long, env = "OCRCTL_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    shutdown_timeout: u64,
    /// Requests decoded together (default: the profile's max_batch_size).
    #[arg(long, env = "OCRCTL_BATCH_SIZE")]
    batch_size: Option<usize>,
    /// Requests that may wait for a batch slot before 429 (default: the profile's queue_size).
    #[arg(long, env = "OCRCTL_QUEUE_SIZE")]
    queue_size: Option<usize>,
    /// Refuse images with more pixels than this (checked from the header, before decoding).
    #[arg(long, env = "OCRCTL_MAX_PIXELS", default_value_t = DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
    /// Stop a request whose output repeats a block of tokens many times in a row.
    #[arg(long, env = "OCRCTL_LOOP_GUARD")]
    loop_guard: bool,
    /// Connections served at once; more wait in the listen backlog.
    #[arg(long, env = "OCRCTL_MAX_CONNECTIONS", default_value_t = 512)]
    max_connections: usize,
    /// Connections served at once from one IP address (default: half of --max-connections;
    /// 0: no limit, e.g. behind a proxy that all clients come through); more are closed.
    #[arg(long, env = "OCRCTL_MAX_CONNECTIONS_PER_CLIENT")]
    max_connections_per_client: Option<usize>,
    /// Seconds a connection has to send a request's headers (idle keep-alive included).
    #[arg(long, env = "OCRCTL_HEADER_TIMEOUT", default_value_t = 10)]
    header_timeout: u64,
    /// Seconds a request's body has to arrive.
    #[arg(long, env = "OCRCTL_BODY_TIMEOUT", default_value_t = 60)]
    body_timeout: u64,
    /// Seconds a response may wait for the client to take any bytes before the connection is
    /// closed (a stream whose client stops reading is also cancelled once 4 MiB wait unread).
    #[arg(long, env = "OCRCTL_WRITE_TIMEOUT", default_value_t = 30)]
    write_timeout: u64,
    /// Memory for request bodies held at once, MiB: a body takes twice its Content-Length
    /// (what reading and parsing it hold at their peak) when its first bytes arrive, and
    /// gives it back once its images are preprocessed; when that does not free up within
    /// --body-timeout the request gets 503.
    #[arg(long, env = "OCRCTL_BODY_MEMORY_MB", default_value_t = 1024)]
    body_memory_mb: u64,
    /// Host names a server without --api-key answers to, besides IP addresses and
    /// localhost (comma-separated). Other Host headers get 403 (DNS-rebinding guard).
    #[arg(long, env = "OCRCTL_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Devices to run one engine each on, comma-separated: GPU indices (`0,1,2,3`, with the
    /// profile's GPU providers) or `cpu` (default: one engine, the profile's device 0).
    #[arg(long, env = "OCRCTL_DEVICES", value_delimiter = ',')]
    devices: Vec<Device>,
    /// Page sizes to run once through the engine (a one-token request each) before the server
    /// reports ready, comma-separated `WIDTHxHEIGHT` of the images as sent (e.g. a PDF's
    /// pages rendered at a fixed DPI). On a GPU the first page of each new size otherwise
    /// pays for the kernels' plans (an A4 page's one-token request on an H200: 580 ms cold,
    /// 96 ms warmed up). An empty value lists none.
    #[arg(long, env = "OCRCTL_WARM_UP", value_delimiter = ',')]
    warm_up: Vec<String>,
    #[command(flatten)]
    pdf: crate::cli::pdf_limits::PdfLimitArgs,
}

/// One page of a warm-up size, preprocessed as requests are: pixels and prompt.
type WarmPage = (ocrctl::model::preprocess::Pixels, Vec<u32>);

/// Runs each warm-up page through `engine` as a one-token request: the path requests take
/// (the vision and prefill stages where the model has them), so every session a page of that
/// size meets plans its kernels now.
fn warm_up(engine: &mut Engine<OrtModel>, pages: &[WarmPage]) -> anyhow::Result<()> {
    let requests = pages.iter().map(|(pixels, prompt)| GenRequest {
        images: vec![pixels.clone()],
        ..GenRequest::text(prompt.clone(), 1)
    });
    for r in engine.run(requests, &mut |_| {}) {
        r?;
    }
    Ok(())
}

/// Starts engine `me` (on device `label`): loads the model on its own thread and runs it
/// under [`worker::supervise`]. When no engine is left, the process exits (status 1 when
/// loading failed, 70 when an engine died while serving).
#[allow(clippy::too_many_arguments)]
fn spawn_engine(
    me: usize,
    label: String,
    export: Arc<Export>,
    opts: LoadOptions,
    batch: usize,
    shared: Arc<worker::Shared>,
    warm: Arc<Vec<WarmPage>>,
) -> anyhow::Result<()> {
    let one = shared.engines.len() == 1;
    let who = if one {
        String::new()
    } else {
        format!(" on {label}")
    };
    std::thread::Builder::new()
        .name(format!("ocrctl-engine-{me}"))
        .spawn(move || {
            let t = std::time::Instant::now();
            match OrtModel::open(&export, &opts) {
                Ok(model) => {
                    tracing::info!(
                        "model loaded{who} in {:.1} s (batch {batch})",
                        t.elapsed().as_secs_f64()
                    );
                    let mut engine = Engine::new(model, batch, export.config().image_token_id);
                    if !warm.is_empty() {
                        let t = std::time::Instant::now();
                        // A page that fails here would fail as a request too: said, not fatal.
                        match warm_up(&mut engine, &warm) {
                            Ok(()) => tracing::info!(
                                "warmed up {} page size(s){who} in {:.1} s",
                                warm.len(),
                                t.elapsed().as_secs_f64()
                            ),
                            Err(e) => tracing::warn!("--warm-up{who} failed: {e}"),
                        }
                    }
                    let (s2, prompter) = (shared.clone(), export.prompter.clone());
                    worker::supervise(
                        &shared,
                        me,
                        move || worker::run_worker(engine, prompter, s2, me),
                        |why| {
                            if shared.state() == worker::ModelState::Failed {
                                tracing::error!(
                                    "{why}{who}; exiting so that a supervisor restarts the server"
                                );
                                // Let the handlers send the failures of the requests in flight.
                                std::thread::sleep(Duration::from_millis(300));
                                std::process::exit(EXIT_ENGINE_DIED);
                            }
                            tracing::error!("{why}{who}; the other engines go on serving");
                        },
                    );
                }
                Err(e) => {
                    tracing::error!("loading {}{who}: {e}", export.dir.display());
                    shared.set_failed(me, format!("loading the model failed: {e}"));
                    // A server that can never answer must not look alive to a supervisor.
                    if shared.state() == worker::ModelState::Failed {
                        std::process::exit(EXIT_LOAD_FAILED);
                    }
                }
            }
        })
        .context("starting an engine thread")?;
    Ok(())
}

/// `--profile` / `OCRCTL_PROFILE` when given, else the GPU's, else cpu.
fn default_profile(a: &mut ServeArgs) {
    if a.rt.profile.is_none() {
        let auto =
            a.rt.providers
                .is_none()
                .then(crate::cli::common::auto_profile);
        a.rt.profile = Some(auto.flatten().unwrap_or("cpu").into());
    }
}

/// The requests' page pipeline (images no larger than the profile allows, the loop guard
/// on with `--loop-guard`) and the `--warm-up` pages made with it.
fn page_pipeline(
    a: &ServeArgs,
    profile: &Profile,
    export: &Arc<Export>,
) -> anyhow::Result<(PagePipeline, Vec<WarmPage>)> {
    let mut pipeline = PagePipeline::new(export.clone())?;
    pipeline.preprocess.longest_edge = pipeline.preprocess.longest_edge.min(profile.max_image_side);
    // Warm-up pages, made as a page of that size is for a request (before anything loads, so
    // a bad size is an error at once).
    let warm = a
        .warm_up
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| -> anyhow::Result<WarmPage> {
            let (w, h) = crate::cli::common::parse_size("--warm-up", s)?;
            if w as u64 * h as u64 > a.max_pixels {
                anyhow::bail!(
                    "--warm-up: {s} has more pixels than --max-pixels {}",
                    a.max_pixels
                );
            }
            let p = pipeline.prepare(&ocrctl::generation::pipeline::synthetic_page(w, h))?;
            Ok((p.pixel_values, p.prompt_ids))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Computed once here (a scan of the vocabulary), not by the first request's handler.
    pipeline.prompter().max_token_bytes();
    if a.loop_guard {
        // The server's defaults: requests override the rest, never this.
        pipeline.defaults.loop_guard = Some(LoopGuard::default());
    }
    Ok((pipeline, warm))
}

/// Refuses connection limits, timeouts and body memory of 0.
fn check_front_limits(a: &ServeArgs) -> anyhow::Result<()> {
    if [a.header_timeout, a.body_timeout, a.write_timeout].contains(&0) || a.max_connections == 0 {
        anyhow::bail!(
            "--max-connections, --header-timeout, --body-timeout and --write-timeout must be at \
             least 1"
        );
    }
    if a.body_memory_mb == 0 {
        anyhow::bail!("--body-memory-mb must be at least 1");
    }
    if a.max_pages_per_request == Some(0) {
        anyhow::bail!("--max-pages-per-request must be at least 1");
    }
    Ok(())
}

/// `--served-model-name`, else the model directory's name.
fn model_name(a: &ServeArgs) -> String {
    a.served_model_name.clone().unwrap_or_else(|| {
        a.model
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "ocrctl".into())
    })
}

/// `--devices`, else the profile's device 0; checked, with each engine's load options.
fn engine_devices(a: &ServeArgs, opts: &LoadOptions) -> anyhow::Result<Vec<(LoadOptions, String)>> {
    let devices = if a.devices.is_empty() {
        vec![if opts.providers.order.iter().any(|p| p.is_gpu()) {
            Device::Gpu(opts.providers.device_id.max(0) as u32)
        } else {
            Device::Cpu
        }]
    } else {
        a.devices.clone()
    };
    devices::check(&devices)?;
    let cpu_engines = devices.iter().filter(|d| **d == Device::Cpu).count();
    let engine_opts = devices
        .iter()
        .map(|d| devices::options_for(opts, *d, cpu_engines))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(engine_opts
        .into_iter()
        .zip(devices::labels(&devices))
        .collect())
}

/// The limits of the HTTP front (connections, timeouts, allowed hosts).
fn front_limits(a: &ServeArgs) -> ocrctl::server::front::FrontLimits {
    ocrctl::server::front::FrontLimits {
        max_connections: a.max_connections,
        max_per_client: a
            .max_connections_per_client
            .unwrap_or(a.max_connections.div_ceil(2)),
        header_read_timeout: Duration::from_secs(a.header_timeout),
        body_timeout: Duration::from_secs(a.body_timeout),
        write_timeout: Duration::from_secs(a.write_timeout),
        allowed_hosts: a.allowed_hosts.clone(),
    }
}

/// The server's configuration from the flags and the profile.
fn server_config(a: &ServeArgs, profile: &Profile) -> ServerConfig {
    ServerConfig {
        model_name: model_name(a),
        max_body_bytes: profile.max_body_mb as usize * 1024 * 1024,
        max_images: profile.max_images_per_request as usize,
        max_pages: a
            .max_pages_per_request
            .unwrap_or(profile.max_pages_per_request as usize),
        max_pixels: a.max_pixels,
        default_max_new_tokens: profile.default_max_new_tokens as usize,
        max_new_tokens_limit: profile.max_new_tokens_limit as usize,
        max_sequence_length: profile.max_sequence_length as usize,
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        open_metrics: a.open_metrics,
        allow_remote_images: a.allow_remote_images,
        request_timeout: Duration::from_secs(a.request_timeout),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        front: front_limits(a),
    }
}

/// The state the HTTP handlers share: configuration, queue, pipeline, budgets and jobs.
fn app_state(
    a: &ServeArgs,
    profile: &Profile,
    opts: &LoadOptions,
    pipeline: PagePipeline,
    shared: Arc<worker::Shared>,
) -> AppState {
    let uses_gpu = opts
        .providers
        .order
        .iter()
        .any(|p| *p != ocrctl::runtime::providers::Provider::Cpu);
    AppState {
        cfg: server_config(a, profile),
        shared,
        pipeline,
        stopping: AtomicBool::new(false),
        gpu_memory: uses_gpu
            .then_some(ocrctl::runtime::gpumem::process_gpu_memory as fn() -> Option<u64>),
        cut: tokio::sync::watch::channel(false).0,
        decode_budget: ocrctl::server::images::DecodeBudget::new(
            profile.decode_memory_mb as u64 * 1024 * 1024,
        ),
        body_budget: ocrctl::server::front::BodyBudget::new(a.body_memory_mb * 1024 * 1024),
        pdf: a.pdf.reader(None),
        jobs: ocrctl::server::Jobs::new(ocrctl::server::JobLimits {
            max_jobs: a.max_jobs,
            ttl: Duration::from_secs(a.job_ttl),
            max_pages: a.max_job_pages,
        }),
    }
}

/// Binds `--host`:`--port` and serves `state` until SIGTERM/SIGINT.
fn listen(a: &ServeArgs, state: Arc<AppState>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let addr = format!("{}:{}", a.host, a.port);
    let shutdown = Duration::from_secs(a.shutdown_timeout);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        tracing::info!("listening on http://{local}");
        ocrctl::server::serve(listener, state, shutdown).await?;
        tracing::info!("stopped");
        Ok::<_, anyhow::Error>(())
    })
}

/// Runs the server until SIGTERM/SIGINT.
pub fn run(mut a: ServeArgs) -> anyhow::Result<ExitCode> {
    default_profile(&mut a);
    let (mut opts, profile, export) = a.rt.open(&a.model)?;
    let profile = profile.expect("a profile is always set above");
    let (pipeline, warm) = page_pipeline(&a, &profile, &export)?;
    let warm = Arc::new(warm);
    let batch = a.batch_size.unwrap_or(profile.max_batch_size as usize);
    if batch == 0 {
        anyhow::bail!("--batch-size must be at least 1");
    }
    opts.kv_slots = batch;
    check_front_limits(&a)?;
    let engines = engine_devices(&a, &opts)?;
    let shared = Arc::new(worker::Shared::with_engines(
        a.queue_size.unwrap_or(profile.queue_size as usize),
        engines.iter().map(|(_, label)| label.clone()).collect(),
    ));
    let state = Arc::new(app_state(&a, &profile, &opts, pipeline, shared.clone()));
    // Each engine thread owns its copy of the model.
    for (me, (opts, label)) in engines.into_iter().enumerate() {
        spawn_engine(
            me,
            label,
            export.clone(),
            opts,
            batch,
            shared.clone(),
            warm.clone(),
        )?;
    }
    listen(&a, state)?;
    Ok(ExitCode::SUCCESS)
}

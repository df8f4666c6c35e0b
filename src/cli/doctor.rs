//! `ocrctl doctor`: what this machine offers ocrctl.
//!
//! Reports the ONNX Runtime library found (path, version), which execution providers it was
//! built with and which really start (a one-node model is loaded with each), the TensorRT-RTX
//! plugin (found, loaded, offered a device) and its ahead-of-time builder, the pdfium
//! library for PDF input (optional: its absence does not fail the check), the GPU(s) from
//! `nvidia-smi`, the host memory, and which built-in profiles' memory targets fit; with
//! `--model DIR`, which LightOnOCR variant the export is.

use clap::Args;
use ocrctl::runtime::ortlib;
use ocrctl::runtime::providers::{compiled_in, dispatch, Provider, ProviderConfig};
use ocrctl_exporters::graph::{DType, Dim, Graph};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ocrctl doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Path of libonnxruntime.so (default: found automatically).
    #[arg(long, env = "OCRCTL_ORT_LIB")]
    ort_lib: Option<PathBuf>,
    /// An export to describe too: which LightOnOCR variant it is, its precisions.
    #[arg(long)]
    model: Option<PathBuf>,
}

/// The `model` line: the export's variant (as `ocrctl.json` names it) and precisions.
fn model_line(dir: &std::path::Path) -> Result<String, String> {
    let m = ocrctl_exporters::manifest::Manifest::load(dir).map_err(|e| e.to_string())?;
    let name = match &m.variant {
        Some(v) => v.name.clone(),
        // Exports made before the variant was recorded.
        None => ocrctl_exporters::family::display_name(
            ocrctl_exporters::family::Generation::Unknown,
            m.model.text.vocab_size,
            None,
        ),
    };
    let precisions: Vec<&str> = m.precisions.iter().map(|p| p.name()).collect();
    Ok(format!(
        "{name} ({}, {})",
        dir.display(),
        precisions.join(", ")
    ))
}

/// One GPU as `nvidia-smi` reports it: name and total memory in MiB.
fn gpus() -> Vec<(String, u64)> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (n, m) = l.rsplit_once(',')?;
            Some((n.trim().to_string(), m.trim().parse().ok()?))
        })
        .collect()
}

/// Tries to start `p` on a one-node model; `Ok` when the session loads with it.
fn starts(env: &ort::environment::Environment, p: Provider) -> Result<(), String> {
    let d = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut g = Graph::create(d.path(), "probe").map_err(|e| e.to_string())?;
    let x = g.input("x", DType::F32, &[Dim::Fixed(4)]);
    let y = g.op("Neg", &[&x], &[]);
    g.output(&y, "y", DType::F32, &[Dim::Fixed(4)]);
    g.finish(&[("", 21)], &[]).map_err(|e| e.to_string())?;
    let cfg = ProviderConfig::default();
    let eps: Vec<_> = dispatch(p, &cfg, "probe").into_iter().collect();
    let build = || -> ort::Result<ort::session::Session> {
        ort::session::Session::builder(env)?
            .with_log_level(ort::logging::LogLevel::Fatal)?
            .with_execution_providers(&eps)?
            .commit_from_file(d.path().join("probe.onnx"))
    };
    build().map(|_| ()).map_err(|e| e.to_string())
}

/// The TensorRT-RTX plugin: found (with its TensorRT-RTX), loaded, and offered a device.
fn trt_rtx_status(env: &ort::environment::Environment) -> String {
    use ocrctl::runtime::trtrtx;
    let lib = match trtrtx::plugin_library() {
        Ok(l) => l,
        Err(e) => return format!("not installed: {e}"),
    };
    let version = trtrtx::bundled_version(&lib).unwrap_or("unknown".into());
    match trtrtx::devices(env) {
        Ok(d) => format!(
            "starts: {} device(s) (plugin {}, TensorRT-RTX {version})",
            d.len(),
            lib.display()
        ),
        Err(e) => format!("plugin found (TensorRT-RTX {version}), but cannot run here: {e}"),
    }
}

/// The ONNX Runtime line; the environment when the library loads.
fn report_ort(a: &DoctorArgs) -> Option<ort::environment::Environment> {
    match ortlib::environment(a.ort_lib.as_deref()) {
        Ok((path, env)) => {
            let v = ortlib::version_of(path)
                .map(|(a, b, c)| format!("{a}.{b}.{c}"))
                .unwrap_or("unknown".into());
            println!("ONNX Runtime   {} (version {v})", path.display());
            Some(env)
        }
        Err(e) => {
            println!("ONNX Runtime   NOT AVAILABLE: {e}");
            None
        }
    }
}

/// Whether provider `p` is in this build and starts.
fn provider_status(env: &ort::environment::Environment, p: Provider) -> String {
    if !compiled_in(p) {
        "not in this build".to_string()
    } else if p == Provider::Cpu {
        "available".to_string()
    } else {
        match starts(env, p) {
            Ok(()) => "starts".to_string(),
            Err(e) => {
                let first = e.lines().next().unwrap_or("");
                match ocrctl::runtime::cudalibs::hint(&e) {
                    Some(h) => format!("in this build, but does not start: {h} ({first})"),
                    None => format!("in this build, but does not start: {first}"),
                }
            }
        }
    }
}

/// The execution providers, TensorRT-RTX's builder, the CUDA libraries and the driver.
fn report_providers(env: &ort::environment::Environment) {
    for p in [Provider::TensorRt, Provider::Cuda, Provider::Cpu] {
        println!("provider       {:<9} {}", p.name(), provider_status(env, p));
    }
    println!("provider       tensorrt-rtx {}", trt_rtx_status(env));
    match ocrctl::runtime::trtrtx::build::python() {
        Ok((py, v)) => println!(
            "TRT-RTX build  TensorRT-RTX {v} builder ({}): ocrctl build-engines works here",
            py.display()
        ),
        Err(e) => println!("TRT-RTX build  not available: {e}"),
    }
    if compiled_in(Provider::Cuda) {
        if let Some(lib) = ortlib::loaded_library() {
            println!(
                "CUDA libraries {}",
                ocrctl::runtime::cudalibs::preload(lib).summary()
            );
        }
        match ocrctl::runtime::cudalibs::driver() {
            Ok(()) => println!("NVIDIA driver  libcuda.so.1 found"),
            Err(e) => println!("NVIDIA driver  not found ({e})"),
        }
    }
}

/// The pdfium line (optional: PDFs only).
fn report_pdfium() {
    match ocrctl::documents::pdf::find_library(None, "PDF input") {
        Ok(path) => println!(
            "pdfium         {} (version {})",
            path.display(),
            ocrctl::documents::pdf::library_version(&path).unwrap_or("unknown".into())
        ),
        Err(e) => println!("pdfium         NOT AVAILABLE (needed for PDFs only): {e}"),
    }
}

/// One line per GPU, with the 8-bit KV caches (`export --kv-cache`) it decodes at full
/// speed.
fn report_gpus(gpus: &[(String, u64)]) {
    if gpus.is_empty() {
        println!("GPU            none found (nvidia-smi missing or no NVIDIA GPU)");
    }
    for (i, (name, mib)) in gpus.iter().enumerate() {
        let cc = match ocrctl::runtime::gpumem::compute_capability(i) {
            Some(cc) => {
                let fast = ocrctl::runtime::ortmodel::fast_8bit_caches(cc);
                let kv = match fast.is_empty() {
                    true => "none".to_string(),
                    false => fast.join(", "),
                };
                format!(
                    ", compute capability {}.{} (8-bit KV caches: {kv})",
                    cc.0, cc.1
                )
            }
            None => String::new(),
        };
        println!("GPU            {name}, {:.1} GiB{cc}", *mib as f64 / 1024.0);
    }
}

/// The host's memory and cores, and which built-in profiles fit this machine.
fn report_host_and_profiles(gpus: &[(String, u64)]) {
    let host = ocrctl::profile::host_memory_bytes();
    if let Some(h) = host {
        println!(
            "host memory    {:.1} GiB, {} cores",
            h as f64 / (1u64 << 30) as f64,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    let gpu_gib = gpus.iter().map(|g| g.1 as f64 / 1024.0).fold(0.0, f64::max);
    for l in ocrctl::profile::available() {
        let Ok(p) = l.profile else { continue };
        let fits = if p.uses_gpu() {
            if gpus.is_empty() {
                "needs an NVIDIA GPU (none found)"
            } else if p.gpu_memory_gb <= gpu_gib + 0.5 {
                "fits this GPU"
            } else {
                "needs a larger GPU"
            }
        } else {
            "runs on the CPU"
        };
        println!(
            "profile        {:<6} {:>5} GiB  {fits}",
            p.name, p.gpu_memory_gb
        );
    }
    println!("(exact budgets: ocrctl profiles check NAME --model DIR)");
}

/// Prints the report; fails when no ONNX Runtime library can be loaded.
pub fn run(a: DoctorArgs) -> anyhow::Result<ExitCode> {
    let env = report_ort(&a);
    let mut ok = env.is_some();
    if let Some(env) = &env {
        report_providers(env);
    }
    report_pdfium();
    if let Some(dir) = &a.model {
        match model_line(dir) {
            Ok(line) => println!("model          {line}"),
            Err(e) => {
                println!("model          NOT USABLE: {e}");
                ok = false;
            }
        }
    }
    let gpus = gpus();
    report_gpus(&gpus);
    report_host_and_profiles(&gpus);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

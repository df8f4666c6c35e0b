//! Building TensorRT-RTX engines ahead of time (`ocrctl build-engines`), on a machine with or
//! without a GPU.
//!
//! The builder is TensorRT-RTX's own, reached through its Python bindings
//! (`tensorrt-rtx-cu13-bindings` + `-libs`, installed by `scripts/setup.sh --trt-rtx`) by a
//! script embedded in this binary ([`SCRIPT`]). The reasons, in the order they decided it:
//! TensorRT-RTX has no C API (a Rust binding would need a C++ shim and NVIDIA's headers,
//! which are not on PyPI); ONNX Runtime's compile API would build through the plugin
//! provider, which cannot load without the NVIDIA driver, so no CI runner could use it; the
//! Python bindings build on a machine with no GPU and no driver, from the same wheels as the
//! plugin's TensorRT-RTX.

use super::engines::BuildSpec;
use ocrctl_exporters::engines::{EngineGraph, EngineSet, TENSORRT_RTX};
use ocrctl_exporters::ExportError;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The builder script (`build_engines.py`), run with the Python that has the bindings.
pub const SCRIPT: &str = include_str!("build_engines.py");
/// The bindings' Python module.
pub const BINDINGS: &str = "tensorrt_rtx_bindings";
/// Environment variable naming the Python to build with.
pub const PYTHON_ENV: &str = "OCRCTL_PYTHON";

/// Why engines could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No Python with the bindings (how many were tried).
    #[error(
        "no Python with the TensorRT-RTX builder ({bindings}) found ({0} tried); install it with \
         scripts/setup.sh --trt-rtx, or set {env} to a python that has \
         tensorrt-rtx-cu13-bindings",
        bindings = BINDINGS,
        env = PYTHON_ENV
    )]
    NoPython(usize),
    /// The engines' folder has no parent.
    #[error("{}: no parent folder", .0.display())]
    NoParent(PathBuf),
    /// A file, folder or program at `path` failed.
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("writing the build plan: {0}")]
    Plan(std::io::Error),
    #[error("the TensorRT-RTX builder failed ({0}); its message is above")]
    Failed(ExitStatus),
    /// The builder's report could not be read or parsed.
    #[error("the TensorRT-RTX builder's report: {0}")]
    Report(String),
    /// The report lacks a graph (its part).
    #[error("the builder reported nothing for {0}")]
    NotReported(String),
    /// An engine could not be hashed.
    #[error("{0}")]
    Digest(ExportError),
}

/// An [`BuildError::Io`] at `path`.
fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |err| BuildError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// A Python that imports the TensorRT-RTX bindings: `$OCRCTL_PYTHON`, else `bin/python` of
/// the `.venv` folders ocrctl searches (see [`crate::runtime::libsearch::venv_prefixes`]).
/// Returns it with the bindings' version.
pub fn python() -> Result<(PathBuf, String), BuildError> {
    let candidates: Vec<PathBuf> = match std::env::var_os(PYTHON_ENV) {
        Some(p) => vec![PathBuf::from(p)],
        None => crate::runtime::libsearch::venv_prefixes()
            .into_iter()
            .map(|v| v.join("bin/python"))
            .filter(|p| p.is_file())
            .collect(),
    };
    for py in &candidates {
        let out = Command::new(py)
            .args([
                "-c",
                &format!("import {BINDINGS} as t; print(t.__version__)"),
            ])
            .stderr(Stdio::null())
            .output();
        if let Ok(o) = out {
            if o.status.success() {
                let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
                return Ok((py.clone(), v));
            }
        }
    }
    Err(BuildError::NoPython(candidates.len()))
}

/// What one build produced, per graph.
#[derive(Debug, serde::Deserialize)]
struct Report {
    tensorrt_rtx_version: String,
    graphs: Vec<ReportGraph>,
}

#[derive(Debug, serde::Deserialize)]
struct ReportGraph {
    part: String,
    engine_bytes: u64,
    build_seconds: f64,
}

/// What the builder script reads on its standard input.
#[derive(Debug, Serialize)]
struct Plan<'a> {
    out_dir: &'a Path,
    report: &'a Path,
    /// Upper case (`SM86`), as the builder takes them.
    compute_capabilities: Vec<String>,
    workspace_bytes: Option<u64>,
    graphs: Vec<PlanGraph<'a>>,
}

/// One graph of a [`Plan`].
#[derive(Debug, Serialize)]
struct PlanGraph<'a> {
    part: &'a str,
    source: PathBuf,
    engine: String,
    context_model: String,
    min: &'a str,
    opt: &'a str,
    max: &'a str,
}

impl<'a> Plan<'a> {
    /// The plan of `spec` for the export in `dir`, built into `out_dir`.
    fn new(spec: &'a BuildSpec, dir: &Path, out_dir: &'a Path, report: &'a Path) -> Plan<'a> {
        let graphs = spec
            .graphs
            .iter()
            .map(|g| PlanGraph {
                part: &g.part,
                source: dir.join(&g.source),
                engine: format!("{}.engine", g.stem),
                context_model: format!("{}_ctx.onnx", g.stem),
                min: &g.min,
                opt: &g.opt,
                max: &g.max,
            })
            .collect();
        Plan {
            out_dir,
            report,
            compute_capabilities: (spec.compute_capabilities.iter())
                .map(|c| c.to_uppercase())
                .collect(),
            workspace_bytes: spec.workspace_bytes,
            graphs,
        }
    }
}

/// Runs the builder script `script` with `python` on `plan`; reads its report.
fn run_builder(python: &Path, script: &Path, plan: &Plan) -> Result<Report, BuildError> {
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        // TensorRT-RTX logs to stdout: both go to ocrctl's stderr.
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(io_at(python))?;
    let plan_text = serde_json::to_string(plan).expect("the plan serialises");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(plan_text.as_bytes())
        .map_err(BuildError::Plan)?;
    let status = child.wait().map_err(io_at(python))?;
    if !status.success() {
        return Err(BuildError::Failed(status));
    }
    let text = std::fs::read(plan.report).map_err(|e| BuildError::Report(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| BuildError::Report(e.to_string()))
}

/// The engine set of `spec` that `report` says was built into `built` (the engines hashed).
fn engine_set(spec: &BuildSpec, report: Report, built: &Path) -> Result<EngineSet, BuildError> {
    let mut set = EngineSet {
        builder: TENSORRT_RTX.to_string(),
        builder_version: report.tensorrt_rtx_version,
        compute_capabilities: spec.compute_capabilities.clone(),
        profile: spec.profile.clone(),
        profile_digest: spec.profile_digest(),
        precision: spec.precision,
        dir: spec.dir.clone(),
        graphs: Default::default(),
    };
    for g in &spec.graphs {
        let r = (report.graphs.iter())
            .find(|r| r.part == g.part)
            .ok_or_else(|| BuildError::NotReported(g.part.clone()))?;
        let engine = format!("{}.engine", g.stem);
        let digest = ocrctl_exporters::verify::digest_file(&built.join(&engine), engine.clone())
            .map_err(BuildError::Digest)?;
        set.graphs.insert(
            g.part.clone(),
            EngineGraph {
                source: g.source.clone(),
                source_digest: g.source_digest.clone(),
                context_model: format!("{}_ctx.onnx", g.stem),
                engine,
                engine_bytes: r.engine_bytes,
                engine_sha256: digest.sha256,
                build_seconds: r.build_seconds,
            },
        );
    }
    Ok(set)
}

/// Builds every graph of `spec` for the export in `dir` with `python`, into a fresh folder
/// that replaces `spec.dir` only when all graphs built. Returns the set to record.
pub fn build(python: &Path, dir: &Path, spec: &BuildSpec) -> Result<EngineSet, BuildError> {
    let final_dir = dir.join(&spec.dir);
    let parent = (final_dir.parent()).ok_or_else(|| BuildError::NoParent(final_dir.clone()))?;
    std::fs::create_dir_all(parent).map_err(io_at(parent))?;
    let tmp = tempfile::Builder::new()
        .prefix(".engines-")
        .tempdir_in(parent)
        .map_err(io_at(parent))?;
    let report_path = tmp.path().join(".report.json");
    let script = tmp.path().join(".build_engines.py");
    std::fs::write(&script, SCRIPT).map_err(io_at(&script))?;
    let plan = Plan::new(spec, dir, tmp.path(), &report_path);
    let report = run_builder(python, &script, &plan)?;
    for f in [&script, &report_path] {
        std::fs::remove_file(f).map_err(io_at(f))?;
    }
    let set = engine_set(spec, report, tmp.path())?;
    // Swap into place: the old engines go only once the new ones are complete.
    let kept = tmp.keep();
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(io_at(&final_dir))?;
    }
    std::fs::rename(&kept, &final_dir).map_err(io_at(&final_dir))?;
    Ok(set)
}

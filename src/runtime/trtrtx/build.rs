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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The builder script (`build_engines.py`), run with the Python that has the bindings.
pub const SCRIPT: &str = include_str!("build_engines.py");
/// The bindings' Python module.
pub const BINDINGS: &str = "tensorrt_rtx_bindings";
/// Environment variable naming the Python to build with.
pub const PYTHON_ENV: &str = "OCRCTL_PYTHON";

/// A Python that imports the TensorRT-RTX bindings: `$OCRCTL_PYTHON`, else `bin/python` of
/// the `.venv` folders ocrctl searches (see [`crate::runtime::libsearch::venv_prefixes`]).
/// Returns it with the bindings' version.
pub fn python() -> Result<(PathBuf, String), String> {
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
    Err(format!(
        "no Python with the TensorRT-RTX builder ({BINDINGS}) found ({} tried); install it with \
         scripts/setup.sh --trt-rtx, or set {PYTHON_ENV} to a python that has \
         tensorrt-rtx-cu13-bindings",
        candidates.len()
    ))
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

/// Builds every graph of `spec` for the export in `dir` with `python`, into a fresh folder
/// that replaces `spec.dir` only when all graphs built. Returns the set to record.
pub fn build(python: &Path, dir: &Path, spec: &BuildSpec) -> Result<EngineSet, String> {
    let final_dir = dir.join(&spec.dir);
    let parent = final_dir
        .parent()
        .ok_or_else(|| format!("{}: no parent folder", final_dir.display()))?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".engines-")
        .tempdir_in(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    let graphs: Vec<serde_json::Value> = spec
        .graphs
        .iter()
        .map(|g| {
            serde_json::json!({
                "part": g.part,
                "source": dir.join(&g.source),
                "engine": format!("{}.engine", g.stem),
                "context_model": format!("{}_ctx.onnx", g.stem),
                "min": g.min, "opt": g.opt, "max": g.max,
            })
        })
        .collect();
    let report_path = tmp.path().join(".report.json");
    let plan = serde_json::json!({
        "out_dir": tmp.path(),
        "report": report_path,
        "compute_capabilities": spec.compute_capabilities.iter()
            .map(|c| c.to_uppercase()).collect::<Vec<_>>(),
        "workspace_bytes": spec.workspace_bytes,
        "graphs": graphs,
    });
    let script = tmp.path().join(".build_engines.py");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        // TensorRT-RTX logs to stdout: both go to ocrctl's stderr.
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(plan.to_string().as_bytes())
        .map_err(|e| format!("writing the build plan: {e}"))?;
    let status = child
        .wait()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !status.success() {
        return Err(format!(
            "the TensorRT-RTX builder failed ({status}); its message is above"
        ));
    }
    let text = std::fs::read(&report_path)
        .map_err(|e| format!("the TensorRT-RTX builder's report: {e}"))?;
    let report: Report = serde_json::from_slice(&text)
        .map_err(|e| format!("the TensorRT-RTX builder's report: {e}"))?;
    for f in [&script, &report_path] {
        std::fs::remove_file(f).map_err(|e| format!("{}: {e}", f.display()))?;
    }

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
        let r = report
            .graphs
            .iter()
            .find(|r| r.part == g.part)
            .ok_or_else(|| format!("the builder reported nothing for {}", g.part))?;
        let engine = format!("{}.engine", g.stem);
        let digest =
            ocrctl_exporters::verify::digest_file(&tmp.path().join(&engine), engine.clone())
                .map_err(|e| e.to_string())?;
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
    // Swap into place: the old engines go only once the new ones are complete.
    let kept = tmp.keep();
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(|e| format!("{}: {e}", final_dir.display()))?;
    }
    std::fs::rename(&kept, &final_dir).map_err(|e| format!("{}: {e}", final_dir.display()))?;
    Ok(set)
}

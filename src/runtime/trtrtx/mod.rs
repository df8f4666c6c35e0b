//! TensorRT for RTX through ONNX Runtime's `NvTensorRTRTXExecutionProvider` plugin.
//!
//! The provider ships as its own wheel (`onnxruntime-ep-nv-tensorrt-rtx-cu13`, installed by
//! `scripts/setup.sh --gpu`): a shared library with TensorRT-RTX and the CUDA runtime next to
//! it, which works with the plain `onnxruntime` build. It is not a provider compiled into
//! ONNX Runtime, so it is not appended by name: the library is registered with the
//! environment once ([`devices`] → `RegisterExecutionProviderLibrary`), ONNX Runtime's device
//! discovery then offers one `OrtEpDevice` per supported GPU, and a session appends the
//! provider for those devices with its options (`SessionOptionsAppendExecutionProvider_V2`,
//! the `ort` crate's `with_devices`).
//!
//! Where it cannot run, it says why and the runner falls back like for any other provider:
//! - the library is absent (`plugin_library`: not installed);
//! - it cannot load: it links the NVIDIA driver (`libcuda.so.1`, `libnvidia-ml.so.1`);
//! - ONNX Runtime finds no GPU for it: discovery reads `/sys/class/drm`, absent in some
//!   containers, and the provider only takes GeForce RTX / RTX workstation class GPUs of
//!   compute capability 8.6, 8.9 or 12.0 and later (not an A100, H100 or H200).
//!
//! Engines: with prebuilt engines ([`engines`], `ocrctl build-engines`) a session loads the
//! EPContext model instead of the graph; otherwise the provider builds the engine when the
//! session starts (JIT), with the profile's shape ranges, and keeps the kernels it compiled in
//! the runtime cache folder across starts.
//!
//! ```no_run
//! let lib = ocrctl::runtime::trtrtx::plugin_library()?;
//! println!("TensorRT-RTX plugin: {} (TensorRT-RTX {:?})", lib.display(),
//!          ocrctl::runtime::trtrtx::bundled_version(&lib));
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod build;
pub mod engines;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The provider's name in ONNX Runtime (and the prefix of its session options).
pub const EP_NAME: &str = "NvTensorRTRTXExecutionProvider";
/// The plugin library in its wheel.
pub const PLUGIN_LIBRARY: &str = "libonnxruntime_providers_nv_tensorrt_rtx.so";
/// The wheel's Python package (the folder holding the library).
pub const PLUGIN_PACKAGE: &str = "onnxruntime_ep_nv_tensorrt_rtx";
/// Environment variable naming the plugin library directly.
pub const PLUGIN_ENV: &str = "OCRCTL_TRT_RTX_EP";
/// Environment variable (`1`) registering the plugin under a `.virtual` name, which lets it
/// offer devices the process cannot see (ONNX Runtime ≥ 1.24 passes `allow_virtual_devices`);
/// for compile-only experiments, not for serving.
pub const VIRTUAL_ENV: &str = "OCRCTL_TRT_RTX_VIRTUAL";

/// Why the TensorRT-RTX plugin cannot run: its library, its load (the driver), or no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// `$OCRCTL_TRT_RTX_EP` names no file.
    #[error("{env}={}: no such file", .0.display(), env = PLUGIN_ENV)]
    NoSuchFile(PathBuf),
    /// Not in any of the folders searched (their number).
    #[error(
        "the TensorRT-RTX plugin ({lib}) is not installed (looked in {0} \
         folders, e.g. .venv/lib/python3*/site-packages/{package}); install it \
         with scripts/setup.sh --gpu or set {env}",
        lib = PLUGIN_LIBRARY,
        package = PLUGIN_PACKAGE,
        env = PLUGIN_ENV
    )]
    NotInstalled(usize),
    /// The loader's (or ONNX Runtime's) message, and the fix when it is the driver.
    #[error("the TensorRT-RTX plugin did not load ({message}){hint}")]
    Load { message: String, hint: &'static str },
    /// Registered, but offered no device; `drm` says when device discovery cannot work here.
    #[error(
        "ONNX Runtime offers no device to {ep}{0}; it runs on GeForce RTX and RTX \
         workstation GPUs of compute capability 8.6, 8.9 or 12.0+, not on data-centre \
         GPUs such as the A100, H100 or H200",
        ep = EP_NAME
    )]
    NoDevice(&'static str),
}

/// TensorRT-RTX provider settings (from a profile's `tensorrt_rtx` section).
#[derive(Debug, Clone, Default)]
pub struct TrtRtxConfig {
    /// `nv_runtime_cache_path`: kernels compiled at run time, kept across starts.
    pub runtime_cache: Option<PathBuf>,
    /// `enable_cuda_graph` (fixed shapes only).
    pub cuda_graphs: bool,
    /// `nv_max_workspace_size`, bytes.
    pub workspace: Option<usize>,
    /// `nv_max_shared_mem_size`, bytes.
    pub max_shared_mem: Option<usize>,
    /// Graph stem → (min, opt, max) shape strings, for engines built when a session starts.
    pub shapes: BTreeMap<String, (String, String, String)>,
    /// Graph stem → EPContext model of a prebuilt engine that matches this profile and export.
    pub engines: BTreeMap<String, PathBuf>,
}

impl TrtRtxConfig {
    /// Provider options for graph `part` (a graph file stem), keys prefixed with the provider
    /// name as `with_devices` expects. Prebuilt engines carry their shapes, so shape ranges
    /// are passed only when the provider builds the engine itself.
    pub fn options(&self, part: &str) -> Vec<(String, String)> {
        let mut o: Vec<(&str, String)> = Vec::new();
        if let Some(d) = &self.runtime_cache {
            o.push(("nv_runtime_cache_path", d.display().to_string()));
        }
        o.push(("enable_cuda_graph", u8::from(self.cuda_graphs).to_string()));
        if let Some(w) = self.workspace {
            o.push(("nv_max_workspace_size", w.to_string()));
        }
        if let Some(m) = self.max_shared_mem {
            o.push(("nv_max_shared_mem_size", m.to_string()));
        }
        if !self.engines.contains_key(part) {
            if let Some((min, opt, max)) = self.shapes.get(part) {
                o.push(("nv_profile_min_shapes", min.clone()));
                o.push(("nv_profile_opt_shapes", opt.clone()));
                o.push(("nv_profile_max_shapes", max.clone()));
            }
        }
        o.into_iter()
            .map(|(k, v)| (format!("{EP_NAME}.{k}"), v))
            .collect()
    }
}

/// The plugin library: `$OCRCTL_TRT_RTX_EP`, else the wheel's folder where ocrctl looks for
/// wheels (see [`crate::runtime::libsearch::wheel_dirs`]). The error says where it looked and
/// how to install it.
pub fn plugin_library() -> Result<PathBuf, PluginError> {
    if let Some(p) = std::env::var_os(PLUGIN_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(PluginError::NoSuchFile(p))
        };
    }
    let dirs = crate::runtime::libsearch::wheel_dirs(PLUGIN_PACKAGE);
    dirs.iter()
        .map(|d| d.join(PLUGIN_LIBRARY))
        .find(|p| p.is_file())
        .ok_or(PluginError::NotInstalled(dirs.len()))
}

/// The TensorRT-RTX version bundled next to the plugin (`1.7.1` from
/// `libtensorrt_rtx.so.1.7.1`), if it can be told from the file names.
pub fn bundled_version(plugin: &Path) -> Option<String> {
    let dir = plugin.parent()?;
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("libtensorrt_rtx.so.").map(str::to_string))
        .filter(|v| v.split('.').count() >= 3)
        .collect();
    v.sort();
    v.pop()
}

/// Registers the plugin with `env` (once per process) and returns the devices ONNX Runtime
/// offers it. The error says what stopped it: the library, its load (the driver), or no
/// device.
pub fn devices(
    env: &ort::environment::Environment,
) -> Result<Vec<ort::device::Device<'_>>, PluginError> {
    static REGISTERED: OnceLock<Result<(), PluginError>> = OnceLock::new();
    REGISTERED.get_or_init(|| register(env)).clone()?;
    let found: Vec<_> = env
        .devices()
        .filter(|d| d.ep().is_ok_and(|n| n == EP_NAME))
        .collect();
    if found.is_empty() {
        let drm = if Path::new("/sys/class/drm").exists() {
            ""
        } else {
            " (/sys/class/drm is absent here: ONNX Runtime's device discovery sees no GPU in \
             this container)"
        };
        return Err(PluginError::NoDevice(drm));
    }
    Ok(found)
}

/// True the first time it is called: the runner reports the provider's absence once per
/// process, not once per graph.
pub fn first_report() -> bool {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    !DONE.swap(true, std::sync::atomic::Ordering::Relaxed)
}

fn register(env: &ort::environment::Environment) -> Result<(), PluginError> {
    let lib = plugin_library()?;
    // The plugin links TensorRT-RTX and the CUDA runtime by soname; its wheel ships them
    // under versioned names only (the Python package makes the links when imported), so the
    // files are loaded first, globally, to satisfy those sonames.
    if let Some(dir) = lib.parent() {
        for prefix in [
            "libcudart.so.",
            "libtensorrt_rtx.so.",
            "libtensorrt_onnxparser_rtx.so.",
        ] {
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|rd| {
                    rd.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| {
                            p.file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with(prefix))
                        })
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            if let Some(f) = files.pop() {
                crate::runtime::cudalibs::open_global(&f)
                    .map_err(|e| load_error(&e.to_string()))?;
            }
        }
    }
    let name = if std::env::var(VIRTUAL_ENV).as_deref() == Ok("1") {
        "NvTensorRTRTX.virtual"
    } else {
        "NvTensorRTRTX"
    };
    env.register_ep_library(name, &lib)
        .map_err(|e| load_error(&e.to_string()))
}

/// A load failure of the plugin (ONNX Runtime's message names the library already), with
/// the fix when it is the driver.
fn load_error(e: &str) -> PluginError {
    let hint = if e.contains("libcuda.so.1") || e.contains("libnvidia-ml.so.1") {
        ": the plugin needs the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1), which this \
         machine does not have"
    } else {
        ""
    };
    PluginError::Load {
        message: e.to_string(),
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_carry_shapes_only_without_a_prebuilt_engine() {
        let mut c = TrtRtxConfig {
            runtime_cache: Some(PathBuf::from("/m/trt-rtx/cache")),
            workspace: Some(1 << 30),
            ..TrtRtxConfig::default()
        };
        c.shapes.insert(
            "vision_encoder_q4f16".into(),
            ("a:1".into(), "a:2".into(), "a:3".into()),
        );
        let o = c.options("vision_encoder_q4f16");
        let get = |o: &[(String, String)], k: &str| {
            o.iter()
                .find(|(key, _)| key == &format!("{EP_NAME}.{k}"))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get(&o, "nv_runtime_cache_path").as_deref(),
            Some("/m/trt-rtx/cache")
        );
        assert_eq!(
            get(&o, "nv_max_workspace_size").as_deref(),
            Some("1073741824")
        );
        assert_eq!(get(&o, "enable_cuda_graph").as_deref(), Some("0"));
        assert_eq!(get(&o, "nv_profile_max_shapes").as_deref(), Some("a:3"));
        c.engines.insert(
            "vision_encoder_q4f16".into(),
            PathBuf::from("/m/x_ctx.onnx"),
        );
        let o = c.options("vision_encoder_q4f16");
        assert_eq!(get(&o, "nv_profile_max_shapes"), None);
        assert_eq!(
            get(&o, "nv_runtime_cache_path").as_deref(),
            Some("/m/trt-rtx/cache")
        );
    }

    /// The messages are those the functions wrote before they had an error type.
    #[test]
    fn errors_say_what_they_said() {
        let p = PathBuf::from("/x/lib.so");
        assert_eq!(
            PluginError::NoSuchFile(p.clone()).to_string(),
            format!("{PLUGIN_ENV}={}: no such file", p.display())
        );
        assert_eq!(
            PluginError::NotInstalled(3).to_string(),
            format!(
                "the TensorRT-RTX plugin ({PLUGIN_LIBRARY}) is not installed (looked in {} \
                 folders, e.g. .venv/lib/python3*/site-packages/{PLUGIN_PACKAGE}); install it \
                 with scripts/setup.sh --gpu or set {PLUGIN_ENV}",
                3
            )
        );
        assert_eq!(
            load_error("libcuda.so.1: cannot open").to_string(),
            "the TensorRT-RTX plugin did not load (libcuda.so.1: cannot open): the plugin needs \
             the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1), which this machine does not have"
        );
        let drm = " (no drm)";
        assert_eq!(
            PluginError::NoDevice(drm).to_string(),
            format!(
                "ONNX Runtime offers no device to {EP_NAME}{drm}; it runs on GeForce RTX and RTX \
                 workstation GPUs of compute capability 8.6, 8.9 or 12.0+, not on data-centre \
                 GPUs such as the A100, H100 or H200"
            )
        );
    }

    #[test]
    fn the_bundled_version_comes_from_the_library_names() {
        let d = tempfile::tempdir().unwrap();
        for f in [
            PLUGIN_LIBRARY,
            "libtensorrt_rtx.so.1.7.1",
            "libtensorrt_rtx.so.1",
        ] {
            std::fs::write(d.path().join(f), b"").unwrap();
        }
        assert_eq!(
            bundled_version(&d.path().join(PLUGIN_LIBRARY)).as_deref(),
            Some("1.7.1")
        );
    }
}

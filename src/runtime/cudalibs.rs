//! The CUDA 13 and cuDNN 9 libraries of NVIDIA's pip wheels, for ONNX Runtime's CUDA provider.
//!
//! `onnxruntime-gpu`'s provider library (`libonnxruntime_providers_cuda.so`) needs cuBLAS,
//! cuRAND, the CUDA runtime and cuDNN but carries no RUNPATH, so libraries installed as wheels
//! (`scripts/setup.sh --gpu`: `site-packages/nvidia/cu13/lib`, `site-packages/nvidia/cudnn/lib`)
//! are not found by the dynamic loader on their own. Before a GPU provider is registered,
//! ocrctl loads them from the site-packages that holds the ONNX Runtime library in use, with
//! `RTLD_GLOBAL`, so that the provider's dependencies resolve to them by their sonames — what
//! the `onnxruntime` Python package's `preload_dlls()` does. A library the wheels lack is left to
//! the system's search path (`/usr/local/cuda/lib64`, `LD_LIBRARY_PATH`, `ld.so.conf`), so a
//! machine with a system CUDA needs no wheels at all.
//!
//! The driver (`libcuda.so.1`) never comes from a wheel: [`driver`] says whether one is there.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A library the dynamic loader could not load; says what the loader said.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LibraryError(libloading::Error);

/// The CUDA libraries, in load order (cuBLAS needs cuBLASLt first), and whether each is
/// required by the provider (the others are loaded when present, as ONNX Runtime does).
pub const CUDA_LIBS: [(&str, bool); 6] = [
    ("libcublasLt.so.13", true),
    ("libcublas.so.13", true),
    ("libnvrtc.so.13", false),
    ("libcurand.so.10", true),
    ("libcufft.so.12", false),
    ("libcudart.so.13", true),
];

/// cuDNN's entry library (it loads its sub-libraries from its own folder).
pub const CUDNN_LIB: &str = "libcudnn.so.9";

/// The folders of the NVIDIA wheels in the site-packages of `ort_lib`
/// (`<site-packages>/onnxruntime/capi/libonnxruntime.so.*`): `nvidia/cu13/lib` and
/// `nvidia/cudnn/lib`, those that exist.
pub fn wheel_dirs(ort_lib: &Path) -> Vec<PathBuf> {
    let Some(site) = ort_lib
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
    else {
        return Vec::new();
    };
    ["nvidia/cu13/lib", "nvidia/cudnn/lib"]
        .iter()
        .map(|s| site.join(s))
        .filter(|d| d.is_dir())
        .collect()
}

/// What [`preload`] did.
#[derive(Debug, Clone, Default)]
pub struct Preload {
    /// The wheel folders searched.
    pub dirs: Vec<PathBuf>,
    /// Libraries loaded from them.
    pub loaded: Vec<PathBuf>,
    /// Required libraries none of the folders holds (left to the system's search path).
    pub absent: Vec<&'static str>,
    /// Libraries present that failed to load, with the loader's message.
    pub failed: Vec<(PathBuf, String)>,
}

impl Preload {
    /// One line for `doctor` and logs.
    pub fn summary(&self) -> String {
        if self.dirs.is_empty() {
            return "none from pip wheels (the system's search path is used; \
                    scripts/setup.sh --gpu installs them)"
                .into();
        }
        let names: Vec<String> = self
            .loaded
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let mut s = format!(
            "{} loaded from {}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            },
            self.dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !self.absent.is_empty() {
            s.push_str(&format!(
                "; not in the wheels (system path used): {}",
                self.absent.join(", ")
            ));
        }
        for (p, e) in &self.failed {
            s.push_str(&format!("; {} failed to load: {e}", p.display()));
        }
        s
    }
}

/// The libraries [`preload`] would load from `dirs`, in order, and the required ones missing.
pub fn plan(dirs: &[PathBuf]) -> (Vec<PathBuf>, Vec<&'static str>) {
    let mut found = Vec::new();
    let mut absent = Vec::new();
    let wanted = CUDA_LIBS.iter().copied().chain([(CUDNN_LIB, true)]);
    for (name, required) in wanted {
        match dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
            Some(p) => found.push(p),
            None if required => absent.push(name),
            None => {}
        }
    }
    (found, absent)
}

/// Loads the wheels' CUDA libraries next to `ort_lib` once per process (later calls return
/// the first result). Loading never fails the caller: what could not be loaded is reported,
/// and the provider's own start then says what is missing.
pub fn preload(ort_lib: &Path) -> &'static Preload {
    static DONE: OnceLock<Preload> = OnceLock::new();
    DONE.get_or_init(|| {
        let dirs = wheel_dirs(ort_lib);
        let (found, absent) = plan(&dirs);
        let mut out = Preload {
            dirs,
            absent: if found.is_empty() { Vec::new() } else { absent },
            ..Preload::default()
        };
        for p in found {
            match open_global(&p) {
                Ok(()) => out.loaded.push(p),
                Err(e) => out.failed.push((p, e.to_string())),
            }
        }
        out
    })
}

/// `dlopen(path, RTLD_NOW | RTLD_GLOBAL)`, kept loaded for the life of the process (the
/// provider library links against it by soname).
pub(crate) fn open_global(path: &Path) -> Result<(), LibraryError> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: these are NVIDIA's runtime libraries; their initialisers only set up state.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(LibraryError)?;
    std::mem::forget(lib);
    Ok(())
}

/// Whether the NVIDIA driver's `libcuda.so.1` can be loaded (the loader's message if not).
pub fn driver() -> Result<(), LibraryError> {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
    // SAFETY: loading the driver library only registers it; nothing is called.
    unsafe { Library::open(Some("libcuda.so.1"), RTLD_LAZY | RTLD_LOCAL) }
        .map(drop)
        .map_err(LibraryError)
}

/// What to do about a provider start failure whose message shows a missing library.
pub fn hint(message: &str) -> Option<&'static str> {
    if message.contains("libcuda.so") {
        Some("no NVIDIA driver: libcuda.so.1 is not on this machine (install the NVIDIA driver; in a container, run it with the GPU exposed)")
    } else if message.contains("libnvinfer") {
        Some("TensorRT 10 is not installed (its pip packages only download from NVIDIA's servers); the CUDA provider runs without it")
    } else if [
        "libcublas",
        "libcudnn",
        "libcurand",
        "libcudart",
        "libcufft",
    ]
    .iter()
    .any(|l| message.contains(l))
    {
        Some("CUDA 13 / cuDNN 9 libraries not found: run scripts/setup.sh --gpu (pip wheels in .venv), or put CUDA 13's lib64 on LD_LIBRARY_PATH")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel_layout(libs: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let site = d.path().join("lib/python3.12/site-packages");
        let capi = site.join("onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        let ort = capi.join("libonnxruntime.so.1.31.1");
        std::fs::write(&ort, b"").unwrap();
        for l in libs {
            let dir = if l.starts_with("libcudnn") {
                "nvidia/cudnn/lib"
            } else {
                "nvidia/cu13/lib"
            };
            std::fs::create_dir_all(site.join(dir)).unwrap();
            std::fs::write(site.join(dir).join(l), b"").unwrap();
        }
        (d, ort)
    }

    #[test]
    fn the_wheels_next_to_onnxruntime_are_planned_in_load_order() {
        let (_d, ort) = wheel_layout(&[
            "libcudart.so.13",
            "libcublas.so.13",
            "libcublasLt.so.13",
            "libcurand.so.10",
            "libcudnn.so.9",
        ]);
        let dirs = wheel_dirs(&ort);
        assert_eq!(dirs.len(), 2);
        let (found, absent) = plan(&dirs);
        let names: Vec<_> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "libcublasLt.so.13",
                "libcublas.so.13",
                "libcurand.so.10",
                "libcudart.so.13",
                "libcudnn.so.9"
            ]
        );
        // nvrtc and cufft are optional, as in onnxruntime's own preload.
        assert!(absent.is_empty(), "{absent:?}");
    }

    #[test]
    fn missing_required_libraries_are_named_and_no_wheels_means_the_system_path() {
        let (_d, ort) = wheel_layout(&["libcudart.so.13"]);
        let (_, absent) = plan(&wheel_dirs(&ort));
        assert_eq!(
            absent,
            [
                "libcublasLt.so.13",
                "libcublas.so.13",
                "libcurand.so.10",
                "libcudnn.so.9"
            ]
        );
        let (_e, bare) = wheel_layout(&[]);
        assert!(wheel_dirs(&bare).is_empty());
        let p = Preload::default();
        assert!(p.summary().contains("setup.sh --gpu"), "{}", p.summary());
    }

    #[test]
    fn loader_messages_get_the_fix() {
        let m = "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open shared object file";
        assert!(hint(m).unwrap().contains("setup.sh --gpu"));
        assert!(hint("libcuda.so.1: cannot open shared object file")
            .unwrap()
            .contains("driver"));
        assert!(hint("CUDA failure 100: no CUDA-capable device is detected").is_none());
    }

    #[test]
    fn a_file_that_is_no_library_is_reported_not_fatal() {
        let d = tempfile::tempdir().unwrap();
        let bad = d.path().join("libcudart.so.13");
        std::fs::write(&bad, b"not an ELF file").unwrap();
        assert!(open_global(&bad).is_err());
    }
}

//! Finding, loading and calling the pdfium shared library (`libpdfium.so` from the
//! `pypdfium2` wheel), declared here by hand: only the dozen C functions ocrctl needs.
//!
//! pdfium is not thread-safe. Every call goes through [`with_pdfium`], which holds one
//! process-wide mutex, loads and initialises the library on first use, and hands out the
//! function table. The library is never unloaded.

use super::PdfError;
use crate::runtime::libsearch;
use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The `pypdfium2` wheel `scripts/setup.sh` installs (it carries pdfium 159.0.8149).
pub const PYPDFIUM2_VERSION: &str = "5.15.2";

/// Environment variable naming the library explicitly (like `--pdfium-lib`).
pub const PDFIUM_LIB_ENV: &str = "OCRCTL_PDFIUM_LIB";

/// Where the wheel keeps the library, under site-packages.
const WHEEL_SUBDIR: &str = "pypdfium2_raw";
const LIB_NAMES: &[&str] = &["libpdfium.so", "libpdfium.dylib", "pdfium.dll"];

// fpdfview.h
pub type Handle = *mut c_void;
pub const FPDF_ERR_FILE: c_ulong = 2;
pub const FPDF_ERR_FORMAT: c_ulong = 3;
pub const FPDF_ERR_PASSWORD: c_ulong = 4;
pub const FPDF_ERR_SECURITY: c_ulong = 5;
/// Render flag: draw annotations (and form fields that carry an appearance stream).
pub const FPDF_ANNOT: c_int = 0x01;

/// The pdfium functions ocrctl calls (signatures from `fpdfview.h`). They are declared
/// `C-unwind`: pdfium throws `std::bad_alloc` when an allocation fails, and a C++ exception
/// crossing a plain `extern "C"` call skips Rust's landing pads (the PDF worker then hung on
/// the pdfium lock a skipped guard still held instead of aborting).
pub struct Fns {
    pub load_mem_document64:
        unsafe extern "C-unwind" fn(*const c_void, usize, *const c_char) -> Handle,
    pub get_last_error: unsafe extern "C-unwind" fn() -> c_ulong,
    pub get_page_count: unsafe extern "C-unwind" fn(Handle) -> c_int,
    pub load_page: unsafe extern "C-unwind" fn(Handle, c_int) -> Handle,
    pub get_page_width_f: unsafe extern "C-unwind" fn(Handle) -> c_float,
    pub get_page_height_f: unsafe extern "C-unwind" fn(Handle) -> c_float,
    pub bitmap_create: unsafe extern "C-unwind" fn(c_int, c_int, c_int) -> Handle,
    /// Returns FPDF_BOOL in current pdfium (void in old releases; the value is ignored).
    pub bitmap_fill_rect:
        unsafe extern "C-unwind" fn(Handle, c_int, c_int, c_int, c_int, c_ulong) -> c_int,
    pub render_page_bitmap:
        unsafe extern "C-unwind" fn(Handle, Handle, c_int, c_int, c_int, c_int, c_int, c_int),
    pub bitmap_get_buffer: unsafe extern "C-unwind" fn(Handle) -> *mut c_void,
    pub bitmap_get_stride: unsafe extern "C-unwind" fn(Handle) -> c_int,
    pub bitmap_destroy: unsafe extern "C-unwind" fn(Handle),
    pub close_page: unsafe extern "C-unwind" fn(Handle),
    pub close_document: unsafe extern "C-unwind" fn(Handle),
    // fpdf_text.h: a page's text layer (the `--fallback text` of a page that failed).
    pub text_load_page: unsafe extern "C-unwind" fn(Handle) -> Handle,
    pub text_count_chars: unsafe extern "C-unwind" fn(Handle) -> c_int,
    /// UTF-16LE into the buffer, with a terminating NUL; returns the units written.
    pub text_get_text: unsafe extern "C-unwind" fn(Handle, c_int, c_int, *mut u16) -> c_int,
    pub text_close_page: unsafe extern "C-unwind" fn(Handle),
}

struct Loaded {
    fns: Fns,
    _lib: libloading::Library,
}

static LIB: OnceLock<Loaded> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

/// Candidate directories in search order (explicit paths excluded):
/// [`libsearch::wheel_dirs`] of the `pypdfium2` wheel's `pypdfium2_raw`.
pub fn candidate_dirs() -> Vec<PathBuf> {
    libsearch::wheel_dirs(WHEEL_SUBDIR)
}

/// Locates the pdfium library: `explicit` (`--pdfium-lib`), else `$OCRCTL_PDFIUM_LIB`, else
/// the first of [`candidate_dirs`] holding `libpdfium.so` (`.dylib`, `pdfium.dll`). `name` is the document the error names.
pub fn find_library(explicit: Option<&Path>, name: &str) -> Result<PathBuf, PdfError> {
    let env = std::env::var_os(PDFIUM_LIB_ENV).filter(|v| !v.is_empty());
    let given = match (explicit, &env) {
        (Some(p), _) => Some((p.to_path_buf(), "--pdfium-lib")),
        (None, Some(v)) => Some((PathBuf::from(v), PDFIUM_LIB_ENV)),
        (None, None) => None,
    };
    if let Some((path, origin)) = given {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(PdfError::LibraryMissing {
                name: name.to_string(),
                path,
                origin: origin.to_string(),
            })
        };
    }
    let dirs = candidate_dirs();
    for d in &dirs {
        for lib in LIB_NAMES {
            let p = d.join(lib);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    let mut searched: Vec<String> = Vec::new();
    for d in dirs {
        let s = d.display().to_string();
        if !searched.contains(&s) {
            searched.push(s);
        }
    }
    Err(PdfError::LibraryNotFound {
        name: name.to_string(),
        searched: searched.join("\n  "),
    })
}

/// pdfium's version as the pypdfium2 wheel records it (`version.json` next to the library:
/// `major.minor.build.patch`), if it is there.
pub fn library_version(lib: &Path) -> Option<String> {
    let text = std::fs::read_to_string(lib.parent()?.join("version.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let part = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    Some(format!(
        "{}.{}.{}.{}",
        part("major")?,
        part("minor")?,
        part("build")?,
        part("patch")?
    ))
}

fn load(path: &Path, name: &str) -> Result<Loaded, PdfError> {
    let err = |message: String| PdfError::LibraryLoad {
        name: name.to_string(),
        path: path.to_path_buf(),
        message,
    };
    // SAFETY: loading pdfium runs its (trivial) static initialisers; we hold LOCK.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| err(e.to_string()))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the declared type matches the C prototype in fpdfview.h.
            *unsafe { lib.get($name) }.map_err(|e| err(format!("{}: {e}", $name)))?
        };
    }
    let fns = Fns {
        load_mem_document64: sym!("FPDF_LoadMemDocument64"),
        get_last_error: sym!("FPDF_GetLastError"),
        get_page_count: sym!("FPDF_GetPageCount"),
        load_page: sym!("FPDF_LoadPage"),
        get_page_width_f: sym!("FPDF_GetPageWidthF"),
        get_page_height_f: sym!("FPDF_GetPageHeightF"),
        bitmap_create: sym!("FPDFBitmap_Create"),
        bitmap_fill_rect: sym!("FPDFBitmap_FillRect"),
        render_page_bitmap: sym!("FPDF_RenderPageBitmap"),
        bitmap_get_buffer: sym!("FPDFBitmap_GetBuffer"),
        bitmap_get_stride: sym!("FPDFBitmap_GetStride"),
        bitmap_destroy: sym!("FPDFBitmap_Destroy"),
        close_page: sym!("FPDF_ClosePage"),
        close_document: sym!("FPDF_CloseDocument"),
        text_load_page: sym!("FPDFText_LoadPage"),
        text_count_chars: sym!("FPDFText_CountChars"),
        text_get_text: sym!("FPDFText_GetText"),
        text_close_page: sym!("FPDFText_ClosePage"),
    };
    let init: unsafe extern "C-unwind" fn() = sym!("FPDF_InitLibrary");
    // SAFETY: called once, before any other pdfium function, under LOCK.
    unsafe { init() };
    Ok(Loaded { fns, _lib: lib })
}

/// Runs `f` with the pdfium functions while holding the process-wide pdfium lock, loading
/// and initialising the library first if this process has not yet (`explicit` and `name`
/// as for [`find_library`]; once loaded, the library in use stays).
pub fn with_pdfium<T>(
    explicit: Option<&Path>,
    name: &str,
    f: impl FnOnce(&Fns) -> T,
) -> Result<T, PdfError> {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let lib = match LIB.get() {
        Some(l) => l,
        None => {
            let path = find_library(explicit, name)?;
            let loaded = load(&path, name)?;
            LIB.get_or_init(|| loaded)
        }
    };
    Ok(f(&lib.fns))
}

/// Like [`with_pdfium`] for code that owns a pdfium handle, so the library is loaded.
pub fn with_loaded<T>(f: impl FnOnce(&Fns) -> T) -> T {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let lib = LIB
        .get()
        .expect("a pdfium handle exists only once the library is loaded");
    f(&lib.fns)
}

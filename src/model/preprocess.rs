//! Image loading and preprocessing for the LightOnOCR (Pixtral) vision encoder.
//!
//! The pipeline reproduces the reference `PixtralImageProcessor` (transformers, PIL backend):
//!
//! 1. **Load** ([`load_image`], [`decode_image_bytes`]): read the header, refuse empty images and
//!    images above a pixel budget *before* decoding (decompression-bomb guard), decode, apply the
//!    EXIF orientation (as transformers' `load_image` does with `ImageOps.exif_transpose`), and
//!    convert to 8-bit RGB. Transparent pixels are pasted onto an opaque white background with the
//!    alpha channel as mask, exactly like Pixtral's `convert_to_rgb`
//!    (`Image.new("RGBA", size, "WHITE").paste(im, (0, 0), im)`) and vLLM's `rgba_to_rgb`, using
//!    Pillow's integer blend (`DIV255(255·(255−a) + c·a)`), so the bytes match Pillow's.
//! 2. **Size** ([`target_size`]): scale down (never up) so the longest side fits
//!    `longest_edge`, flooring like Python, then round each side *up* to a multiple of
//!    `patch_size · merge_size` (28 for LightOnOCR).
//! 3. **Resize** ([`resize_bicubic`]): a bit-exact port of the arithmetic of Pillow's
//!    `Image.resize(size, Image.BICUBIC)` for 8-bit RGB (separable, antialiased on downscale,
//!    22-bit fixed-point weights, rounding and clamping after each pass, and Pillow 13's choice
//!    of which pass runs first).
//!    Verified byte for byte against Pillow 13.0 by the fixtures in `tests/fixtures/resize/`.
//!    (transformers' default torchvision backend resizes with torch's uint8 antialiased bicubic
//!    instead, which differs from Pillow by 1–2 levels on roughly 0.1–3 % of pixels.)
//! 4. **Normalise** ([`preprocess`], [`Pixels`]): `((x · rescale_factor) as f32 − mean[c]) /
//!    std[c]`, where the product is taken in `f64` and rounded to `f32` (transformers' `rescale`
//!    multiplies in float64 and downcasts) and the subtraction and division run in `f32` (its
//!    `normalize`), laid out NCHW as `[1, 3, H, W]`. One table per channel holds the 256 values;
//!    a page keeps its 8-bit pixels and the tables until the encoder runs, and the float32 values
//!    are written where they are used (4× less memory while a request waits).

use std::fs::File;
use std::io::{BufRead, BufReader, Cursor, Seek};
use std::path::{Path, PathBuf};

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageReader, Limits, RgbImage};
use serde_json::Value;

/// Default pixel budget for [`load_image`] and [`decode_image_bytes`]: 100 megapixels, e.g. a
/// 10 000 × 10 000 scan. Larger images are refused before they are decoded.
pub const DEFAULT_MAX_PIXELS: u64 = 100_000_000;

/// File name of the image processor configuration inside a checkpoint directory.
pub const PROCESSOR_CONFIG_FILE: &str = "processor_config.json";
/// File name of the image processor's own configuration (the v1 models' image settings).
pub const PREPROCESSOR_CONFIG_FILE: &str = "preprocessor_config.json";

/// Errors from loading images or the preprocessing configuration.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file at fault.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `processor_config.json` is not valid JSON.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file at fault.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A field of `processor_config.json` is present but malformed or unsupported.
    #[error("{path}: field `{field}`: {problem}")]
    Field {
        /// The file at fault.
        path: PathBuf,
        /// The dotted name of the field at fault.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The data is not in an image format this build can decode.
    #[error("{what}: unrecognised image format (supported: PNG, JPEG, WebP, TIFF)")]
    UnknownFormat {
        /// The image at fault (a path or a caller-supplied description).
        what: String,
    },
    /// The image header or data could not be decoded (corrupt or truncated file).
    #[error("{what}: cannot decode image: {source}")]
    Decode {
        /// The image at fault (a path or a caller-supplied description).
        what: String,
        /// The underlying error.
        #[source]
        source: image::ImageError,
    },
    /// The image header declares a zero width or height.
    #[error("{what}: image has zero size ({width}x{height})")]
    Empty {
        /// The image at fault.
        what: String,
        /// Declared width in pixels.
        width: u32,
        /// Declared height in pixels.
        height: u32,
    },
    /// The image header declares more pixels than the caller's budget.
    #[error(
        "{what}: image is {width}x{height} = {pixels} pixels, more than the limit of \
         {max_pixels} (max_pixels); refusing to decode it"
    )]
    TooLarge {
        /// The image at fault.
        what: String,
        /// Declared width in pixels.
        width: u32,
        /// Declared height in pixels.
        height: u32,
        /// `width · height`.
        pixels: u64,
        /// The budget that was exceeded.
        max_pixels: u64,
    },
}

/// Parameters of the LightOnOCR / Pixtral image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessConfig {
    /// Longest allowed side in pixels before alignment (`size.longest_edge`, 1540).
    pub longest_edge: u32,
    /// Vision patch size in pixels (14).
    pub patch_size: u32,
    /// Spatial merge factor of the projector (2); sides are aligned to `patch_size · merge_size`.
    pub merge_size: u32,
    /// Per-channel mean subtracted after rescaling (CLIP values).
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation divided by after subtracting the mean (CLIP values).
    pub image_std: [f32; 3],
    /// Factor applied to the 0..=255 pixel values (1/255).
    ///
    /// Kept in `f64`: transformers multiplies in float64 and only then rounds to float32;
    /// rounding the factor itself to `f32` first changes 126 of the 256 rescaled values by one
    /// ulp.
    pub rescale_factor: f64,
}

/// CLIP normalisation mean, written as in `processor_config.json` and rounded to `f32` like
/// numpy's `np.array(mean, dtype=np.float32)`.
#[allow(clippy::excessive_precision)]
pub const CLIP_MEAN: [f32; 3] = [0.48145466, 0.4578275, 0.40821073];
/// CLIP normalisation standard deviation (see [`CLIP_MEAN`]).
#[allow(clippy::excessive_precision)]
pub const CLIP_STD: [f32; 3] = [0.26862954, 0.26130258, 0.27577711];

impl Default for PreprocessConfig {
    fn default() -> Self {
        Self {
            longest_edge: ocrctl_exporters::contract::image::LONGEST_EDGE,
            patch_size: 14,
            merge_size: 2,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            rescale_factor: 1.0 / 255.0,
        }
    }
}

impl PreprocessConfig {
    /// Side alignment in pixels: `patch_size · merge_size` (28), at least 1.
    ///
    /// This is deliberately not the processor's bare `patch_size` (14): every runtime that
    /// serves LightOnOCR (vLLM, SGLang, llama.cpp, the ONNX exports) aligns to 28 so that the
    /// 2×2 merge covers the whole grid.
    pub fn alignment(&self) -> u32 {
        self.patch_size.saturating_mul(self.merge_size).max(1)
    }

    /// [`PreprocessConfig::from_model_dir`] with the patch and merge sizes of the exported
    /// model's normalised config.
    pub fn for_model(
        dir: &Path,
        cfg: &ocrctl_exporters::config::ModelConfig,
    ) -> Result<Self, PreprocessError> {
        Self::from_model_dir(
            dir,
            cfg.vision.patch_size as u32,
            cfg.spatial_merge_size as u32,
        )
    }

    /// Reads the image settings of a checkpoint directory: `processor_config.json`, or
    /// `preprocessor_config.json` when the former holds only processor keys (the v1 layout).
    ///
    /// `patch_size` and `merge_size` come from the model configuration (the processor file
    /// stores only the bare patch size). Recognised keys, at the top level or nested under
    /// `image_processor`: `size.longest_edge`, `image_mean`, `image_std`, `rescale_factor`;
    /// `resample`, `do_resize`, `do_rescale` and `do_normalize` are checked to be the supported
    /// values (bicubic, true). A missing file gives [`PreprocessConfig::default`] with the given
    /// patch and merge sizes; a missing key keeps its default; a present but malformed key is an
    /// error naming the file and the field.
    pub fn from_model_dir(
        dir: &Path,
        patch_size: u32,
        merge_size: u32,
    ) -> Result<Self, PreprocessError> {
        let mut cfg = Self {
            patch_size,
            merge_size,
            ..Self::default()
        };
        let path = settings_file(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(cfg),
            Err(source) => return Err(PreprocessError::Io { path, source }),
        };
        let root: Value = serde_json::from_str(&text).map_err(|source| PreprocessError::Json {
            path: path.clone(),
            source,
        })?;
        let s = Settings::of(&root, &path)?;
        if let Some(edge) = s.longest_edge()? {
            cfg.longest_edge = edge;
        }
        if let Some(v) = s.get("image_mean") {
            cfg.image_mean =
                parse_triplet(v).ok_or_else(|| s.err("image_mean", triplet_problem(v)))?;
        }
        if let Some(std) = s.image_std()? {
            cfg.image_std = std;
        }
        if let Some(v) = s.get("rescale_factor") {
            cfg.rescale_factor = v
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| {
                    s.err(
                        "rescale_factor",
                        format!("expected a positive number, got {v}"),
                    )
                })?;
        }
        s.check_supported()?;
        Ok(cfg)
    }
}

/// The image settings of a processor file: its root, or the object nested under
/// `image_processor` (transformers >= 5), with the file to name in errors.
struct Settings<'a> {
    obj: &'a Value,
    /// `image_processor.` when nested, else empty: the start of a field's dotted name.
    prefix: &'static str,
    path: &'a Path,
}

impl<'a> Settings<'a> {
    /// The settings of the file `path` whose JSON is `root`.
    fn of(root: &'a Value, path: &'a Path) -> Result<Settings<'a>, PreprocessError> {
        let top = Settings {
            obj: root,
            prefix: "",
            path,
        };
        if !root.is_object() {
            return Err(top.err("(root)", "expected a JSON object".into()));
        }
        match root.get("image_processor") {
            Some(v @ Value::Object(_)) => Ok(Settings {
                obj: v,
                prefix: "image_processor.",
                path,
            }),
            Some(Value::Null) | None => Ok(top),
            Some(_) => Err(top.err("image_processor", "expected an object".into())),
        }
    }

    /// The error for field `key` (a name below the prefix).
    fn err(&self, key: &str, problem: String) -> PreprocessError {
        PreprocessError::Field {
            path: self.path.to_path_buf(),
            field: format!("{}{key}", self.prefix),
            problem,
        }
    }

    /// Field `key`, unless absent or null.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// `size.longest_edge`, when `size` is given (it must hold only that key's kind of size).
    fn longest_edge(&self) -> Result<Option<u32>, PreprocessError> {
        let Some(size) = self.get("size") else {
            return Ok(None);
        };
        let Value::Object(size) = size else {
            return Err(self.err("size", "expected an object".into()));
        };
        match size.get("longest_edge") {
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0 && n <= u64::from(u32::MAX))
                .map(|n| Some(n as u32))
                .ok_or_else(|| {
                    self.err(
                        "size.longest_edge",
                        format!("expected a positive integer, got {v}"),
                    )
                }),
            None => Err(self.err(
                "size.longest_edge",
                "missing; only `size.longest_edge` is supported".into(),
            )),
        }
    }

    /// `image_std`: three finite, non-zero values.
    fn image_std(&self) -> Result<Option<[f32; 3]>, PreprocessError> {
        let Some(v) = self.get("image_std") else {
            return Ok(None);
        };
        let std = parse_triplet(v).ok_or_else(|| self.err("image_std", triplet_problem(v)))?;
        if std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(self.err(
                "image_std",
                format!("every value must be finite and non-zero, got {v}"),
            ));
        }
        Ok(Some(std))
    }

    /// `resample` is bicubic and `do_resize`, `do_rescale`, `do_normalize` are true, where
    /// given.
    fn check_supported(&self) -> Result<(), PreprocessError> {
        if let Some(v) = self.get("resample") {
            // PIL.Image.Resampling.BICUBIC == 3.
            if v.as_u64() != Some(3) {
                return Err(self.err(
                    "resample",
                    format!("only 3 (bicubic) is supported, got {v}"),
                ));
            }
        }
        for key in ["do_resize", "do_rescale", "do_normalize"] {
            if let Some(v) = self.get(key) {
                match v.as_bool() {
                    Some(true) => {}
                    Some(false) => {
                        return Err(self.err(
                            key,
                            "false is not supported (LightOnOCR always resizes, rescales and \
                             normalises)"
                                .into(),
                        ))
                    }
                    None => return Err(self.err(key, format!("expected a boolean, got {v}"))),
                }
            }
        }
        Ok(())
    }
}

/// Keys of the image settings, at the top level of a flat processor file.
const IMAGE_SETTING_KEYS: [&str; 6] = [
    "image_processor_type",
    "size",
    "image_mean",
    "image_std",
    "rescale_factor",
    "resample",
];

/// The file that holds the image settings: `processor_config.json`, unless it holds none and
/// `preprocessor_config.json` is there (the v1 models keep the processor keys alone in the
/// former and the image settings in the latter).
fn settings_file(dir: &Path) -> std::path::PathBuf {
    let proc = dir.join(PROCESSOR_CONFIG_FILE);
    let pre = dir.join(PREPROCESSOR_CONFIG_FILE);
    if !pre.is_file() {
        return proc;
    }
    let has_settings = match std::fs::read_to_string(&proc) {
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        // Unparseable: reported on the processor file itself.
        Ok(text) => serde_json::from_str::<Value>(&text).map_or(true, |v| {
            v.get("image_processor").is_some()
                || IMAGE_SETTING_KEYS.iter().any(|k| v.get(k).is_some())
        }),
    };
    if has_settings {
        proc
    } else {
        pre
    }
}

/// Parses `[a, b, c]` (or a single number, which transformers broadcasts to every channel).
pub(crate) fn parse_triplet(v: &Value) -> Option<[f32; 3]> {
    match v {
        Value::Number(n) => {
            let x = n.as_f64()? as f32;
            x.is_finite().then_some([x; 3])
        }
        Value::Array(items) if items.len() == 3 => {
            let mut out = [0.0f32; 3];
            for (slot, item) in out.iter_mut().zip(items) {
                // numpy builds the array with dtype=float32 from the Python floats.
                let x = item.as_f64()? as f32;
                if !x.is_finite() {
                    return None;
                }
                *slot = x;
            }
            Some(out)
        }
        _ => None,
    }
}

pub(crate) fn triplet_problem(v: &Value) -> String {
    format!("expected an array of 3 finite numbers (one per RGB channel), got {v}")
}

/// Output `(height, width)` for an input of `height × width` pixels.
///
/// Mirrors Pixtral's `get_resize_output_image_size`: `ratio = max(h / L, w / L)` in `f64`; when
/// `ratio > 1` each side becomes `floor(side / ratio)` (never upscaled for size), at least 1;
/// then each side is rounded up to a multiple of [`PreprocessConfig::alignment`].
pub fn target_size(height: u32, width: u32, cfg: &PreprocessConfig) -> (u32, u32) {
    let longest = f64::from(cfg.longest_edge.max(1));
    let (mut h, mut w) = (height, width);
    let ratio = (f64::from(h) / longest).max(f64::from(w) / longest);
    if ratio > 1.0 {
        // `as u32` truncates like Python's int(math.floor(x)) for non-negative x.
        h = (f64::from(h) / ratio).floor() as u32;
        w = (f64::from(w) / ratio).floor() as u32;
    }
    let align = u64::from(cfg.alignment());
    let up = |side: u32| -> u32 {
        let side = u64::from(side.max(1));
        let aligned = side.div_ceil(align) * align;
        // Only reachable with absurd configurations; keep the largest aligned u32.
        u32::try_from(aligned).unwrap_or((u64::from(u32::MAX) / align * align) as u32)
    };
    (up(h), up(w))
}

/// The vision encoder's input for one image.
#[derive(Debug, Clone)]
pub struct Preprocessed {
    /// Normalised pixels, `[1, 3, height, width]`, channel order RGB, held as the resized
    /// 8-bit image and the normalisation tables ([`Pixels`]).
    pub pixel_values: Pixels,
    /// Height after resizing and alignment (a multiple of 28).
    pub height: u32,
    /// Width after resizing and alignment (a multiple of 28).
    pub width: u32,
    /// Number of image tokens the projector produces: `(height / 28) · (width / 28)`.
    pub num_image_tokens: usize,
}

/// Resizes ([`target_size`], [`resize_bicubic`]; skipped when the size already fits), and
/// keeps the 8-bit result with the rescale-and-normalise tables as the vision encoder's
/// `pixel_values` ([`Pixels`] writes them as float32 where they are used).
pub fn preprocess(img: &RgbImage, cfg: &PreprocessConfig) -> Preprocessed {
    let (height, width) = target_size(img.height(), img.width(), cfg);
    let resized = if img.dimensions() == (width, height) {
        img.as_raw().clone()
    } else {
        resize_bicubic(img, width, height).into_raw()
    };
    let (h, w) = (height as usize, width as usize);
    let align = cfg.alignment();
    Preprocessed {
        pixel_values: Pixels::from_rgb(resized, h, w, normalisation_table(cfg)),
        height,
        width,
        num_image_tokens: (height / align) as usize * (width / align) as usize,
    }
}

/// The 256 possible normalised values of each channel.
pub(crate) fn normalisation_table(cfg: &PreprocessConfig) -> [[f32; 256]; 3] {
    let mut lut = [[0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        for (v, slot) in table.iter_mut().enumerate() {
            let rescaled = (v as f64 * cfg.rescale_factor) as f32;
            *slot = (rescaled - cfg.image_mean[c]) / cfg.image_std[c];
        }
    }
    lut
}

mod decode;
mod pixels;
mod resize;
pub use decode::*;
pub use pixels::Pixels;
pub use resize::*;

#[cfg(test)]
mod tests;

//! Activation statistics for AWQ-style INT4 export (`ocrctl export --calibrate DIR`).
//!
//! A calibration export (fp32 graphs that expose every Linear's input as a `calib.*`
//! output) runs the vision encoder and the decoder prefill on each calibration image; the
//! per-channel mean |x| and mean x² of every Linear input are accumulated here and handed to
//! the exporter ([`ocrctl_exporters::awq`]). Decode steps are not run: the prefill already
//! covers the image tokens and the prompt, which dominate a page's activations.
//!
//! The same run measures the largest |key| or |value| the decoder's cache would store
//! (`calib.kv_cache.*` outputs): the scale of an 8-bit KV cache (`--kv-cache fp8|int8`). For
//! that range the pages are also decoded greedily for up to [`KV_DECODE_TOKENS`] tokens (to
//! their end of sequence), so that the keys and values of generated text count as well as
//! the prompt's; those steps add nothing to the AWQ statistics.

use crate::generation::generate::{argmax_and_top_k, prefill};
use crate::model::export::Export;
use crate::model::preprocess;
use crate::runtime::backend::Backend;
use crate::runtime::ortmodel::OrtModel;
use ocrctl_exporters::awq::{ActivationStats, ChannelStats};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Greedy tokens decoded after each calibration page's prompt when the KV range is measured
/// ([`collect`]'s `kv_decode`): about a paragraph of text, against ~2 000 prompt positions of
/// an A4 page. Each step costs one decoder run on the CPU (fp32).
pub const KV_DECODE_TOKENS: usize = 64;

/// File extensions accepted as calibration images.
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "webp", "tif", "tiff"];

/// Sums per channel: Σ|x|, Σx², rows.
#[derive(Default)]
struct Sums {
    abs: Vec<f64>,
    sq: Vec<f64>,
    rows: u64,
}

/// Images (by extension) directly inside `dir`, sorted.
pub fn image_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("--calibrate {}: {e}", dir.display()))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        })
        .collect();
    v.sort();
    Ok(v)
}

/// What a calibration run measured.
pub struct Calibration {
    /// Per-channel statistics of every Linear's input (AWQ).
    pub stats: ActivationStats,
    /// The largest |key| or |value| of each decoder layer's cache entries, by layer (empty
    /// when the graphs have no key/value outputs).
    pub kv_absmax: Vec<f32>,
    /// Images that could be read.
    pub images: usize,
    /// Generated tokens whose keys and values were measured (decode steps seen by the tap).
    pub kv_decoded_tokens: usize,
}

/// Runs `model` (loaded from the calibration export `export`) over `images`; with
/// `kv_decode`, each page is also decoded greedily for up to [`KV_DECODE_TOKENS`] tokens for
/// the KV range. Unreadable images are reported and skipped.
pub fn collect(
    model: &mut OrtModel,
    export: Arc<Export>,
    images: &[PathBuf],
    kv_decode: bool,
) -> anyhow::Result<Calibration> {
    let sums: Arc<Mutex<BTreeMap<String, Sums>>> = Arc::default();
    let kv_max: Arc<Mutex<BTreeMap<usize, f32>>> = Arc::default();
    let sink = sums.clone();
    let kv_sink = kv_max.clone();
    // Set while decode steps run: only the KV range is taken from them.
    let decoding = Arc::new(AtomicBool::new(false));
    let in_decode = decoding.clone();
    let decoded = Arc::new(AtomicUsize::new(0));
    let decoded_sink = decoded.clone();
    model.set_tap(Some(Box::new(move |name, shape, data| {
        if let Some(rest) = name.strip_prefix(ocrctl_exporters::kv_cache::CALIB_KV) {
            // `{layer}.key` / `{layer}.value`
            let layer = rest.split('.').next().and_then(|l| l.parse().ok());
            if layer == Some(0) && rest.ends_with("key") && in_decode.load(Ordering::Relaxed) {
                decoded_sink.fetch_add(1, Ordering::Relaxed);
            }
            let m = data.iter().fold(0f32, |m, x| m.max(x.abs()));
            let mut all = kv_sink.lock().expect("calibration KV range");
            let e = all.entry(layer.unwrap_or(usize::MAX)).or_insert(0.0);
            *e = e.max(m);
            return;
        }
        if in_decode.load(Ordering::Relaxed) {
            return;
        }
        let k = *shape.last().unwrap_or(&1);
        let mut all = sink.lock().expect("calibration sums");
        let s = all.entry(name.to_string()).or_default();
        if s.abs.is_empty() {
            s.abs = vec![0.0; k];
            s.sq = vec![0.0; k];
        }
        for row in data.chunks_exact(k) {
            for (c, x) in row.iter().enumerate() {
                s.abs[c] += x.abs() as f64;
                s.sq[c] += (*x as f64) * (*x as f64);
            }
        }
        s.rows += (data.len() / k) as u64;
    })));
    let cfg = export.config().clone();
    let pipeline = crate::generation::pipeline::PagePipeline::new(export)?;
    let mut used = 0;
    for path in images {
        let img = match preprocess::load_image(path, preprocess::DEFAULT_MAX_PIXELS) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!("calibration image skipped: {e}");
                continue;
            }
        };
        let p = pipeline.prepare(&img)?;
        let feats = model.encode_image(&p.pixel_values)?;
        let (mut logits, mut cache) = prefill(model, &p.prompt_ids, cfg.image_token_id, &[feats])?;
        if kv_decode {
            decoding.store(true, Ordering::Relaxed);
            for _ in 0..KV_DECODE_TOKENS {
                let (id, _) = argmax_and_top_k(&logits, 0);
                if pipeline.stop_ids().contains(&id) {
                    break;
                }
                let e = model.embed(&[id])?;
                (logits, cache) = model.forward(e, Some(cache))?;
            }
            decoding.store(false, Ordering::Relaxed);
        }
        used += 1;
    }
    model.set_tap(None);
    let sums = std::mem::take(&mut *sums.lock().expect("calibration sums"));
    let stats = sums
        .into_iter()
        .map(|(name, s)| {
            let n = s.rows.max(1) as f64;
            let st = ChannelStats {
                mean_abs: s.abs.iter().map(|v| (v / n) as f32).collect(),
                mean_sq: s.sq.iter().map(|v| (v / n) as f32).collect(),
                rows: s.rows,
            };
            (name, st)
        })
        .collect();
    let by_layer = std::mem::take(&mut *kv_max.lock().expect("calibration KV range"));
    // Layers in order (0..n, as the exporter names them); an unnamed one would be a bug.
    let kv_absmax = by_layer
        .iter()
        .enumerate()
        .map(|(i, (l, m))| match *l == i {
            true => Ok(*m),
            false => Err(anyhow::anyhow!("calibration KV outputs skip layer {i}")),
        })
        .collect::<anyhow::Result<Vec<f32>>>()?;
    Ok(Calibration {
        stats,
        kv_absmax,
        images: used,
        kv_decoded_tokens: decoded.load(Ordering::Relaxed),
    })
}

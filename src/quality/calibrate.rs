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

/// What the tap accumulates while the calibration pages run.
#[derive(Default)]
struct Tally {
    /// Per-channel sums of every Linear input, by output name.
    sums: Mutex<BTreeMap<String, Sums>>,
    /// The largest |key| or |value| by layer (`usize::MAX`: a name without a layer).
    kv_max: Mutex<BTreeMap<usize, f32>>,
    /// Set while decode steps run: only the KV range is taken from them.
    decoding: AtomicBool,
    /// Decode steps the tap saw.
    decoded: AtomicUsize,
}

impl Tally {
    /// Takes one `calib.*` output of a run.
    fn record(&self, name: &str, shape: &[usize], data: &[f32]) {
        if let Some(rest) = name.strip_prefix(ocrctl_exporters::kv_cache::CALIB_KV) {
            self.record_kv(rest, data);
        } else if !self.decoding.load(Ordering::Relaxed) {
            self.record_linear(name, shape, data);
        }
    }

    /// A layer's key or value (`rest`: `{layer}.key` / `{layer}.value`): its largest |x|.
    fn record_kv(&self, rest: &str, data: &[f32]) {
        let layer = rest.split('.').next().and_then(|l| l.parse().ok());
        if layer == Some(0) && rest.ends_with("key") && self.decoding.load(Ordering::Relaxed) {
            self.decoded.fetch_add(1, Ordering::Relaxed);
        }
        let m = data.iter().fold(0f32, |m, x| m.max(x.abs()));
        let mut all = self.kv_max.lock().expect("calibration KV range");
        let e = all.entry(layer.unwrap_or(usize::MAX)).or_insert(0.0);
        *e = e.max(m);
    }

    /// A Linear's input: Σ|x| and Σx² per channel (its last axis), and the rows.
    fn record_linear(&self, name: &str, shape: &[usize], data: &[f32]) {
        let k = *shape.last().unwrap_or(&1);
        let mut all = self.sums.lock().expect("calibration sums");
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
    }

    /// The per-channel means of every Linear input.
    fn stats(&self) -> ActivationStats {
        let sums = std::mem::take(&mut *self.sums.lock().expect("calibration sums"));
        sums.into_iter()
            .map(|(name, s)| {
                let n = s.rows.max(1) as f64;
                let st = ChannelStats {
                    mean_abs: s.abs.iter().map(|v| (v / n) as f32).collect(),
                    mean_sq: s.sq.iter().map(|v| (v / n) as f32).collect(),
                    rows: s.rows,
                };
                (name, st)
            })
            .collect()
    }

    /// The KV range of each layer, in order (0..n, as the exporter names them); an unnamed
    /// one would be a bug.
    fn kv_absmax(&self) -> anyhow::Result<Vec<f32>> {
        let by_layer = std::mem::take(&mut *self.kv_max.lock().expect("calibration KV range"));
        by_layer
            .iter()
            .enumerate()
            .map(|(i, (l, m))| match *l == i {
                true => Ok(*m),
                false => Err(anyhow::anyhow!("calibration KV outputs skip layer {i}")),
            })
            .collect()
    }
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
    let tally = Arc::new(Tally::default());
    let tap = tally.clone();
    model.set_tap(Some(Box::new(move |name, shape, data| {
        tap.record(name, shape, data)
    })));
    let used = run_pages(model, export, images, kv_decode, &tally)?;
    model.set_tap(None);
    let stats = tally.stats();
    let kv_absmax = tally.kv_absmax()?;
    Ok(Calibration {
        stats,
        kv_absmax,
        images: used,
        kv_decoded_tokens: tally.decoded.load(Ordering::Relaxed),
    })
}

/// Encodes and prefills each readable image (then decodes it greedily with `kv_decode`),
/// the tap seeing every run; the pages that ran.
fn run_pages(
    model: &mut OrtModel,
    export: Arc<Export>,
    images: &[PathBuf],
    kv_decode: bool,
    tally: &Tally,
) -> anyhow::Result<usize> {
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
            tally.decoding.store(true, Ordering::Relaxed);
            for _ in 0..KV_DECODE_TOKENS {
                let (id, _) = argmax_and_top_k(&logits, 0);
                if pipeline.stop_ids().contains(&id) {
                    break;
                }
                let e = model.embed(&[id])?;
                (logits, cache) = model.forward(e, Some(cache))?;
            }
            tally.decoding.store(false, Ordering::Relaxed);
        }
        used += 1;
    }
    Ok(used)
}

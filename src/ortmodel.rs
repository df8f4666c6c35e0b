//! [`OrtModel`]: an exported model directory run with ONNX Runtime (CPU for now).
//!
//! Loads `onnx/{vision_encoder,embed_tokens,decoder_model_merged}{suffix}.onnx` named by
//! the export's `ocrctl.json`, and implements [`Backend`]. fp16 graphs take and return
//! float16 tensors; conversion happens here so generation always sees float32.

use crate::backend::{Backend, BackendError};
use crate::providers::{Provider, ProviderConfig};
use half::f16;
use ndarray::{Array2, Array4};
use ocrctl_exporters::export::{Manifest, Precision};
use ocrctl_exporters::graph::DType;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Tensor};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// Options for loading a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub precision: Precision,
    /// Intra-op threads (0 = ONNX Runtime's default).
    pub threads: usize,
    /// Explicit ONNX Runtime library path.
    pub ort_lib: Option<PathBuf>,
    /// `session.qdq_matmulnbits_accuracy_level` for INT4 QDQ graphs on the CPU (0: float
    /// compute, 4: int8 activations, ONNX Runtime's default).
    pub accuracy_level: u8,
    /// Execution providers to use, in order (default: CPU only).
    pub providers: ProviderConfig,
}

impl LoadOptions {
    /// CPU defaults for `precision`.
    pub fn new(precision: Precision) -> LoadOptions {
        LoadOptions {
            precision,
            threads: 0,
            ort_lib: None,
            accuracy_level: 4,
            providers: ProviderConfig::default(),
        }
    }
}

/// Errors loading an export.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Manifest(#[from] ocrctl_exporters::ExportError),
    #[error(transparent)]
    OrtLib(#[from] crate::ortlib::OrtLibError),
    #[error("{dir}: precision {precision} was not exported (available: {available})")]
    NoPrecision {
        dir: PathBuf,
        precision: String,
        available: String,
    },
    #[error("{path}: {message}")]
    Session { path: PathBuf, message: String },
}

/// The three sessions of an export plus what generation needs to know about them.
pub struct OrtModel {
    pub manifest: Manifest,
    pub dir: PathBuf,
    act: DType,
    vision: Session,
    embed: Session,
    decoder: Session,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    hidden: usize,
    tap: Option<Tap>,
    batch: Option<BatchKv>,
}

/// Loads `model` on the CPU with `opts` and writes the graph ONNX Runtime actually runs
/// (after its optimisations and fusions) to `optimized`. Used to inspect fusions such as
/// DequantizeLinear + MatMul → MatMulNBits.
pub fn write_optimized_graph(
    model: &Path,
    optimized: &Path,
    opts: &LoadOptions,
) -> Result<(), LoadError> {
    let (_, env) = crate::ortlib::environment(opts.ort_lib.as_deref())?;
    session_with(&env, model, opts, Some(optimized)).map(|_| ())
}

fn session(
    env: &ort::environment::Environment,
    path: &Path,
    opts: &LoadOptions,
) -> Result<Session, LoadError> {
    session_with(env, path, opts, None)
}

fn session_with(
    env: &ort::environment::Environment,
    path: &Path,
    opts: &LoadOptions,
    optimized: Option<&Path>,
) -> Result<Session, LoadError> {
    let part = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string();
    let err = |message: String| LoadError::Session {
        path: path.to_path_buf(),
        message,
    };
    // Availability notes were printed once by `OrtModel::load`.
    let (mut order, _) =
        crate::providers::usable(&opts.providers).map_err(|e| err(e.to_string()))?;
    loop {
        let eps: Vec<_> = order
            .iter()
            .filter_map(|p| crate::providers::dispatch(*p, &opts.providers, &part))
            .collect();
        let build = || -> ort::Result<Session> {
            let mut b = Session::builder(env)?
                .with_optimization_level(GraphOptimizationLevel::All)?
                .with_log_level(if eps.is_empty() {
                    ort::logging::LogLevel::Error
                } else {
                    ort::logging::LogLevel::Warning
                })?
                .with_config_entry(
                    "session.qdq_matmulnbits_accuracy_level",
                    opts.accuracy_level.to_string(),
                )?;
            if opts.threads > 0 {
                b = b.with_intra_threads(opts.threads)?;
            }
            if let Some(p) = optimized {
                b = b.with_optimized_model_path(p)?;
            }
            if !eps.is_empty() {
                b = b.with_execution_providers(&eps)?;
            }
            Ok(b.commit_from_file(path)?)
        };
        match build() {
            Ok(s) => return Ok(s),
            // A GPU provider that is compiled in but cannot start (no driver, no TensorRT
            // libraries): drop it and try the next one, unless strict.
            Err(e) if !opts.providers.strict && order.len() > 1 && order[0] != Provider::Cpu => {
                let failed = order.remove(0);
                eprintln!(
                    "ocrctl: {} execution provider failed for {part} ({e}); falling back to {}",
                    failed.name(),
                    order[0].name()
                );
            }
            Err(e) => return Err(err(e.to_string())),
        }
    }
}

fn to_dyn_f(
    act: DType,
    shape: Vec<i64>,
    data: Vec<f32>,
    part: &str,
) -> Result<DynValue, BackendError> {
    let r = match act {
        DType::F16 => Tensor::from_array((
            shape,
            data.into_iter().map(f16::from_f32).collect::<Vec<_>>(),
        ))
        .map(|t| t.into_dyn()),
        _ => Tensor::from_array((shape, data)).map(|t| t.into_dyn()),
    };
    r.map_err(|e| BackendError::runtime(part, e))
}

fn i64_tensor(shape: Vec<i64>, data: Vec<i64>, part: &str) -> Result<DynValue, BackendError> {
    Tensor::from_array((shape, data))
        .map(|t| t.into_dyn())
        .map_err(|e| BackendError::runtime(part, e))
}

/// Reads a float tensor (f32 or f16) as f32 with its shape.
fn read_f(v: &DynValue, part: &str) -> Result<(Vec<usize>, Vec<f32>), BackendError> {
    if let Ok((shape, data)) = v.try_extract_tensor::<f32>() {
        return Ok((shape.iter().map(|d| *d as usize).collect(), data.to_vec()));
    }
    let (shape, data) = v
        .try_extract_tensor::<f16>()
        .map_err(|e| BackendError::runtime(part, e))?;
    Ok((
        shape.iter().map(|d| *d as usize).collect(),
        data.iter().map(|x| x.to_f32()).collect(),
    ))
}

impl OrtModel {
    /// Loads the export in `dir` with the given precision.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<OrtModel, LoadError> {
        let manifest = Manifest::load(dir)?;
        let graphs =
            manifest
                .graphs
                .get(&opts.precision)
                .ok_or_else(|| LoadError::NoPrecision {
                    dir: dir.to_path_buf(),
                    precision: opts.precision.name().into(),
                    available: manifest
                        .precisions
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
        let (_, env) = crate::ortlib::environment(opts.ort_lib.as_deref())?;
        match crate::providers::usable(&opts.providers) {
            Ok((_, notes)) => notes.iter().for_each(|n| eprintln!("ocrctl: {n}")),
            Err(e) => {
                return Err(LoadError::Session {
                    path: dir.to_path_buf(),
                    message: e.to_string(),
                })
            }
        }
        let path_of = |part: &str| -> Result<PathBuf, LoadError> {
            let g = graphs.get(part).ok_or_else(|| LoadError::Session {
                path: dir.join(crate::ortmodel::MANIFEST_NAME),
                message: format!("manifest lists no `{part}` graph"),
            })?;
            Ok(dir.join("onnx").join(&g.file))
        };
        let t = &manifest.model.text;
        Ok(OrtModel {
            act: opts.precision.dtype(),
            vision: session(&env, &path_of("vision_encoder")?, opts)?,
            embed: session(&env, &path_of("embed_tokens")?, opts)?,
            decoder: session(&env, &path_of("decoder_model_merged")?, opts)?,
            layers: t.num_layers,
            kv_heads: t.num_kv_heads,
            head_dim: t.head_dim,
            hidden: t.hidden_size,
            tap: None,
            batch: None,
            dir: dir.to_path_buf(),
            manifest,
        })
    }
}

/// Receives calibration outputs: weight name, shape and values.
pub type Tap = Box<dyn FnMut(&str, &[usize], &[f32]) + Send>;

impl OrtModel {
    /// Sends every `calib.*` output of later runs (calibration exports only) to `tap`.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.tap = tap;
    }
}

fn tap_outputs(
    tap: &mut Option<Tap>,
    out: &ort::session::SessionOutputs<'_>,
    part: &str,
) -> Result<(), BackendError> {
    {
        if let Some(tap) = tap.as_mut() {
            for (name, v) in out.iter() {
                if let Some(weight) = name.strip_prefix(ocrctl_exporters::layers::CALIB_PREFIX) {
                    let (shape, data) = read_f(&v, part)?;
                    tap(weight, &shape, &data);
                }
            }
        }
        Ok(())
    }
}

/// Name of the manifest inside an export (re-exported for error messages).
pub const MANIFEST_NAME: &str = ocrctl_exporters::export::MANIFEST;

/// The KV cache of one sequence: `present.*` values from the last step, and its length.
pub struct OrtCache {
    /// Unique per sequence step chain, to recognise the rows of the shared batch cache.
    id: u64,
    /// This sequence's own `present.*` values, or `None` when its rows live in the
    /// model's padded batch cache (kept between batch steps while the batch is unchanged).
    kv: Option<Vec<DynValue>>,
    len: usize,
}

/// The padded KV cache of the last batch step: `[B, kv_heads, p, head_dim]` per layer and
/// kind, row `i` holding sequence `ids[i]` left-padded by `p - lens[i]`.
struct BatchKv {
    ids: Vec<u64>,
    lens: Vec<usize>,
    p: usize,
    kv: Vec<DynValue>,
}

static NEXT_CACHE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_cache_id() -> u64 {
    NEXT_CACHE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Backend for OrtModel {
    type Cache = OrtCache;

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn encode_image(&mut self, pixel_values: &Array4<f32>) -> Result<Array2<f32>, BackendError> {
        const PART: &str = "vision_encoder";
        let shape: Vec<i64> = pixel_values.shape().iter().map(|d| *d as i64).collect();
        let data: Vec<f32> = pixel_values.iter().copied().collect();
        let input = to_dyn_f(self.act, shape, data, PART)?;
        let mut out = self
            .vision
            .run(vec![(
                Cow::from("pixel_values"),
                SessionInputValue::from(input),
            )])
            .map_err(|e| BackendError::runtime(PART, e))?;
        tap_outputs(&mut self.tap, &out, PART)?;
        let v = out
            .remove("image_features")
            .ok_or_else(|| BackendError::runtime(PART, "no image_features output"))?;
        let (shape, data) = read_f(&v, PART)?;
        Array2::from_shape_vec((shape[0], shape[1]), data)
            .map_err(|e| BackendError::runtime(PART, e))
    }

    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
        const PART: &str = "embed_tokens";
        let input = i64_tensor(
            vec![1, ids.len() as i64],
            ids.iter().map(|i| *i as i64).collect(),
            PART,
        )?;
        let mut out = self
            .embed
            .run(vec![(
                Cow::from("input_ids"),
                SessionInputValue::from(input),
            )])
            .map_err(|e| BackendError::runtime(PART, e))?;
        let v = out
            .remove("inputs_embeds")
            .ok_or_else(|| BackendError::runtime(PART, "no inputs_embeds output"))?;
        let (shape, data) = read_f(&v, PART)?;
        Array2::from_shape_vec((shape[1], shape[2]), data)
            .map_err(|e| BackendError::runtime(PART, e))
    }

    fn forward(
        &mut self,
        embeds: Array2<f32>,
        cache: Option<OrtCache>,
    ) -> Result<(Vec<f32>, OrtCache), BackendError> {
        const PART: &str = "decoder_model_merged";
        let s = embeds.nrows();
        let d = embeds.ncols();
        let past = cache.as_ref().map_or(0, |c| c.len);
        let mut inputs: Vec<(Cow<str>, SessionInputValue)> =
            Vec::with_capacity(4 + 2 * self.layers);
        let data: Vec<f32> = embeds.into_iter().collect();
        inputs.push((
            "inputs_embeds".into(),
            to_dyn_f(self.act, vec![1, s as i64, d as i64], data, PART)?.into(),
        ));
        inputs.push((
            "attention_mask".into(),
            i64_tensor(vec![1, (past + s) as i64], vec![1; past + s], PART)?.into(),
        ));
        let pos: Vec<i64> = (past as i64..(past + s) as i64).collect();
        inputs.push((
            "position_ids".into(),
            i64_tensor(vec![1, s as i64], pos, PART)?.into(),
        ));
        inputs.push((
            "num_logits_to_keep".into(),
            i64_tensor(vec![], vec![1], PART)?.into(),
        ));
        match cache {
            Some(c) => {
                let kv = self.own_kv(c)?;
                for (i, v) in kv.into_iter().enumerate() {
                    let kind = if i % 2 == 0 { "key" } else { "value" };
                    inputs.push((format!("past_key_values.{}.{kind}", i / 2).into(), v.into()));
                }
            }
            None => {
                let shape = vec![1, self.kv_heads as i64, 0, self.head_dim as i64];
                for i in 0..self.layers {
                    for kind in ["key", "value"] {
                        let v = to_dyn_f(self.act, shape.clone(), Vec::new(), PART)?;
                        inputs.push((format!("past_key_values.{i}.{kind}").into(), v.into()));
                    }
                }
            }
        }
        let (mut logits, kv) = self.run_decoder(inputs)?;
        let last = logits.pop().expect("one row of logits");
        Ok((
            last,
            OrtCache {
                id: next_cache_id(),
                kv: Some(kv),
                len: past + s,
            },
        ))
    }

    fn decode_batch(
        &mut self,
        tokens: &[u32],
        caches: Vec<OrtCache>,
    ) -> Result<(Vec<Vec<f32>>, Vec<OrtCache>), BackendError> {
        if tokens.len() == 1 {
            // A batch of one needs no padding: feed its cache back as is.
            let c = caches.into_iter().next().expect("one cache");
            let e = self.embed(tokens)?;
            let (l, c) = self.forward(e, Some(c))?;
            return Ok((vec![l], vec![c]));
        }
        match self.act {
            DType::F16 => self.decode_batch_t::<f16>(tokens, caches),
            _ => self.decode_batch_t::<f32>(tokens, caches),
        }
    }
}

impl OrtModel {
    /// Runs the decoder: each row's last-position logits and the `present.*` values in
    /// layer order (key, value, key, …).
    fn run_decoder(
        &mut self,
        inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)>,
    ) -> Result<(Vec<Vec<f32>>, Vec<DynValue>), BackendError> {
        const PART: &str = "decoder_model_merged";
        let mut out = self
            .decoder
            .run(inputs)
            .map_err(|e| BackendError::runtime(PART, e))?;
        tap_outputs(&mut self.tap, &out, PART)?;
        let logits = out
            .remove("logits")
            .ok_or_else(|| BackendError::runtime(PART, "no logits output"))?;
        let (shape, data) = read_f(&logits, PART)?;
        let (rows, vocab) = (shape[0].max(1), shape[2]);
        let per_row = data.len() / rows;
        let logits = data
            .chunks_exact(per_row)
            .map(|r| r[r.len() - vocab..].to_vec())
            .collect();
        let mut kv = Vec::with_capacity(2 * self.layers);
        for j in 0..2 * self.layers {
            let kind = if j % 2 == 0 { "key" } else { "value" };
            let name = format!("present.{}.{kind}", j / 2);
            kv.push(
                out.remove(&name)
                    .ok_or_else(|| BackendError::runtime(PART, format!("no {name} output")))?,
            );
        }
        Ok((logits, kv))
    }

    /// Embeddings of one token per sequence: `[B, 1, hidden]` as a value of the graph dtype.
    fn embed_column(&mut self, tokens: &[u32]) -> Result<DynValue, BackendError> {
        const PART: &str = "embed_tokens";
        let ids = i64_tensor(
            vec![tokens.len() as i64, 1],
            tokens.iter().map(|t| *t as i64).collect(),
            PART,
        )?;
        let mut out = self
            .embed
            .run(vec![(Cow::from("input_ids"), SessionInputValue::from(ids))])
            .map_err(|e| BackendError::runtime(PART, e))?;
        out.remove("inputs_embeds")
            .ok_or_else(|| BackendError::runtime(PART, "no inputs_embeds output"))
    }

    /// This sequence's own per-layer values, cut out of the batch cache if they live there.
    fn own_kv(&mut self, c: OrtCache) -> Result<Vec<DynValue>, BackendError> {
        match c.kv {
            Some(kv) => Ok(kv),
            None => match self.act {
                DType::F16 => self.row_of_batch::<f16>(c.id, c.len),
                _ => self.row_of_batch::<f32>(c.id, c.len),
            },
        }
    }

    /// Copies sequence `id`'s rows (without the left padding) out of the batch cache.
    fn row_of_batch<T>(&self, id: u64, len: usize) -> Result<Vec<DynValue>, BackendError>
    where
        T: ort::value::PrimitiveTensorElementType + Copy + Default + std::fmt::Debug + 'static,
    {
        const PART: &str = "decoder_model_merged";
        let batch = self
            .batch
            .as_ref()
            .filter(|b| b.ids.contains(&id))
            .ok_or_else(|| BackendError::Invalid(format!("KV cache of sequence {id} is gone")))?;
        let i = batch
            .ids
            .iter()
            .position(|x| *x == id)
            .expect("checked above");
        let (kvh, hd, p) = (self.kv_heads, self.head_dim, batch.p);
        let off = p - len;
        let mut out = Vec::with_capacity(batch.kv.len());
        for v in &batch.kv {
            let (_, src) = v
                .try_extract_tensor::<T>()
                .map_err(|e| BackendError::runtime(PART, e))?;
            let mut seq = Vec::with_capacity(kvh * len * hd);
            for h in 0..kvh {
                let start = ((i * kvh + h) * p + off) * hd;
                seq.extend_from_slice(&src[start..start + len * hd]);
            }
            let t = Tensor::from_array((vec![1, kvh as i64, len as i64, hd as i64], seq))
                .map_err(|e| BackendError::runtime(PART, e))?;
            out.push(t.into_dyn());
        }
        Ok(out)
    }

    /// A padded batch step: each sequence's cache is left-padded to the longest one (masked
    /// out through `attention_mask`) and positions continue each sequence's own count, so a
    /// sequence's result does not depend on what else is in the batch. The padded presents
    /// are kept as the next step's past while the batch stays the same (same sequences, same
    /// order); caches are repacked only when sequences join or leave.
    fn decode_batch_t<T>(
        &mut self,
        tokens: &[u32],
        caches: Vec<OrtCache>,
    ) -> Result<(Vec<Vec<f32>>, Vec<OrtCache>), BackendError>
    where
        T: ort::value::PrimitiveTensorElementType + Copy + Default + std::fmt::Debug + 'static,
    {
        const PART: &str = "decoder_model_merged";
        let b = tokens.len();
        if b != caches.len() || b == 0 {
            return Err(BackendError::Invalid(format!(
                "decode_batch: {b} tokens for {} caches",
                caches.len()
            )));
        }
        let (kvh, hd) = (self.kv_heads, self.head_dim);
        let ids: Vec<u64> = caches.iter().map(|c| c.id).collect();
        let lens: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let same_batch = self
            .batch
            .as_ref()
            .is_some_and(|bk| bk.ids == ids && bk.lens == lens)
            && caches.iter().all(|c| c.kv.is_none());
        let (p, past): (usize, Vec<DynValue>) = if same_batch {
            let bk = self.batch.take().expect("checked above");
            (bk.p, bk.kv)
        } else {
            let p = *lens.iter().max().expect("non-empty batch");
            let mut per_seq = Vec::with_capacity(b);
            for c in caches {
                per_seq.push(self.own_kv(c)?);
            }
            self.batch = None;
            let mut past = Vec::with_capacity(2 * self.layers);
            for j in 0..2 * self.layers {
                let mut buf = vec![T::default(); b * kvh * p * hd];
                for (i, seq) in per_seq.iter().enumerate() {
                    let (_, src) = seq[j]
                        .try_extract_tensor::<T>()
                        .map_err(|e| BackendError::runtime(PART, e))?;
                    let l = lens[i];
                    for h in 0..kvh {
                        let dst = ((i * kvh + h) * p + (p - l)) * hd;
                        buf[dst..dst + l * hd].copy_from_slice(&src[h * l * hd..(h + 1) * l * hd]);
                    }
                }
                let v = Tensor::from_array((vec![b as i64, kvh as i64, p as i64, hd as i64], buf))
                    .map_err(|e| BackendError::runtime(PART, e))?;
                past.push(v.into_dyn());
            }
            (p, past)
        };
        let embeds = self.embed_column(tokens)?;
        let mut inputs: Vec<(Cow<str>, SessionInputValue)> =
            Vec::with_capacity(4 + 2 * self.layers);
        inputs.push(("inputs_embeds".into(), embeds.into()));
        let mut mask = vec![0i64; b * (p + 1)];
        for (i, l) in lens.iter().enumerate() {
            for j in p - l..=p {
                mask[i * (p + 1) + j] = 1;
            }
        }
        inputs.push((
            "attention_mask".into(),
            i64_tensor(vec![b as i64, (p + 1) as i64], mask, PART)?.into(),
        ));
        let pos: Vec<i64> = lens.iter().map(|l| *l as i64).collect();
        inputs.push((
            "position_ids".into(),
            i64_tensor(vec![b as i64, 1], pos, PART)?.into(),
        ));
        inputs.push((
            "num_logits_to_keep".into(),
            i64_tensor(vec![], vec![1], PART)?.into(),
        ));
        for (j, v) in past.into_iter().enumerate() {
            let kind = if j % 2 == 0 { "key" } else { "value" };
            inputs.push((format!("past_key_values.{}.{kind}", j / 2).into(), v.into()));
        }
        let (logits, kv) = self.run_decoder(inputs)?;
        let new_lens: Vec<usize> = lens.iter().map(|l| l + 1).collect();
        let caches = ids
            .iter()
            .zip(&new_lens)
            .map(|(id, l)| OrtCache {
                id: *id,
                kv: None,
                len: *l,
            })
            .collect();
        self.batch = Some(BatchKv {
            ids,
            lens: new_lens,
            p: p + 1,
            kv,
        });
        Ok((logits, caches))
    }
}

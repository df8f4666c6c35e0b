//! `ocrctl export`: checkpoint → `onnx/*.onnx` + tokenizer files + `ocrctl.json`.
//!
//! Everything is written into `<out>.partial-<pid>` next to `<out>` and renamed at the end,
//! so an interrupted export never leaves a loadable half model. An existing `<out>` is
//! refused unless `force` is set; it is then replaced only once the new export is complete.

use crate::checkpoint::{Checkpoint, Weights};
use crate::config::ModelConfig;
use crate::contract::graph;
use crate::dummy::{self, DummyWeights};
use crate::family::{Generation, Variant};
use crate::graph::{DType, GraphInfo};
use crate::layers::{Emit, Int4Format, Quant, Target};
use crate::{decoder, embed, vision, ExportError};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod staging;
use staging::{check_out, out_parent_and_name, staging_dir, swap_into_place, write_manifest};

pub use crate::manifest::{Manifest, SourceFile};
pub use crate::variants::{DecoderVariant, Precision};

/// Opset of the default ONNX domain of `--target tensorrt` graphs (`--target ort`: see
/// [`crate::layers::Emit::opset`]).
pub const OPSET: i64 = 21;
/// Manifest file name inside an export.
pub const MANIFEST: &str = "ocrctl.json";
/// Files copied from the checkpoint when present (`tokenizer.json` is required).
pub const COPIED_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
];

/// What to export and where.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// A checkpoint directory, or `dummy:<name>` for random weights.
    pub checkpoint: String,
    pub out: PathBuf,
    pub precisions: Vec<Precision>,
    pub target: Target,
    pub force: bool,
    /// INT4 settings used by the `int4` precisions.
    pub int4: Quant,
    /// Activation statistics for AWQ-style scaling of INT4 weights (none: round-to-nearest).
    pub awq: Option<crate::awq::ActivationStats>,
    /// Write calibration graphs (every Linear input exposed as an output) instead of a
    /// deployable export; used internally by `--calibrate`.
    pub calibration_graphs: bool,
    /// Decoder graphs to write; one the model's shape does not allow is an error.
    pub decoders: Vec<DecoderVariant>,
    /// Decoder graphs also written where the model's shape allows them (`ocrctl export`'s
    /// default: gqa beside merged); one left out is reported as [`Progress::Skipped`]. At least
    /// one decoder is written in all.
    pub optional_decoders: Vec<DecoderVariant>,
    /// The GQA decoder's KV cache element type (`--kv-cache`).
    pub kv_cache: crate::kv_cache::KvCache,
    /// Pads the GQA decoder's query heads as an 8-bit cache does, whatever the cache type:
    /// with the activation type's cache this checks the padding alone, exactly (tests).
    pub pad_query_heads: bool,
    /// An 8-bit cache's scale per decoder layer (`--calibrate` measures them); empty: the
    /// `kv_cache`'s one scale for every layer.
    pub kv_layer_scales: Vec<f32>,
}

/// Default `MatMulNBits` accuracy level (ONNX Runtime's own default for fused QDQ nodes).
pub const DEFAULT_ACCURACY_LEVEL: u8 = 4;

/// Default INT4 block size (docs/manual/export.md#int4 has the measurements behind it).
pub const DEFAULT_BLOCK_SIZE: usize = 32;

impl ExportOptions {
    /// fp32, ORT target, no overwrite.
    pub fn new(checkpoint: String, out: PathBuf) -> ExportOptions {
        ExportOptions {
            checkpoint,
            out,
            precisions: vec![Precision::Fp32],
            target: Target::Ort,
            force: false,
            int4: Quant {
                block_size: DEFAULT_BLOCK_SIZE,
                format: Int4Format::Qdq,
                lm_head: true,
                accuracy_level: DEFAULT_ACCURACY_LEVEL,
            },
            awq: None,
            calibration_graphs: false,
            decoders: vec![DecoderVariant::Merged],
            optional_decoders: Vec::new(),
            kv_cache: crate::kv_cache::KvCache::Activation,
            pad_query_heads: false,
            kv_layer_scales: Vec::new(),
        }
    }
}

/// Checks INT4 settings against every Linear's input dimension before anything is written.
fn check_int4(opts: &ExportOptions, cfg: &ModelConfig) -> Result<(), ExportError> {
    if !opts.precisions.iter().any(|p| p.is_int4()) {
        return Ok(());
    }
    let q = opts.int4;
    if q.format == Int4Format::MatMulNBits && opts.target == Target::TensorRt {
        return Err(ExportError::Invalid(
            "--int4-format matmulnbits is an ONNX Runtime contrib op that TensorRT cannot parse; use --int4-format qdq".into(),
        ));
    }
    let v = &cfg.vision;
    let t = &cfg.text;
    let m = cfg.spatial_merge_size;
    let dims = [
        ("vision hidden_size", v.hidden_size),
        (
            "vision attention width (heads·head_dim)",
            v.num_heads * v.head_dim,
        ),
        ("vision intermediate_size", v.intermediate_size),
        (
            "projector merged width (hidden·merge²)",
            v.hidden_size * m * m,
        ),
        ("text hidden_size", t.hidden_size),
        (
            "text attention width (heads·head_dim)",
            t.num_heads * t.head_dim,
        ),
        ("text intermediate_size", t.intermediate_size),
    ];
    for (what, k) in dims {
        crate::quant::check_block_size(q.block_size, k, what)
            .map_err(|e| ExportError::Invalid(format!("--block-size: {e}")))?;
    }
    Ok(())
}

/// Progress events for a UI.
#[derive(Debug, Clone)]
pub enum Progress {
    /// A part starts; `steps` calls to `Step` follow.
    Begin {
        part: String,
        steps: u64,
    },
    Step,
    /// The part is written.
    End,
    /// An optional decoder (`ExportOptions::optional_decoders`) is not written: the model's
    /// shape does not allow it, for `reason`.
    Skipped {
        decoder: DecoderVariant,
        reason: String,
    },
}

fn sha256_file(path: &Path) -> Result<SourceFile, ExportError> {
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    crate::verify::digest_file(path, name)
}

/// The decoders to write for `cfg`: every one of `opts.decoders` (checked: one the model does
/// not allow is an error) and those of `opts.optional_decoders` it allows (one left out is
/// reported); then the KV cache options checked against them.
fn decoders_to_write(
    opts: &ExportOptions,
    cfg: &ModelConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<DecoderVariant>, ExportError> {
    let allowed = |dv: DecoderVariant| match dv {
        DecoderVariant::Merged => Ok(()),
        DecoderVariant::Gqa => crate::decoder_gqa::check(cfg, opts.target),
        DecoderVariant::Paged => opts
            .precisions
            .iter()
            .try_for_each(|p| crate::decoder_paged::check(cfg, opts.target, p.dtype())),
    };
    // Paged first: its message says which precisions it needs.
    for dv in [DecoderVariant::Paged, DecoderVariant::Gqa] {
        if opts.decoders.contains(&dv) {
            allowed(dv)?;
        }
    }
    let mut decoders = opts.decoders.clone();
    for &dv in &opts.optional_decoders {
        if decoders.contains(&dv) {
            continue;
        }
        match allowed(dv) {
            Ok(()) => decoders.push(dv),
            Err(e) => progress(Progress::Skipped {
                decoder: dv,
                reason: crate::decoder_gqa::shape_problem(cfg).unwrap_or_else(|| e.to_string()),
            }),
        }
    }
    if decoders.is_empty() {
        return Err(ExportError::Invalid("no decoder graph requested".into()));
    }
    if decoders
        .iter()
        .any(|d| matches!(d, DecoderVariant::Gqa | DecoderVariant::Paged))
    {
        // Per-layer scales checked before any graph is written.
        let n = cfg.text.num_layers;
        for i in 0..n {
            opts.kv_cache.layer_scale(&opts.kv_layer_scales, i, n)?;
        }
    } else if opts.kv_cache != crate::kv_cache::KvCache::Activation
        || !opts.kv_layer_scales.is_empty()
    {
        return Err(ExportError::Invalid(format!(
            "--kv-cache {} applies to the gqa and paged decoders: export with --decoder gqa",
            opts.kv_cache.name()
        )));
    }
    Ok(decoders)
}

/// What an export reads: the model's configuration, its weights, the checkpoint files it
/// came from (with their digests) and the model's variant.
struct Source {
    cfg: ModelConfig,
    weights: Box<dyn Weights>,
    files: Vec<SourceFile>,
    variant: Variant,
}

/// Opens `--checkpoint` (a folder, a hub id or `dummy:NAME`), writing its tokenizer and
/// config files into `tmp_path`.
fn open_source(opts: &ExportOptions, tmp_path: &Path) -> Result<Source, ExportError> {
    if let Some(dummy_name) = opts.checkpoint.strip_prefix("dummy:") {
        let cfg = dummy::write_files(dummy_name, tmp_path)?;
        // The dummy configs are LightOnOCR-2-1B's (or its shapes shrunk).
        let variant = Variant::new(Generation::V2, cfg.text.vocab_size, None, None);
        return Ok(Source {
            cfg,
            weights: Box::new(DummyWeights),
            files: Vec::new(),
            variant,
        });
    }
    let dir = checkpoint_dir(&opts.checkpoint)?;
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let ck = Checkpoint::open(&dir)?;
    if !dir.join("tokenizer.json").is_file() {
        return Err(ExportError::Invalid(format!(
            "{}: tokenizer.json is missing (needed to run the model)",
            dir.display()
        )));
    }
    let mut files = Vec::new();
    for f in COPIED_FILES {
        let src = dir.join(f);
        if src.is_file() {
            let dst = tmp_path.join(f);
            std::fs::copy(&src, &dst).map_err(|e| ExportError::io(&src, e))?;
            files.push(sha256_file(&src)?);
        }
    }
    for p in ck.files() {
        files.push(sha256_file(&p)?);
    }
    let variant = Variant::detect(&dir, &cfg)?;
    Ok(Source {
        cfg,
        weights: Box::new(ck),
        files,
        variant,
    })
}

/// The checkpoint folder `checkpoint` names (a folder or a hub id), which has a config.json.
fn checkpoint_dir(checkpoint: &str) -> Result<PathBuf, ExportError> {
    let dir = match crate::hub::resolve(checkpoint) {
        Some(Ok(dir)) => dir,
        Some(Err(e)) => {
            return Err(ExportError::Invalid(format!(
                "{checkpoint}: no such folder; as a hub id, {e}"
            )))
        }
        None => {
            return Err(ExportError::Invalid(format!(
                "{checkpoint}: checkpoint directory not found (--checkpoint takes a folder, a hub \
                     id such as lightonai/LightOnOCR-2-1B in the Hugging Face cache, or \
                     dummy:lightonocr-2-1b)"
            )))
        }
    };
    if !dir.join("config.json").is_file() {
        return Err(ExportError::Invalid(format!(
            "{}: not a checkpoint (no config.json); --checkpoint takes a LightOnOCR \
                 checkpoint folder (config.json, model.safetensors or shards, tokenizer.json) \
                 or dummy:lightonocr-2-1b",
            dir.display()
        )));
    }
    Ok(dir)
}

/// The digest of the checkpoint's files: their names and digests in name order.
fn checkpoint_digest(files: &[SourceFile]) -> String {
    let mut digest = Sha256::new();
    let mut sorted: Vec<&SourceFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for f in sorted {
        digest.update(f.name.as_bytes());
        digest.update(f.sha256.as_bytes());
    }
    format!("{:x}", digest.finalize())
}

/// The AWQ scale search's plan, when activation statistics are given and an int4 precision
/// is exported.
fn awq_plan(
    opts: &ExportOptions,
    src: &Source,
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<crate::awq::AwqPlan>, ExportError> {
    match (&opts.awq, opts.precisions.iter().any(|p| p.is_int4())) {
        (Some(stats), true) => {
            progress(Progress::Begin {
                part: "awq scale search".into(),
                steps: 0,
            });
            let plan =
                crate::awq::plan(&src.cfg, src.weights.as_ref(), stats, opts.int4.block_size)?;
            progress(Progress::End);
            Ok(Some(plan))
        }
        _ => Ok(None),
    }
}

/// Each precision's graphs by part.
type Graphs = BTreeMap<Precision, BTreeMap<String, GraphInfo>>;

/// Writes the graphs of one export into its `onnx/` folder.
struct GraphWriter<'a> {
    opts: &'a ExportOptions,
    cfg: &'a ModelConfig,
    onnx_dir: &'a Path,
    decoders: &'a [DecoderVariant],
}

impl GraphWriter<'_> {
    /// Every precision's graphs; an int4 precision takes its weights through `awq_plan`.
    fn write_all(
        &self,
        weights: &dyn Weights,
        awq_plan: Option<&crate::awq::AwqPlan>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Graphs, ExportError> {
        let mut graphs = BTreeMap::new();
        for &prec in &self.opts.precisions {
            let awq_weights =
                awq_plan
                    .filter(|_| prec.is_int4())
                    .map(|plan| crate::awq::AwqWeights {
                        inner: weights,
                        plan,
                    });
            let w: &dyn Weights = match &awq_weights {
                Some(a) => a,
                None => weights,
            };
            graphs.insert(prec, self.write_precision(prec, w, progress)?);
        }
        Ok(graphs)
    }

    /// One precision's vision encoder, embeddings and decoders.
    fn write_precision(
        &self,
        prec: Precision,
        w: &dyn Weights,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<BTreeMap<String, GraphInfo>, ExportError> {
        let (opts, cfg, onnx_dir) = (self.opts, self.cfg, self.onnx_dir);
        let e = Emit {
            act: prec.dtype(),
            target: opts.target,
            quant: prec.is_int4().then_some(opts.int4),
            calibrate: opts.calibration_graphs,
        };
        let sfx = prec.suffix();
        let mut parts = BTreeMap::new();
        progress(Progress::Begin {
            part: format!("{}{sfx}", graph::VISION),
            steps: cfg.vision.num_layers as u64,
        });
        let info = vision::build(
            onnx_dir,
            &format!("{}{sfx}", graph::VISION),
            cfg,
            w,
            e,
            &mut || progress(Progress::Step),
        )?;
        progress(Progress::End);
        parts.insert(graph::VISION.to_string(), info);

        progress(Progress::Begin {
            part: format!("{}{sfx}", graph::EMBED),
            steps: 0,
        });
        let info = embed::build(onnx_dir, &format!("{}{sfx}", graph::EMBED), cfg, w, e)?;
        progress(Progress::End);
        parts.insert(graph::EMBED.to_string(), info);

        for &dv in self.decoders {
            let stem = format!("{}{sfx}", dv.stem());
            progress(Progress::Begin {
                part: stem.clone(),
                steps: cfg.text.num_layers as u64,
            });
            let info = self.write_decoder(dv, &stem, w, e, &mut || progress(Progress::Step))?;
            progress(Progress::End);
            parts.insert(dv.part().to_string(), info);
        }
        Ok(parts)
    }

    /// One decoder graph, `stem`.onnx.
    fn write_decoder(
        &self,
        dv: DecoderVariant,
        stem: &str,
        w: &dyn Weights,
        e: Emit,
        step: &mut dyn FnMut(),
    ) -> Result<GraphInfo, ExportError> {
        let (opts, cfg, onnx_dir) = (self.opts, self.cfg, self.onnx_dir);
        let layout = crate::kv_cache::GqaLayout {
            kv: opts.kv_cache,
            layer_scales: &opts.kv_layer_scales,
            pad_query_heads: opts.pad_query_heads,
        };
        match dv {
            DecoderVariant::Merged => decoder::build(onnx_dir, stem, cfg, w, e, step),
            DecoderVariant::Gqa => {
                crate::decoder_gqa::build(onnx_dir, stem, cfg, w, e, layout, step)
            }
            DecoderVariant::Paged => {
                crate::decoder_paged::build(onnx_dir, stem, cfg, w, e, layout, step)
            }
        }
    }
}

/// The manifest of an export of `src` with these graphs (its `files` still empty).
fn manifest_for(
    opts: &ExportOptions,
    src: Source,
    checkpoint_digest: String,
    awq_plan: Option<crate::awq::AwqPlan>,
    graphs: Graphs,
) -> Manifest {
    let target_opset = crate::layers::Emit {
        act: DType::F32,
        target: opts.target,
        quant: None,
        calibrate: false,
    }
    .opset();
    Manifest {
        format: "ocrctl-export/1".into(),
        ocrctl_version: env!("CARGO_PKG_VERSION").into(),
        source: opts.checkpoint.clone(),
        source_dtype: src.weights.source_dtype(),
        source_files: src.files,
        checkpoint_digest,
        target: opts.target,
        ir_version: crate::graph::ir_version_for(&[("", target_opset)]),
        opset: target_opset,
        precisions: opts.precisions.clone(),
        int4: opts
            .precisions
            .iter()
            .any(|p| p.is_int4())
            .then_some(opts.int4),
        awq: awq_plan.map(|p| p.choices),
        model: src.cfg,
        variant: Some(src.variant),
        graphs,
        files: Vec::new(),
        kv_cache: opts.kv_cache,
        kv_layer_scales: opts.kv_layer_scales.clone(),
        engines: BTreeMap::new(),
    }
}

/// Runs the export and returns the manifest it wrote.
pub fn export(
    opts: &ExportOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest, ExportError> {
    check_out(opts)?;
    let (parent, name) = out_parent_and_name(opts)?;
    let mut tmp = staging_dir(&parent, &name)?;
    let tmp_path = tmp.0.clone();
    let src = open_source(opts, &tmp_path)?;
    crate::processor::complete(&tmp_path, &src.cfg)?;
    crate::processor::adapt(&tmp_path)?;
    check_int4(opts, &src.cfg)?;
    let decoders = decoders_to_write(opts, &src.cfg, progress)?;
    let digest = checkpoint_digest(&src.files);
    let awq_plan = awq_plan(opts, &src, progress)?;
    let writer = GraphWriter {
        opts,
        cfg: &src.cfg,
        onnx_dir: &tmp_path.join("onnx"),
        decoders: &decoders,
    };
    let graphs = writer.write_all(src.weights.as_ref(), awq_plan.as_ref(), progress)?;
    let manifest = manifest_for(opts, src, digest, awq_plan, graphs);
    let manifest = write_manifest(&tmp_path, manifest)?;
    swap_into_place(opts, &parent, &name, &mut tmp)?;
    Ok(manifest)
}

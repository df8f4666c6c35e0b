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

/// Removes `.NAME.partial-PID` directories next to `out` left by exports whose process is
/// gone (killed mid-way: nothing else would ever remove their gigabytes).
fn remove_stale_partials(parent: &Path, name: &str) {
    let prefix = format!(".{name}.partial-");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` still runs (Linux: `/proc/PID`; elsewhere assume it does).
fn process_alive(pid: u32) -> bool {
    if Path::new("/proc/self").exists() {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

/// Removes the temporary directory unless the export completed.
struct TempDir(PathBuf, bool);

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
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

/// Runs the export and returns the manifest it wrote.
pub fn export(
    opts: &ExportOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest, ExportError> {
    if opts.precisions.is_empty() {
        return Err(ExportError::Invalid("no precision requested".into()));
    }
    if opts.out.exists() && !opts.force {
        return Err(ExportError::Invalid(format!(
            "{}: already exists (use --force to replace it)",
            opts.out.display()
        )));
    }
    // --force replaces an earlier export, never some other directory (or a file).
    if opts.out.exists() && !opts.out.join(MANIFEST).is_file() {
        return Err(ExportError::Invalid(format!(
            "{}: exists and is not an ocrctl export (it has no {MANIFEST}); --force only \
             replaces an earlier export: choose another --out or remove it yourself",
            opts.out.display()
        )));
    }
    // Nor one whose manifest is not an ocrctl manifest (a planted `{}` would make any folder
    // look like an export).
    if opts.out.exists() {
        if let Err(e) = Manifest::load(&opts.out) {
            return Err(ExportError::Invalid(format!(
                "{e}; --force only replaces an earlier export: choose another --out or remove \
                 it yourself"
            )));
        }
    }
    let parent = opts
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ExportError::io(parent, e))?;
    let name = opts.out.file_name().ok_or_else(|| {
        ExportError::Invalid(format!(
            "{}: not a usable output directory",
            opts.out.display()
        ))
    })?;
    remove_stale_partials(parent, &name.to_string_lossy());
    let tmp_path = parent.join(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp_path);
    let onnx_dir = tmp_path.join("onnx");
    std::fs::create_dir_all(&onnx_dir).map_err(|e| ExportError::io(&onnx_dir, e))?;
    let mut tmp = TempDir(tmp_path.clone(), false);

    let (cfg, weights, source_files, variant): (
        ModelConfig,
        Box<dyn Weights>,
        Vec<SourceFile>,
        Variant,
    ) = if let Some(dummy_name) = opts.checkpoint.strip_prefix("dummy:") {
        let cfg = dummy::write_files(dummy_name, &tmp_path)?;
        // The dummy configs are LightOnOCR-2-1B's (or its shapes shrunk).
        let variant = Variant::new(Generation::V2, cfg.text.vocab_size, None, None);
        (cfg, Box::new(DummyWeights), Vec::new(), variant)
    } else {
        let dir = match crate::hub::resolve(&opts.checkpoint) {
            Some(Ok(dir)) => dir,
            Some(Err(e)) => {
                return Err(ExportError::Invalid(format!(
                    "{}: no such folder; as a hub id, {e}",
                    opts.checkpoint
                )))
            }
            None => {
                return Err(ExportError::Invalid(format!(
                    "{}: checkpoint directory not found (--checkpoint takes a folder, a hub \
                         id such as lightonai/LightOnOCR-2-1B in the Hugging Face cache, or \
                         dummy:lightonocr-2-1b)",
                    opts.checkpoint
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
        (cfg, Box::new(ck), files, variant)
    };
    crate::processor::complete(&tmp_path, &cfg)?;
    crate::processor::adapt(&tmp_path)?;
    check_int4(opts, &cfg)?;
    let decoders = decoders_to_write(opts, &cfg, progress)?;
    let mut digest = Sha256::new();
    let mut sorted: Vec<&SourceFile> = source_files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for f in sorted {
        digest.update(f.name.as_bytes());
        digest.update(f.sha256.as_bytes());
    }

    let awq_plan = match (&opts.awq, opts.precisions.iter().any(|p| p.is_int4())) {
        (Some(stats), true) => {
            progress(Progress::Begin {
                part: "awq scale search".into(),
                steps: 0,
            });
            let plan = crate::awq::plan(&cfg, weights.as_ref(), stats, opts.int4.block_size)?;
            progress(Progress::End);
            Some(plan)
        }
        _ => None,
    };
    let mut graphs = BTreeMap::new();
    for &prec in &opts.precisions {
        let e = Emit {
            act: prec.dtype(),
            target: opts.target,
            quant: prec.is_int4().then_some(opts.int4),
            calibrate: opts.calibration_graphs,
        };
        let sfx = prec.suffix();
        let mut parts = BTreeMap::new();
        let awq_weights =
            awq_plan
                .as_ref()
                .filter(|_| prec.is_int4())
                .map(|plan| crate::awq::AwqWeights {
                    inner: weights.as_ref(),
                    plan,
                });
        let w: &dyn Weights = match &awq_weights {
            Some(a) => a,
            None => weights.as_ref(),
        };

        progress(Progress::Begin {
            part: format!("{}{sfx}", graph::VISION),
            steps: cfg.vision.num_layers as u64,
        });
        let info = vision::build(
            &onnx_dir,
            &format!("{}{sfx}", graph::VISION),
            &cfg,
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
        let info = embed::build(&onnx_dir, &format!("{}{sfx}", graph::EMBED), &cfg, w, e)?;
        progress(Progress::End);
        parts.insert(graph::EMBED.to_string(), info);

        for &dv in &decoders {
            let stem = format!("{}{sfx}", dv.stem());
            progress(Progress::Begin {
                part: stem.clone(),
                steps: cfg.text.num_layers as u64,
            });
            let mut step = || progress(Progress::Step);
            let layout = crate::kv_cache::GqaLayout {
                kv: opts.kv_cache,
                layer_scales: &opts.kv_layer_scales,
                pad_query_heads: opts.pad_query_heads,
            };
            let info = match dv {
                DecoderVariant::Merged => decoder::build(&onnx_dir, &stem, &cfg, w, e, &mut step),
                DecoderVariant::Gqa => {
                    crate::decoder_gqa::build(&onnx_dir, &stem, &cfg, w, e, layout, &mut step)
                }
                DecoderVariant::Paged => {
                    crate::decoder_paged::build(&onnx_dir, &stem, &cfg, w, e, layout, &mut step)
                }
            }?;
            progress(Progress::End);
            parts.insert(dv.part().to_string(), info);
        }
        graphs.insert(prec, parts);
    }

    let target_opset = crate::layers::Emit {
        act: DType::F32,
        target: opts.target,
        quant: None,
        calibrate: false,
    }
    .opset();
    let manifest = Manifest {
        format: "ocrctl-export/1".into(),
        ocrctl_version: env!("CARGO_PKG_VERSION").into(),
        source: opts.checkpoint.clone(),
        source_dtype: weights.source_dtype(),
        source_files,
        checkpoint_digest: format!("{:x}", digest.finalize()),
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
        model: cfg,
        variant: Some(variant),
        graphs,
        files: Vec::new(),
        kv_cache: opts.kv_cache,
        kv_layer_scales: opts.kv_layer_scales.clone(),
        engines: BTreeMap::new(),
    };
    let all: Vec<(Precision, &GraphInfo)> = manifest
        .graphs
        .iter()
        .flat_map(|(p, parts)| parts.values().map(move |g| (*p, g)))
        .collect();
    crate::processor::adapt_config(&tmp_path, manifest.model.image_token_id, &all)?;
    let mut manifest = manifest;
    manifest.files = crate::verify::digest_tree(&tmp_path, MANIFEST)?;
    let mpath = tmp_path.join(MANIFEST);
    let text = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    std::fs::write(&mpath, text).map_err(|e| ExportError::io(&mpath, e))?;

    // Swap into place: the old export (with --force) is removed only after the new one is in.
    let old = parent.join(format!(
        ".{}.old-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let had_old = opts.out.exists();
    if had_old {
        std::fs::rename(&opts.out, &old).map_err(|e| ExportError::io(&opts.out, e))?;
    }
    std::fs::rename(&tmp_path, &opts.out).map_err(|e| ExportError::io(&opts.out, e))?;
    tmp.1 = true;
    if had_old {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(manifest)
}

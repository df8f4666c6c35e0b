//! `ocrctl export`: the CLI face of [`ocrctl_exporters::export`], with progress bars.

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ocrctl::quality::calibrate;
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl_exporters::export::{
    export, DecoderVariant, ExportOptions, Manifest, Precision, Progress, DEFAULT_ACCURACY_LEVEL,
    DEFAULT_BLOCK_SIZE,
};
use ocrctl_exporters::kv_cache::KvCache;
use ocrctl_exporters::layers::{Int4Format, Quant, Target};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `ocrctl export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Checkpoint directory (config.json, model.safetensors or shards, tokenizer files), a
    /// hub id (`lightonai/LightOnOCR-2-1B[@REV]`: read from the Hugging Face cache,
    /// downloaded into it when missing unless HF_HUB_OFFLINE=1), or `dummy:lightonocr-2-1b` /
    /// `dummy:tiny` for random weights.
    #[arg(long)]
    checkpoint: String,
    /// Output directory (must not exist unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Precisions to write, comma-separated: fp32, fp16, int4 (INT4 weights, fp32
    /// activations), int4-fp16 (INT4 weights, fp16 activations).
    #[arg(long, default_value = "fp32", value_delimiter = ',')]
    precision: Vec<String>,
    /// Runtime the graphs are for: `ort` (ONNX Runtime CPU/CUDA, fused contrib ops) or
    /// `tensorrt` (standard ONNX ops only).
    #[arg(long, default_value = "ort", value_parser = parse_target)]
    target: Target,
    /// Replace an existing output directory (only once the new export is complete).
    #[arg(long)]
    force: bool,
    /// INT4 block size (rows of a weight column sharing one scale): a power of two >= 16
    /// dividing every Linear's input width (default 32).
    #[arg(long)]
    block_size: Option<usize>,
    /// INT4 layout: `qdq` (DequantizeLinear + MatMul: TensorRT, CUDA and CPU; the default)
    /// or `matmulnbits` (com.microsoft.MatMulNBits, ONNX Runtime only).
    #[arg(long, value_parser = parse_format)]
    int4_format: Option<Int4Format>,
    /// Keep the lm_head in 16-bit for int4 precisions (larger files; docs/manual/export.md#int4).
    #[arg(long)]
    lm_head_16bit: bool,
    /// `accuracy_level` written into MatMulNBits nodes (0: float compute; 4: int8
    /// activations on CPU). QDQ graphs take it from `ocrctl ocr --accuracy-level`.
    #[arg(long, default_value_t = DEFAULT_ACCURACY_LEVEL, value_parser = clap::value_parser!(u8).range(0..=4))]
    accuracy_level: u8,
    /// Activation-aware (AWQ-style) INT4 scales, and an 8-bit KV cache's scale when
    /// --kv-scale is not given, from the images in this folder (PNG, JPEG, WebP, TIFF): the
    /// fp32 graphs run on them first. Without it: round-to-nearest.
    #[arg(long)]
    calibrate: Option<PathBuf>,
    /// Decoder graphs to write, comma-separated: `merged` (KV cache concatenated each step;
    /// any runtime, TensorRT too) and/or `gqa` (GroupQueryAttention over a fixed cache
    /// updated in place; ONNX Runtime CPU/CUDA, the fast GPU path). The runner prefers gqa.
    /// Default: both for `--target ort` (gqa where the model's heads suit its kernel, else
    /// one line says why it is left out), merged for `--target tensorrt`. `paged`
    /// (experimental: PagedAttention over a cache in blocks, ONNX Runtime CUDA, fp16 or
    /// int4-fp16) is written to be checked on a GPU by scripts/check_paged.py; ocrctl does
    /// not run it yet.
    #[arg(long, value_delimiter = ',', value_parser = parse_decoder)]
    decoder: Vec<DecoderVariant>,
    /// The gqa (and paged) decoder's KV cache: `auto` (the graphs' activation type, exact), `fp8`
    /// (float8 E4M3: half the memory and faster decode steps at large batches on GPUs of
    /// compute capability 8.9 and later, 8.5 against 6.9 A4 pages/s at batch 256 on an H200;
    /// not exact) or `int8` (needs --kv-scale or --calibrate; the CPU runs it too).
    #[arg(long, default_value = "auto")]
    kv_cache: String,
    /// Scale of an 8-bit KV cache (value = stored × scale; keys and values share it).
    /// Without it, --calibrate measures one per layer (largest |key| or |value| over the
    /// folder's pages ÷ 448 for fp8, ÷ 127 for int8); else fp8 takes 1.0 and int8 needs one.
    #[arg(long)]
    kv_scale: Option<f32>,
    /// Path of libonnxruntime.so for --calibrate (default: found automatically).
    #[arg(long, env = "OCRCTL_ORT_LIB")]
    ort_lib: Option<PathBuf>,
}

/// Exports calibration graphs next to `--out`, runs them on the folder's images and returns
/// the activation statistics. Nothing is left behind.
fn calibrate(
    opts: &ExportOptions,
    dir: &std::path::Path,
    ort_lib: Option<PathBuf>,
    kv_scale: bool,
) -> anyhow::Result<calibrate::Calibration> {
    if !opts.precisions.iter().any(|p| p.is_int4()) && !kv_scale {
        anyhow::bail!(
            "--calibrate applies to int4 precisions (--precision int4 or int4-fp16: AWQ \
             scales) or to an 8-bit KV cache without --kv-scale (--kv-cache fp8|int8: its scale)"
        );
    }
    let images = calibrate::image_files(dir)?;
    if images.is_empty() {
        anyhow::bail!(
            "--calibrate {}: no image files (png, jpg, webp, tif) in this folder",
            dir.display()
        );
    }
    let scratch = tempfile::Builder::new()
        .prefix(".ocrctl-calib-")
        .tempdir_in(
            opts.out
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new(".")),
        )?;
    let calib_out = scratch.path().join("graphs");
    let copts = ExportOptions {
        out: calib_out.clone(),
        precisions: vec![Precision::Fp32],
        target: Target::Ort,
        force: true,
        awq: None,
        calibration_graphs: true,
        decoders: vec![DecoderVariant::Merged],
        optional_decoders: Vec::new(),
        kv_cache: KvCache::Activation,
        ..opts.clone()
    };
    eprintln!(
        "calibrating on {} image(s) from {}",
        images.len(),
        dir.display()
    );
    export(&copts, &mut |_| {})?;
    let mut lo = LoadOptions::new(Precision::Fp32);
    lo.ort_lib = ort_lib;
    let calib = std::sync::Arc::new(ocrctl::model::export::Export::open(&calib_out)?);
    let mut model = OrtModel::open(&calib, &lo)?;
    let c = calibrate::collect(&mut model, calib, &images, kv_scale)?;
    if c.images == 0 {
        anyhow::bail!(
            "--calibrate {}: none of the {} image file(s) could be read",
            dir.display(),
            images.len()
        );
    }
    Ok(c)
}

fn parse_decoder(s: &str) -> Result<DecoderVariant, String> {
    DecoderVariant::parse(s).map_err(|e| e.to_string())
}

fn parse_format(s: &str) -> Result<Int4Format, String> {
    match s {
        "qdq" => Ok(Int4Format::Qdq),
        "matmulnbits" => Ok(Int4Format::MatMulNBits),
        other => Err(format!(
            "unknown int4 format `{other}` (expected qdq or matmulnbits)"
        )),
    }
}

fn parse_target(s: &str) -> Result<Target, String> {
    match s {
        "ort" => Ok(Target::Ort),
        "tensorrt" | "trt" => Ok(Target::TensorRt),
        other => Err(format!(
            "unknown target `{other}` (expected ort or tensorrt)"
        )),
    }
}

/// `--precision`'s precisions, each once; INT4 settings without an INT4 precision would be
/// ignored: said instead.
fn precisions(a: &ExportArgs) -> anyhow::Result<Vec<Precision>> {
    let mut precisions = Vec::new();
    for p in &a.precision {
        let p = Precision::parse(p.trim()).context("--precision")?;
        if !precisions.contains(&p) {
            precisions.push(p);
        }
    }
    if !precisions.iter().any(|p| p.is_int4()) {
        for (given, flag) in [
            (a.block_size.is_some(), "--block-size"),
            (a.int4_format.is_some(), "--int4-format"),
            (a.lm_head_16bit, "--lm-head-16bit"),
        ] {
            if given {
                anyhow::bail!(
                    "{flag} applies to int4 precisions only; add int4 or int4-fp16 to --precision"
                );
            }
        }
    }
    Ok(precisions)
}

/// The library's export options from the flags; an 8-bit cache whose scale `--calibrate`
/// measures (`kv_from_calibration`) is set by [`apply_calibration`].
fn export_options(
    a: &ExportArgs,
    precisions: Vec<Precision>,
    kv_from_calibration: bool,
) -> anyhow::Result<ExportOptions> {
    Ok(ExportOptions {
        checkpoint: a.checkpoint.clone(),
        out: a.out.clone(),
        precisions,
        target: a.target,
        force: a.force,
        int4: Quant {
            block_size: a.block_size.unwrap_or(DEFAULT_BLOCK_SIZE),
            format: a.int4_format.unwrap_or(Int4Format::Qdq),
            lm_head: !a.lm_head_16bit,
            accuracy_level: a.accuracy_level,
        },
        awq: None,
        calibration_graphs: false,
        decoders: match a.decoder.is_empty() {
            false => a.decoder.clone(),
            true => vec![DecoderVariant::Merged],
        },
        // By default gqa too, where the model's heads suit its kernel (else one line says so).
        optional_decoders: match (a.decoder.is_empty(), a.target) {
            (true, Target::Ort) => vec![DecoderVariant::Gqa],
            _ => Vec::new(),
        },
        // An 8-bit cache without --kv-scale takes its scale from --calibrate (set later).
        kv_cache: match kv_from_calibration {
            true => KvCache::Activation,
            false => KvCache::parse(&a.kv_cache, a.kv_scale)?,
        },
        pad_query_heads: false,
        kv_layer_scales: Vec::new(),
    })
}

/// Runs `--calibrate` over the images in `dir`: AWQ statistics for the int4 precisions, and
/// the KV cache's scales when `kv_from_calibration`.
fn apply_calibration(
    opts: &mut ExportOptions,
    a: &ExportArgs,
    dir: &std::path::Path,
    kv_from_calibration: bool,
) -> anyhow::Result<()> {
    let c = calibrate(opts, dir, a.ort_lib.clone(), kv_from_calibration)?;
    if opts.precisions.iter().any(|p| p.is_int4()) {
        opts.awq = Some(c.stats);
    }
    if kv_from_calibration {
        // One scale per layer (each node has its own scale tensor); the manifest's
        // `kv_cache` holds the largest, for people and the profile budget.
        let largest = c.kv_absmax.iter().fold(0f32, |a, b| a.max(*b));
        opts.kv_cache = KvCache::calibrated(&a.kv_cache, largest)?;
        let top = opts
            .kv_cache
            .largest_stored()
            .expect("a calibrated cache is 8-bit");
        // A layer that measured nothing gets 0, which the export refuses naming the layer.
        opts.kv_layer_scales = c.kv_absmax.iter().map(|m| m / top).collect();
        eprintln!(
            "KV cache: {:?}, per layer {:?} (largest |key| or |value| over the calibration \
             pages' prompts and {} generated tokens: {largest})",
            opts.kv_cache, opts.kv_layer_scales, c.kv_decoded_tokens
        );
    }
    Ok(())
}

/// Runs the export with a progress bar per graph.
fn export_with_progress(opts: &ExportOptions) -> anyhow::Result<Manifest> {
    let style =
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos}/{len} layers {elapsed}")
            .expect("valid template")
            .progress_chars("=> ");
    let mut bar: Option<ProgressBar> = None;
    Ok(export(opts, &mut |ev| match ev {
        Progress::Begin { part, steps } => {
            let b = ProgressBar::new(steps)
                .with_style(style.clone())
                .with_prefix(part);
            bar = Some(b);
        }
        Progress::Step => {
            if let Some(b) = &bar {
                b.inc(1);
            }
        }
        Progress::End => {
            if let Some(b) = bar.take() {
                b.finish();
            }
        }
        Progress::Skipped { decoder, reason } => eprintln!(
            "note: no {} decoder written: it {reason}; the merged decoder runs this model",
            decoder.name()
        ),
    })?)
}

/// One line per graph written (precision, file, MB), then the total.
fn print_summary(out: &std::path::Path, manifest: &Manifest, start: Instant) {
    let mut total = 0u64;
    // Columns as wide as their longest entry, so long names keep the table aligned.
    let pw = manifest
        .graphs
        .keys()
        .map(|p| p.name().len())
        .max()
        .unwrap_or(0);
    let fw = manifest
        .graphs
        .values()
        .flat_map(|parts| parts.values().map(|i| i.file.len()))
        .max()
        .unwrap_or(0);
    for (prec, parts) in &manifest.graphs {
        for info in parts.values() {
            let onnx = out.join("onnx").join(&info.file);
            let size = std::fs::metadata(&onnx).map(|m| m.len()).unwrap_or(0) + info.data_bytes;
            total += size;
            println!(
                "{:<pw$}  {:<fw$}  {:>10.1} MB",
                prec.name(),
                info.file,
                size as f64 / 1e6
            );
        }
    }
    println!(
        "exported {} ({}) to {} in {:.1}s, {:.1} MB",
        manifest.source,
        manifest
            .precisions
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(","),
        out.display(),
        start.elapsed().as_secs_f64(),
        total as f64 / 1e6
    );
}

/// Runs the export and prints a summary of what was written.
pub fn run(a: ExportArgs) -> anyhow::Result<ExitCode> {
    let precisions = precisions(&a)?;
    // A hub id not in the cache is downloaded before anything is written.
    crate::cli::hub_fetch::ensure_cached(&a.checkpoint)?;
    let kv_from_calibration =
        a.calibrate.is_some() && a.kv_scale.is_none() && KvCache::is_8bit_kind(&a.kv_cache);
    let mut opts = export_options(&a, precisions, kv_from_calibration)?;
    let start = Instant::now();
    if let Some(dir) = &a.calibrate {
        apply_calibration(&mut opts, &a, dir, kv_from_calibration)?;
    }
    let manifest = export_with_progress(&opts)?;
    print_summary(&a.out, &manifest, start);
    Ok(ExitCode::SUCCESS)
}

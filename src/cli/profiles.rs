//! `ocrctl profiles list|show|check`: the hardware profiles and their memory budget.
//!
//! ```text
//! ocrctl profiles list
//! ocrctl profiles show 16gb
//! ocrctl profiles check 16gb --model out/lightonocr --gpu-memory 16
//! ```

use anyhow::Context;
use clap::{Args, Subcommand};
use ocrctl::profile::{
    self, available, budget_with, decoder_updates_kv_in_place, export_notes, locate,
    stage_weights_bytes, trt_shapes, vision_attention_fused_in, weights_bytes, BudgetOptions,
    ModelDims, Profile, TrtShapes,
};
use ocrctl_exporters::export::Manifest;
use ocrctl_exporters::kv_cache::KvCache;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `ocrctl profiles`.
#[derive(Args, Debug)]
pub struct ProfilesArgs {
    #[command(subcommand)]
    command: ProfilesCommand,
}

#[derive(Subcommand, Debug)]
enum ProfilesCommand {
    /// List the profiles loadable by name: the built-ins (16gb, 24gb, 80gb, cpu) and the
    /// `*.yaml` files of $OCRCTL_PROFILES_DIR, of `profiles/` next to the executable and of
    /// ./profiles.
    List,
    /// Print a profile's YAML and what is derived from it (the TensorRT shape profiles).
    Show(ShowArgs),
    /// Compute the memory a profile needs for an export (weights, KV cache, activations,
    /// workspace) and compare it with the device; exits with 1 and names what to lower when
    /// it does not fit.
    Check(CheckArgs),
}

/// Arguments of `ocrctl profiles show`.
#[derive(Args, Debug)]
struct ShowArgs {
    /// Profile name (16gb, 24gb, 80gb, cpu, or a `<name>.yaml` of a profiles folder) or the
    /// path of a YAML file.
    profile: String,
    /// Take the model dimensions for the derived shapes from this export (default: the
    /// dimensions of LightOnOCR-2-1B).
    #[arg(long)]
    model: Option<PathBuf>,
}

/// Arguments of `ocrctl profiles check`.
#[derive(Args, Debug)]
struct CheckArgs {
    /// Profile name (16gb, 24gb, 80gb, cpu, ...) or the path of a YAML file.
    profile: String,
    /// Export directory (holds `ocrctl.json` and `onnx/`); the weights of the profile's
    /// precision and the model's dimensions come from it.
    #[arg(long)]
    model: PathBuf,
    /// Memory to check against, GiB (default: the profile's gpu_memory_gb; for a CPU-only
    /// profile, this machine's RAM).
    #[arg(long, visible_alias = "memory", value_name = "GB")]
    gpu_memory: Option<f64>,
}

/// Runs `ocrctl profiles`.
pub fn run(args: ProfilesArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ProfilesCommand::List => list(),
        ProfilesCommand::Show(a) => show(a),
        ProfilesCommand::Check(a) => check(a),
    }
}

fn list() -> anyhow::Result<ExitCode> {
    let entries = available();
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| match &e.profile {
            Ok(p) => [
                e.name.clone(),
                if p.uses_gpu() {
                    format!("{} GiB", p.gpu_memory_gb)
                } else {
                    "-".into()
                },
                p.providers
                    .iter()
                    .map(|x| x.name())
                    .collect::<Vec<_>>()
                    .join(","),
                p.precision.name().into(),
                p.max_batch_size.to_string(),
                p.description.clone(),
                p.source.to_string(),
            ],
            Err(err) => [
                e.name.clone(),
                "?".into(),
                "?".into(),
                "?".into(),
                "?".into(),
                format!("INVALID: {err}"),
                String::new(),
            ],
        })
        .collect();
    let header = [
        "name",
        "gpu memory",
        "providers",
        "precision",
        "batch",
        "description",
        "source",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    println!("{}", line(header.to_vec()));
    for r in &rows {
        println!("{}", line(r.iter().map(|s| s.as_str()).collect()));
    }
    let broken = entries.iter().filter(|e| e.profile.is_err()).count();
    Ok(if broken == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What `show` prints after the file.
#[derive(Serialize)]
struct Derived {
    model: String,
    max_prompt_tokens: u64,
    kv_cache_per_token_kib: f64,
    kv_cache_at_max_gb: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensorrt_shapes: Option<TrtShapes>,
}

fn model_dims(model: Option<&Path>) -> anyhow::Result<(String, ModelDims)> {
    match model {
        Some(dir) => {
            let m = Manifest::load(dir)?;
            Ok((
                format!("{} ({})", dir.display(), m.source),
                ModelDims::from_config(&m.model),
            ))
        }
        None => Ok((
            "LightOnOCR-2-1B (built-in dimensions)".into(),
            ModelDims::lightonocr_2_1b(),
        )),
    }
}

fn show(a: ShowArgs) -> anyhow::Result<ExitCode> {
    let (source, text) = locate(&a.profile)?;
    let p = Profile::parse(&text, source.clone())?;
    let (model, dims) = model_dims(a.model.as_deref())?;
    let per_token = dims.kv_bytes_per_token(profile::activation_bytes(p.precision));
    let kv = per_token as f64 * p.max_batch_size as f64 * p.max_sequence_length as f64;
    let derived = Derived {
        model,
        max_prompt_tokens: dims.image_tokens(p.max_image_side as u64, p.max_image_side as u64)
            + profile::PROMPT_TOKENS,
        kv_cache_per_token_kib: per_token as f64 / 1024.0,
        kv_cache_at_max_gb: (kv / (1u64 << 30) as f64 * 1000.0).round() / 1000.0,
        tensorrt_shapes: p.has_tensorrt().then(|| trt_shapes(&p, &dims)),
    };
    println!("# {source}");
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    println!();
    println!("# Derived from the values above (not part of the file).");
    let mut wrapper = std::collections::BTreeMap::new();
    wrapper.insert("derived", derived);
    print!(
        "{}",
        yaml_serde::to_string(&wrapper).context("writing the derived values as YAML")?
    );
    Ok(ExitCode::SUCCESS)
}

fn check(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let p = Profile::load(&a.profile)?;
    let capacity = match a.gpu_memory {
        Some(g) if g.is_finite() && g > 0.0 => Some((g * (1u64 << 30) as f64) as u64),
        Some(g) => anyhow::bail!("--gpu-memory: {g} is not a positive number of GiB"),
        None if !p.uses_gpu() => profile::host_memory_bytes(),
        None => None,
    };
    let manifest = Manifest::load(&a.model)?;
    let dims = ModelDims::from_config(&manifest.model);
    let weights = weights_bytes(&a.model, &manifest, p.precision)?;
    let options = BudgetOptions {
        kv_step_copy: !decoder_updates_kv_in_place(&manifest, p.precision),
        // With TensorRT listed, its attention fusion is assumed (and noted when it matters).
        vision_attention_fused: p.has_tensorrt()
            || vision_attention_fused_in(&manifest, p.precision),
        // An 8-bit GQA cache (`--kv-cache fp8|int8`) holds one byte per element (the runner
        // prefers the GQA decoder; a merged decoder of the same export keeps 16/32 bits).
        kv_element_bytes: (manifest.kv_cache != KvCache::Activation).then_some(1),
        ..BudgetOptions::default()
    };
    let mut b = budget_with(&p, &dims, weights, capacity, options);
    let stage = stage_weights_bytes(&manifest, &a.model, p.precision);
    if p.uses_gpu() && stage > 0 {
        // The prefill stage is off unless asked for (`--prefill-stage on`).
        let size = match stage as f64 / (1u64 << 30) as f64 {
            g if g >= 1.0 => format!("{g:.2} GiB"),
            g => format!("{:.1} MiB", g * 1024.0),
        };
        b.notes.push(format!(
            "--prefill-stage on loads the GQA decoder and embeddings a second time: {size} more"
        ));
    }
    let extra = export_notes(&p, &manifest, &dims);
    if !extra.is_empty() && !vision_attention_fused_in(&manifest, p.precision) {
        // The export-specific note on the vision attention replaces the generic one.
        b.notes
            .retain(|n| !n.starts_with("unfused, the vision attention"));
    }
    b.notes.extend(extra);
    println!(
        "model {} ({}; decoder {} layers × {} kv heads × {}, vision {} layers)",
        a.model.display(),
        manifest.source,
        dims.text_layers,
        dims.text_kv_heads,
        dims.text_head_dim,
        dims.vision_layers
    );
    print!("{b}");
    if b.fits() {
        return Ok(ExitCode::SUCCESS);
    }
    // Only limits of the model are at fault: show the changes that respect them, not
    // memory-saving ones that cannot help.
    let memory_fits = b.problems.iter().all(|p| {
        matches!(
            p,
            ocrctl::profile::Problem::Positions { .. } | ocrctl::profile::Problem::ImageSide { .. }
        )
    });
    if memory_fits {
        println!("to stay within the model's limits, change:");
    } else {
        println!("to fit, change one of:");
    }
    for adv in b.advice() {
        if memory_fits && adv.suggested.is_none() {
            continue;
        }
        println!("  - {adv}");
    }
    Ok(ExitCode::from(1))
}

//! `ocrctl build-engines`: TensorRT-RTX engines for one profile, built ahead of time from an
//! export's `--target tensorrt` graphs, on a machine with or without a GPU.
//!
//! ```text
//! ocrctl export --checkpoint CKPT --out out/m --target tensorrt --precision int4-fp16
//! ocrctl build-engines --model out/m --profile 16gb      # writes out/m/trt-rtx/16gb/
//! ocrctl build-engines --model out/m --profile 16gb      # up to date: nothing to do
//! ocrctl build-engines --model out/m --profile 16gb --check
//! ```
//!
//! Each graph gets a serialized engine and an EPContext model naming it; `ocrctl.json`
//! records the set (builder version, targets, profile digest, source digests) so that the
//! runner uses the engines only while they match (see [`ocrctl::runtime::trtrtx::engines`]).

use anyhow::Context;
use clap::Args;
use ocrctl::profile::Profile;
use ocrctl::runtime::trtrtx::{build, engines};
use ocrctl_exporters::export::Manifest;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `ocrctl build-engines`.
#[derive(Args, Debug)]
pub struct BuildEnginesArgs {
    /// Exported model directory (`ocrctl export --target tensorrt`).
    #[arg(long)]
    model: PathBuf,
    /// Profile whose shape ranges, precision and targets the engines are built for.
    #[arg(long)]
    profile: String,
    /// Build even when the recorded engines still match.
    #[arg(long)]
    force: bool,
    /// Build nothing: check that the recorded engines match the profile and export, every
    /// file is intact and every EPContext model holds only EPContext nodes.
    #[arg(long, conflicts_with = "force")]
    check: bool,
}

/// Builds (or checks) the engines; non-zero exit with the reason on failure.
pub fn run(a: BuildEnginesArgs) -> anyhow::Result<ExitCode> {
    let profile = Profile::load(&a.profile).with_context(|| format!("--profile {}", a.profile))?;
    let dir = &a.model;
    let mut m = Manifest::load(dir).with_context(|| format!("--model {}", dir.display()))?;
    let spec = engines::BuildSpec::new(&m, &profile)
        .with_context(|| format!("{} for profile {}", dir.display(), profile.name))?;
    if a.check {
        return check(&m, &spec, dir);
    }
    let (python, version) = build::python()?;
    let current = engines::check(m.engines.get(&profile.name), &spec, Some(&version), dir);
    if current.is_ok() && !a.force {
        println!(
            "{}: TensorRT-RTX engines for profile {} are up to date ({}); nothing to build",
            dir.display(),
            profile.name,
            spec.dir
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Err(why) = &current {
        eprintln!("building: {why}");
    }
    let t = Instant::now();
    let set = build::build(&python, dir, &spec)?;
    let bytes: u64 = set.graphs.values().map(|g| g.engine_bytes).sum();
    println!(
        "{}: built {} TensorRT-RTX {} engines for profile {} ({}) in {:.1} s, {:.1} MiB, in {}",
        dir.display(),
        set.graphs.len(),
        set.builder_version,
        profile.name,
        set.compute_capabilities.join(", "),
        t.elapsed().as_secs_f64(),
        bytes as f64 / (1024.0 * 1024.0),
        spec.dir
    );
    for (part, g) in &set.graphs {
        println!(
            "  {part:<22} {:>10.1} MiB  {:>6.1} s  {}",
            g.engine_bytes as f64 / (1024.0 * 1024.0),
            g.build_seconds,
            g.context_model
        );
    }
    m.engines.insert(profile.name.clone(), set);
    m.save(dir)?;
    Ok(ExitCode::SUCCESS)
}

/// `--check`: the recorded set matches, its engines hash to what was recorded, and its
/// EPContext models are EPContext nodes only.
fn check(
    m: &Manifest,
    spec: &engines::BuildSpec,
    dir: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let set = m.engines.get(&spec.profile);
    engines::check(set, spec, None, dir)?;
    let set = set.expect("check passed");
    let root = dir.join(&set.dir);
    let recorded: Vec<_> = set
        .graphs
        .values()
        .map(|g| ocrctl_exporters::export::SourceFile {
            name: g.engine.clone(),
            bytes: g.engine_bytes,
            sha256: g.engine_sha256.clone(),
        })
        .collect();
    ocrctl_exporters::verify::verify(&root, &recorded, |_| true)?;
    for g in set.graphs.values() {
        engines::check_context_model(&root.join(&g.context_model))?;
    }
    println!(
        "{}: {} TensorRT-RTX {} engines for profile {} match the export and profile; engines intact, EPContext models valid",
        dir.display(),
        set.graphs.len(),
        set.builder_version,
        spec.profile
    );
    Ok(ExitCode::SUCCESS)
}

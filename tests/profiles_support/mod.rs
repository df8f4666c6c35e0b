//! Helpers shared by `tests/profiles.rs` and `tests/profiles_check.rs`: running `ocrctl`
//! without a profiles directory from the environment, the full-size export's measured
//! sizes, a fake export of those sizes, and the built-in profiles.
#![allow(dead_code)]

use ocrctl::profile::{self, Profile, ProfileSource};
use ocrctl_exporters::config::{ModelConfig, LIGHTONOCR_2_1B_CONFIG};
use ocrctl_exporters::export::{Manifest, Precision};
use ocrctl_exporters::graph::GraphInfo;
use ocrctl_exporters::layers::Target;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn ocrctl(args: &[&str], cwd: Option<&Path>, env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ocrctl"));
    c.args(args).env_remove(profile::PROFILES_DIR_ENV);
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("ocrctl runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Sizes measured on `ocrctl export --checkpoint dummy:lightonocr-2-1b`: per part, the
/// `.onnx` file and its external data.
pub fn full_size_graphs(p: Precision) -> [(&'static str, u64, u64); 3] {
    match p {
        Precision::Fp32 => [
            ("decoder_model_merged", 360_597, 2_384_171_008),
            ("embed_tokens", 427, 622_329_856),
            ("vision_encoder", 196_122, 1_644_593_152),
        ],
        Precision::Fp16 => [
            ("decoder_model_merged", 376_756, 1_192_202_240),
            ("embed_tokens", 438, 311_164_928),
            ("vision_encoder", 212_116, 822_403_072),
        ],
        Precision::Int4 => [
            ("decoder_model_merged", 440_299, 372_723_712),
            ("embed_tokens", 476, 311_164_928),
            ("vision_encoder", 268_973, 264_404_992),
        ],
        Precision::Int4Fp16 => [
            ("decoder_model_merged", 456_659, 335_474_688),
            ("embed_tokens", 440, 311_164_928),
            ("vision_encoder", 285_068, 234_545_152),
        ],
    }
}

pub fn full_size_weights(p: Precision) -> u64 {
    full_size_graphs(p).iter().map(|(_, a, b)| a + b).sum()
}

pub fn full_size_config() -> ModelConfig {
    let v: serde_json::Value = serde_json::from_str(LIGHTONOCR_2_1B_CONFIG).unwrap();
    ModelConfig::from_json(&v, Path::new("config.json")).unwrap()
}

/// Writes an export directory holding `ocrctl.json` (full-size LightOnOCR-2-1B config) and
/// `.onnx` files of the measured sizes; the external data is only declared (`data_bytes`).
pub fn fake_export(dir: &Path, precisions: &[Precision], target: Target) {
    std::fs::create_dir_all(dir.join("onnx")).unwrap();
    let mut graphs = BTreeMap::new();
    for &p in precisions {
        let mut parts = BTreeMap::new();
        for (part, onnx_len, data) in full_size_graphs(p) {
            let file = format!("{part}{}.onnx", p.suffix());
            std::fs::write(dir.join("onnx").join(&file), vec![0u8; onnx_len as usize]).unwrap();
            let mut ops = BTreeMap::from([("MatMul".to_string(), 100usize)]);
            if part == "vision_encoder" && target == Target::Ort {
                ops.insert("com.microsoft.MultiHeadAttention".into(), 24);
            }
            parts.insert(
                part.to_string(),
                GraphInfo {
                    data_file: Some(format!("{file}_data")),
                    file,
                    data_bytes: data,
                    inputs: vec![],
                    outputs: vec![],
                    op_counts: ops,
                },
            );
        }
        graphs.insert(p, parts);
    }
    let m = Manifest {
        format: "ocrctl-export/1".into(),
        ocrctl_version: "test".into(),
        source: "fake:lightonocr-2-1b".into(),
        source_dtype: "bf16".into(),
        source_files: vec![],
        checkpoint_digest: "0".repeat(64),
        target,
        ir_version: 10,
        opset: 21,
        precisions: precisions.to_vec(),
        int4: None,
        awq: None,
        model: full_size_config(),
        variant: None,
        graphs,
        files: vec![],
        kv_cache: Default::default(),
        kv_layer_scales: vec![],
        engines: Default::default(),
    };
    std::fs::write(
        dir.join("ocrctl.json"),
        serde_json::to_string_pretty(&m).unwrap(),
    )
    .unwrap();
}

pub fn builtin_profile(name: &str) -> Profile {
    Profile::parse(
        profile::builtin(name).unwrap(),
        ProfileSource::BuiltIn(name.into()),
    )
    .unwrap()
}

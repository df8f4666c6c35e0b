//! `ocrctl export` on a model whose attention heads GroupQueryAttention's kernel cannot take
//! (head_dim 24, 4 query heads over 2 KV heads): the default export writes the merged
//! decoder, says in one line why the gqa one is left out, and `ocrctl ocr` runs on it; asking
//! for `--decoder gqa` is still an error.

mod common;
use common::*;
use ocrctl_exporters::export::{DecoderVariant, Precision};
use ocrctl_exporters::manifest::Manifest;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// The fixture checkpoint with the decoder's heads `head_dim` wide (4 query heads over 2 KV
/// heads as before): config.json edited, the decoder's attention tensors cut to their new
/// shapes (the first values of each; the fixture does not read anyway), the rest as it is.
fn checkpoint_with_head_dim(head_dim: usize) -> (tempfile::TempDir, PathBuf) {
    let (dir, ck) = checkpoint_copy();
    let cfg_path = ck.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    let (heads, kv_heads) = (4, 2);
    assert_eq!(cfg["text_config"]["num_attention_heads"], heads);
    assert_eq!(cfg["text_config"]["num_key_value_heads"], kv_heads);
    cfg["text_config"]["head_dim"] = json!(head_dim);
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();

    let st = ck.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let (mut out_header, mut out_data) = (Map::new(), Vec::new());
    for (name, info) in header {
        if name == "__metadata__" {
            out_header.insert(name, info);
            continue;
        }
        assert_eq!(info["dtype"], "BF16", "{name}");
        let mut shape: Vec<usize> = serde_json::from_value(info["shape"].clone()).unwrap();
        let at: Vec<usize> = serde_json::from_value(info["data_offsets"].clone()).unwrap();
        if name.starts_with("model.language_model.") {
            let suffix = name.rsplit("self_attn.").next().unwrap();
            match suffix {
                "q_proj.weight" => shape[0] = heads * head_dim,
                "k_proj.weight" | "v_proj.weight" => shape[0] = kv_heads * head_dim,
                "o_proj.weight" => shape[1] = heads * head_dim,
                "q_norm.weight" | "k_norm.weight" => shape[0] = head_dim,
                _ => {}
            }
        }
        let len = 2 * shape.iter().product::<usize>();
        assert!(len <= at[1] - at[0], "{name}: cut, never grown");
        let start = out_data.len();
        out_data.extend_from_slice(&data[at[0]..at[0] + len]);
        out_header.insert(
            name,
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, out_data.len()]}),
        );
    }
    let mut head = serde_json::to_vec(&Value::Object(out_header)).unwrap();
    // Header padded with spaces to 8 bytes, as the safetensors writers do.
    head.resize(head.len().div_ceil(8) * 8, b' ');
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&head);
    file.extend_from_slice(&out_data);
    std::fs::write(&st, file).unwrap();
    (dir, ck)
}

#[test]
fn the_default_export_writes_the_decoders_the_heads_allow_and_names_the_one_left_out() {
    let (d, ck) = checkpoint_with_head_dim(24);
    let out = d.path().join("m");
    let o = ocrctl(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("gqa")).collect();
    assert_eq!(notes.len(), 1, "one line:\n{err}");
    assert!(
        notes[0].starts_with("note: no gqa decoder written")
            && notes[0].contains("head_dim 24, 4 heads, 2 KV heads")
            && notes[0].contains("merged"),
        "{err}"
    );
    let m = Manifest::load(&out).unwrap();
    let parts = &m.graphs[&Precision::Fp32];
    assert!(
        parts.contains_key(DecoderVariant::Merged.part()),
        "{parts:?}"
    );
    assert!(!parts.contains_key(DecoderVariant::Gqa.part()), "{parts:?}");
    assert!(out.join("onnx/decoder_model_merged.onnx").is_file());
    assert_eq!(m.model.text.head_dim, 24);

    // `ocrctl ocr` runs on it (the merged decoder), generating every token asked for.
    let img = fixture().join("images/aligned.png");
    let line = ocrctl_ok(&[
        "ocr",
        "--model",
        out.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--json",
        img.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 6, "{v}");

    // Asked for by name, the gqa decoder is still refused, saying why.
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        d.path().join("gqa").to_str().unwrap(),
        "--decoder",
        "gqa",
    ]);
    assert!(
        e.contains("head_dim 24") && e.contains("--decoder merged"),
        "{e}"
    );
    assert!(!d.path().join("gqa").exists());

    // Heads that suit the kernel: both decoders, and no note.
    let both = d.path().join("both");
    let log = export_fixture(&both, &[]);
    assert!(!log.contains("no gqa decoder"), "{log}");
    let parts = &Manifest::load(&both).unwrap().graphs[&Precision::Fp32];
    assert!(parts.contains_key(DecoderVariant::Gqa.part()), "{parts:?}");
}

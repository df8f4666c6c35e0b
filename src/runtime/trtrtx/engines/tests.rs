use super::*;
use ocrctl_exporters::engines::EngineGraph;
use ocrctl_exporters::export::{export, ExportOptions};
use ocrctl_exporters::layers::Target;

const CHECKPOINT: &str = "tests/fixtures/tiny-lightonocr/checkpoint";

fn export_fixture(target: Target) -> (tempfile::TempDir, Manifest) {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let mut o = ExportOptions::new(CHECKPOINT.into(), out.clone());
    o.precisions = vec![Precision::Int4Fp16];
    o.target = target;
    let m = export(&o, &mut |_| {}).unwrap();
    (d, m)
}

fn profile(name: &str) -> Profile {
    Profile::load(name).unwrap()
}

/// A set as `build` would record it for `spec`, with engine files of `n` bytes in `dir`.
fn fake_set(spec: &BuildSpec, dir: &Path, version: &str) -> EngineSet {
    let root = dir.join(&spec.dir);
    std::fs::create_dir_all(&root).unwrap();
    let mut graphs = std::collections::BTreeMap::new();
    for g in &spec.graphs {
        std::fs::write(root.join(format!("{}.engine", g.stem)), vec![7u8; 100]).unwrap();
        std::fs::write(root.join(format!("{}_ctx.onnx", g.stem)), b"x").unwrap();
        graphs.insert(
            g.part.clone(),
            EngineGraph {
                source: g.source.clone(),
                source_digest: g.source_digest.clone(),
                context_model: format!("{}_ctx.onnx", g.stem),
                engine: format!("{}.engine", g.stem),
                engine_bytes: 100,
                engine_sha256: String::new(),
                build_seconds: 0.1,
            },
        );
    }
    EngineSet {
        builder: ocrctl_exporters::engines::TENSORRT_RTX.into(),
        builder_version: version.into(),
        compute_capabilities: spec.compute_capabilities.clone(),
        profile: spec.profile.clone(),
        profile_digest: spec.profile_digest(),
        precision: spec.precision,
        dir: spec.dir.clone(),
        graphs,
    }
}

#[test]
fn the_16gb_spec_builds_the_three_int4_graphs_with_the_profiles_shapes() {
    let (_d, m) = export_fixture(Target::TensorRt);
    let p = profile("16gb");
    let s = BuildSpec::new(&m, &p).unwrap();
    assert_eq!(s.dir, "trt-rtx/16gb");
    assert_eq!(s.compute_capabilities, ["sm86", "sm89", "sm120"]);
    assert_eq!(
        s.workspace_bytes, None,
        "the shipped profiles set no workspace limit"
    );
    let stems: Vec<&str> = s.graphs.iter().map(|g| g.stem.as_str()).collect();
    assert_eq!(
        stems,
        [
            "vision_encoder_q4f16",
            "embed_tokens_q4f16",
            "decoder_model_merged_q4f16"
        ]
    );
    let shapes = trt_shapes(&p, &ModelDims::from_config(&m.model));
    assert_eq!(s.graphs[2].max, shapes.decoder.max);
    assert_eq!(s.graphs[0].opt, shapes.vision_encoder.opt);
    assert!(s.graphs.iter().all(|g| g.source_digest.len() == 64));
    // The digest is stable and follows the values that shape an engine.
    assert_eq!(
        s.profile_digest(),
        BuildSpec::new(&m, &p).unwrap().profile_digest()
    );
    let mut p2 = p.clone();
    p2.max_batch_size += 1;
    assert_ne!(
        s.profile_digest(),
        BuildSpec::new(&m, &p2).unwrap().profile_digest()
    );
    let mut p3 = p.clone();
    p3.tensorrt_rtx.as_mut().unwrap().compute_capabilities = vec!["sm89".into()];
    assert_ne!(
        s.profile_digest(),
        BuildSpec::new(&m, &p3).unwrap().profile_digest()
    );
    // Settings that do not shape an engine leave the digest alone.
    let mut p4 = p.clone();
    p4.queue_size += 1;
    p4.tensorrt_rtx.as_mut().unwrap().cuda_graphs = true;
    assert_eq!(
        s.profile_digest(),
        BuildSpec::new(&m, &p4).unwrap().profile_digest()
    );
}

#[test]
fn specs_are_refused_for_ort_exports_missing_precisions_and_profiles_without_the_section() {
    let (_d, m) = export_fixture(Target::Ort);
    let e = BuildSpec::new(&m, &profile("16gb"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--target tensorrt"), "{e}");
    let (_d2, m2) = export_fixture(Target::TensorRt);
    let e = BuildSpec::new(&m2, &profile("24gb"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no fp16 graphs") && e.contains("--precision fp16"),
        "{e}"
    );
    let e = BuildSpec::new(&m2, &profile("cpu"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no tensorrt_rtx section"), "{e}");
}

#[test]
fn a_recorded_set_is_used_only_while_everything_it_was_built_from_matches() {
    let (d, m) = export_fixture(Target::TensorRt);
    let dir = d.path().join("m");
    let p = profile("16gb");
    let spec = BuildSpec::new(&m, &p).unwrap();
    let e = check(None, &spec, None, &dir).unwrap_err().to_string();
    assert!(
        e.contains("ocrctl build-engines --model") && e.contains("--profile 16gb"),
        "{e}"
    );

    let set = fake_set(&spec, &dir, "1.7.1.116");
    check(Some(&set), &spec, Some("1.7.1"), &dir).unwrap();
    check(Some(&set), &spec, None, &dir).unwrap();
    let models = context_models(&set, &spec, &dir);
    assert_eq!(models.len(), 3);
    assert!(models[0]
        .1
        .ends_with("trt-rtx/16gb/vision_encoder_q4f16_ctx.onnx"));

    // Another TensorRT-RTX release.
    let e = check(Some(&set), &spec, Some("1.8.0"), &dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1.7.1.116") && e.contains("1.8.0"), "{e}");
    // Another profile value.
    let mut p2 = p.clone();
    p2.max_sequence_length /= 2;
    let spec2 = BuildSpec::new(&m, &p2).unwrap();
    let e = check(Some(&set), &spec2, None, &dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("changed since the engines were built"), "{e}");
    // A source graph that changed.
    let mut other = set.clone();
    other
        .graphs
        .get_mut("decoder_model_merged")
        .unwrap()
        .source_digest = "0".repeat(64);
    let e = check(Some(&other), &spec, None, &dir)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("onnx/decoder_model_merged_q4f16.onnx changed since its engine was built"),
        "{e}"
    );
    // A missing or truncated engine.
    let engine = dir.join("trt-rtx/16gb/embed_tokens_q4f16.engine");
    std::fs::write(&engine, [1u8; 10]).unwrap();
    let e = check(Some(&set), &spec, None, &dir)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("embed_tokens_q4f16.engine: 10 bytes, 100 were built"),
        "{e}"
    );
    std::fs::remove_file(&engine).unwrap();
    let e = check(Some(&set), &spec, None, &dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("embed_tokens_q4f16.engine"), "{e}");
}

#[test]
fn releases_compare_on_major_minor_patch() {
    assert!(same_release("1.7.1.116", "1.7.1"));
    assert!(same_release("1.7.1", "1.7.1.2"));
    assert!(!same_release("1.7.1.116", "1.7.2"));
    assert!(!same_release("1.7.1", "1.8.1"));
}

#[test]
fn a_graph_with_ordinary_nodes_is_not_an_epcontext_model() {
    let (d, m) = export_fixture(Target::TensorRt);
    let g = &m.graphs[&Precision::Int4Fp16]["embed_tokens"];
    let path = d.path().join("m/onnx").join(&g.file);
    let e = check_context_model(&path).unwrap_err().to_string();
    assert!(
        e.contains("an EPContext model holds EPContext nodes only"),
        "{e}"
    );
    let junk = d.path().join("junk.onnx");
    std::fs::write(&junk, [0xffu8; 7]).unwrap();
    assert!(check_context_model(&junk)
        .unwrap_err()
        .to_string()
        .contains("not an ONNX model"));
}

/// The messages are those the functions wrote before they had error types.
#[test]
fn errors_say_what_they_said() {
    let e = SpecError::NoPrecision {
        precision: "fp16",
        profile: "24gb".into(),
    };
    assert_eq!(
        e.to_string(),
        "the export has no fp16 graphs, which profile 24gb runs (export with --precision fp16)"
    );
    assert_eq!(
        SpecError::NoDigest("d.onnx".into()).to_string(),
        "the manifest records no digest of onnx/d.onnx (an export older than the digests; \
         export again)"
    );
    let e = Mismatch::NotBuilt {
        profile: "16gb".into(),
        model: PathBuf::from("out/m"),
    };
    assert_eq!(
        e.to_string(),
        "no engines were built for profile 16gb (ocrctl build-engines --model out/m --profile 16gb)"
    );
    let e = Mismatch::Release {
        built: "1.7.1".into(),
        runtime: "1.8.0".into(),
    };
    assert_eq!(
        e.to_string(),
        "the engines were built with TensorRT-RTX 1.7.1 and the plugin bundles 1.8.0; build \
         them again with the same release"
    );
    assert_eq!(
        Mismatch::ProfileChanged("16gb".into()).to_string(),
        "profile 16gb's shape ranges, precision, targets or workspace changed since the engines \
         were built"
    );
    let e = ContextModelError::Weights {
        path: PathBuf::from("c.onnx"),
        count: 2,
    };
    assert_eq!(
        e.to_string(),
        "c.onnx: holds 2 initializers; the weights belong in the engine"
    );
    assert_eq!(
        crate::runtime::trtrtx::build::BuildError::NoPython(2).to_string(),
        "no Python with the TensorRT-RTX builder (tensorrt_rtx_bindings) found (2 tried); \
         install it with scripts/setup.sh --trt-rtx, or set OCRCTL_PYTHON to a python that has \
         tensorrt-rtx-cu13-bindings"
    );
}

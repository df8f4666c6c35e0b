//! Fallbacks of the bound KV path, on the fixture exported once (fp32) for these tests: a
//! decoder whose bound runs fail goes on through host memory with the same results, presents
//! bound to memory the session lacks come back on the host, and a failing repack graph gives
//! way to repacking on the host.

use super::*;
use crate::generation::generate::argmax_and_top_k;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use repack::Repacker;
use std::sync::OnceLock;

pub(super) fn exported() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("tiny");
        let ck =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-lightonocr/checkpoint");
        let opts = ocrctl_exporters::export::ExportOptions::new(
            ck.to_string_lossy().into_owned(),
            out.clone(),
        );
        ocrctl_exporters::export::export(&opts, &mut |_| {}).unwrap();
        (d, out)
    })
    .1
}

pub(super) fn model() -> OrtModel {
    OrtModel::load(exported(), &LoadOptions::new(Precision::Fp32)).unwrap()
}

/// The merged decoder path of `m` (the fixture's default load has no GQA decoder).
fn merged(m: &OrtModel) -> &merged::MergedDecoder {
    match &m.path {
        DecoderPath::Merged(d) => d,
        _ => panic!("the fixture loads the merged decoder"),
    }
}

/// Two sequences prefilled, three batch steps, then the second alone for two steps: every
/// logits vector in order.
fn run(m: &mut OrtModel) -> Vec<Vec<f32>> {
    let mut log = Vec::new();
    let mut seqs = Vec::new();
    for prompt in [&[5u32, 9, 11, 3][..], &[7, 8]] {
        let e = m.embed(prompt).unwrap();
        let (l, c) = m.forward(e, None).unwrap();
        seqs.push((argmax_and_top_k(&l, 0).0, c));
        log.push(l);
    }
    for round in 0..5 {
        if round == 3 {
            seqs.remove(0); // the first sequence leaves
        }
        let (tokens, caches): (Vec<u32>, Vec<OrtCache>) = seqs.drain(..).unzip();
        let (ls, cs) = m.decode_batch(&tokens, caches).unwrap();
        for (l, c) in ls.into_iter().zip(cs) {
            seqs.push((argmax_and_top_k(&l, 0).0, c));
            log.push(l);
        }
    }
    log
}

#[test]
fn a_failing_bound_run_falls_back_to_the_host_path() {
    let reference = run(&mut model());
    let mut m = model();
    binding::tests::FAIL_BINDING.set(true);
    let got = run(&mut m);
    binding::tests::FAIL_BINDING.set(false);
    assert_eq!(got, reference);
    let s = m.kv_stats();
    assert_eq!(m.kv_path(), KvPath::Host, "{s:?}");
    assert!(s.fallback.as_deref().unwrap().contains("injected"), "{s:?}");
    assert_eq!((s.bound_runs, s.host_runs), (0, 7), "{s:?}");
    // On the host path, batch caches are repacked on the host.
    assert_eq!((s.repacks, s.device_repacks), (2, 0), "{s:?}");
}

#[test]
fn presents_bound_to_memory_the_session_lacks_come_back_on_the_host() {
    let reference = run(&mut model());
    let mut m = model();
    // ONNX Runtime honours a binding to a device none of the session's providers has by
    // allocating on the host: logged once, same results.
    m.common.placement.kv = MemoryInfo::new(
        AllocationDevice::CUDA,
        0,
        AllocatorType::Device,
        MemoryType::Default,
    )
    .unwrap();
    let got = run(&mut m);
    assert_eq!(got, reference);
    let s = m.kv_stats();
    assert_eq!((m.kv_path(), s.bound_runs), (KvPath::Bound, 7), "{s:?}");
    assert_eq!(s.kv_location.as_deref(), Some("Cpu:0"));
    assert!(merged(&m).warned_placement);
}

#[test]
fn a_failing_repack_graph_falls_back_to_repacking_on_the_host() {
    let reference = run(&mut model());
    let mut m = model();
    assert!(merged(&m).repacker.is_some());
    // A repack graph for float16 cannot take this model's float32 cache.
    let env = crate::runtime::ortlib::environment(None).unwrap().1;
    let p = Placement::for_provider(Provider::Cpu, 0).unwrap();
    let DecoderPath::Merged(d) = &mut m.path else {
        panic!("the fixture loads the merged decoder")
    };
    d.repacker =
        Some(Repacker::new(&env, Provider::Cpu, 0, DType::F16, &p.kv, &d.decoder).unwrap());
    let got = run(&mut m);
    assert_eq!(got, reference);
    let s = m.kv_stats();
    assert!(merged(&m).repacker.is_none());
    assert_eq!(m.kv_path(), KvPath::Bound, "decoder runs stay bound: {s:?}");
    assert_eq!((s.repacks, s.device_repacks), (2, 0), "{s:?}");
}

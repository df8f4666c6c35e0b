//! A one-Add graph whose 64 KiB weight lives in an aligned external data file (what ONNX
//! Runtime memory-maps when it loads the file itself): built from memory, it answers after
//! the file is truncated, maps no part of it, and ONNX Runtime keeps no pointer into the
//! buffer it was given. Add, not MatMul: a MatMul's weight is prepacked into a copy of ONNX
//! Runtime's own, which would hide a mapping or a pointer into the buffer.

use super::*;
use crate::runtime::ortmodel::{session, LoadOptions};
use ocrctl_exporters::export::Precision;
use ocrctl_exporters::graph::{DType, Dim, Graph};
use ort::session::Session;
use ort::value::Tensor;
use std::path::PathBuf;

const N: usize = 128;

/// `y = x + w` with `w[i][j] = i - j` (external), written to `dir/mm.onnx`.
fn write_graph(dir: &Path) -> PathBuf {
    let mut g = Graph::create(dir, "mm").unwrap();
    let dims = [Dim::Fixed(N as i64), Dim::Fixed(N as i64)];
    let x = g.input("x", DType::F32, &dims);
    let w: Vec<f32> = (0..N * N)
        .map(|k| (k / N) as f32 - (k % N) as f32)
        .collect();
    let w = g
        .weight("w", DType::F32, &[N as i64, N as i64], &w)
        .unwrap();
    let y = g.op("Add", &[&x, &w], &[]);
    g.output(&y, "y", DType::F32, &dims);
    let info = g.finish(&[("", 17)], &[]).unwrap();
    assert_eq!(info.data_file.as_deref(), Some("mm.onnx_data"));
    dir.join("mm.onnx")
}

/// `y` for `x = 0`: `w`.
fn weights_of(s: &mut Session) -> Vec<f32> {
    let x = Tensor::from_array(([N, N], vec![0f32; N * N])).unwrap();
    let out = s.run(ort::inputs!["x" => x]).unwrap();
    out["y"].try_extract_tensor::<f32>().unwrap().1.to_vec()
}

fn expected() -> Vec<f32> {
    (0..N * N)
        .map(|k| (k / N) as f32 - (k % N) as f32)
        .collect()
}

/// Lines of `/proc/self/maps` that map `path`.
fn mappings_of(path: &Path) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = path.to_string_lossy();
    maps.lines()
        .filter(|l| l.ends_with(name.as_ref()))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_session_outlives_its_truncated_weights_file() {
    let d = tempfile::tempdir().unwrap();
    let graph = write_graph(d.path());
    let data = d.path().join("mm.onnx_data");
    let (_, env) = crate::runtime::ortlib::environment(None).unwrap();
    // The hazard: loaded from the file, ONNX Runtime maps it (1.31).
    let mapped = Session::builder(&env)
        .unwrap()
        .commit_from_file(&graph)
        .unwrap();
    assert_ne!(mappings_of(&data), Vec::<String>::new());
    drop(mapped);
    assert_eq!(mappings_of(&data), Vec::<String>::new());
    let opts = LoadOptions::new(Precision::Fp32);
    let mut s = session::build(&env, &graph, &opts, Default::default())
        .unwrap()
        .session;
    assert_eq!(mappings_of(&data), Vec::<String>::new());
    std::fs::File::create(&data).unwrap(); // truncated, as `cp` does first
    assert_eq!(weights_of(&mut s), expected());
    std::fs::write(&data, vec![0xffu8; 1 << 16]).unwrap();
    assert_eq!(weights_of(&mut s), expected());
}

#[test]
fn onnx_runtime_copies_the_weights_it_is_given() {
    let d = tempfile::tempdir().unwrap();
    let graph = write_graph(d.path());
    let ExternalData { name, mut bytes } = read(&graph).unwrap().expect("external data");
    let (_, env) = crate::runtime::ortlib::environment(None).unwrap();
    let build = || -> ort::Result<Session> {
        Session::builder(&env)?
            .with_external_initializer_file_in_memory(&name, bytes.clone())?
            .commit_from_file(&graph)
    };
    let mut s = build().unwrap();
    // The builder (and its clone of the buffer) is gone: scribbling NaNs over the buffer
    // must not reach the session.
    Arc::get_mut(&mut bytes)
        .expect("no one else holds the buffer")
        .fill(0xff);
    drop(bytes);
    assert_eq!(weights_of(&mut s), expected());
}

#[test]
fn a_graph_without_external_data_reads_nothing_and_a_changing_file_is_named() {
    let d = tempfile::tempdir().unwrap();
    assert!(read(&d.path().join("none.onnx")).unwrap().is_none());
    let graph = write_graph(d.path());
    let data = d.path().join("mm.onnx_data");
    let read = read(&graph).unwrap().unwrap();
    assert_eq!(read.name, "mm.onnx_data");
    assert_eq!(
        read.bytes.len() as u64,
        std::fs::metadata(&data).unwrap().len()
    );
    // A directory where the file should be: named, with what went wrong.
    std::fs::remove_file(&data).unwrap();
    std::fs::create_dir(&data).unwrap();
    let e = super::read(&graph).err().unwrap().to_string();
    assert!(
        e.contains("mm.onnx_data") && e.contains("external weights"),
        "{e}"
    );
}

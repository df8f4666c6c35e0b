//! Repacking the padded batch KV cache without leaving the execution provider's memory.
//!
//! A four-input ONNX graph, built at load time and run in its own session on the decoder's
//! device (the CUDA provider for CUDA and TensorRT decoders, the CPU provider otherwise):
//!
//! ```text
//! y = Gather(Concat(fit(a), fit(b), axis 0), rows, axis 0)
//! fit(x) = Slice(Pad(x, left pad of max(p - len(x), 0) on axis 2), last p positions of axis 2)
//! ```
//!
//! Rows are right-aligned in every cache (left padding is masked out), so `fit` keeps each row's
//! data and only changes how much padding is in front of it. Several sources are folded two at
//! a time (`a` is the result so far, `b` the next source; one source is passed as both). The
//! output is bound to a tensor allocated by the decoder session's own allocator for that
//! memory, so the new cache lives in the decoder's arena like the presents it replaces, and the
//! repack session only keeps one tensor's temporaries. Same contract as [`super::kv::pack`].

use super::kv::{BatchKv, KvDims, RowSrc};
use super::tensors::i64_tensor;
use crate::runtime::backend::BackendError;
use crate::runtime::providers::Provider;
use ocrctl_exporters::graph::{Attr, DType, Dim, Graph};
use ocrctl_exporters::ExportError;
use ort::ep;
use ort::memory::{Allocator, MemoryInfo};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{DynTensor, TensorElementType};

const PART: &str = "kv_repack";

/// Why the repack session could not be made (the decoder then repacks through host memory).
#[derive(Debug, thiserror::Error)]
pub(super) enum RepackError {
    /// Writing the graph.
    #[error("{0}")]
    Graph(ExportError),
    /// Its temporary folder.
    #[error("{0}")]
    TempDir(std::io::Error),
    /// The session or its allocator.
    #[error("{0}")]
    Ort(ort::Error),
}

/// The repack session and the decoder-side allocator its outputs are made with.
pub(super) struct Repacker {
    session: Session,
    alloc: Allocator,
    elem: TensorElementType,
}

/// Writes the repack graph for activation type `act` into `dir` as `kv_repack.onnx`.
fn write_graph(dir: &std::path::Path, act: DType) -> Result<std::path::PathBuf, RepackError> {
    let mut g = Graph::create(dir, PART).map_err(RepackError::Graph)?;
    let kv = |n: &str| {
        [
            Dim::named(&format!("{n}_b")),
            Dim::named("h"),
            Dim::named(&format!("{n}_p")),
            Dim::named("d"),
        ]
    };
    let a = g.input("a", act, &kv("a"));
    let b = g.input("b", act, &kv("b"));
    let p = g.input("p", DType::I64, &[Dim::Fixed(1)]);
    let rows = g.input("rows", DType::I64, &[Dim::named("m")]);
    let zero = g.const_i64(&[0]);
    let head = g.const_i64(&[0, 0]);
    let tail = g.const_i64(&[0, 0, 0, 0, 0]);
    let end = g.const_i64(&[i64::MAX]);
    let axis2 = g.const_i64(&[2]);
    let start = g.op("Neg", &[&p], &[]);
    let fit = |g: &mut Graph, x: &ocrctl_exporters::graph::Value| {
        let len = g.op(
            "Shape",
            &[x],
            &[("start", Attr::Int(2)), ("end", Attr::Int(3))],
        );
        let short = g.op("Sub", &[&p, &len], &[]);
        let pad = g.op("Max", &[&short, &zero], &[]);
        let pads = g.op("Concat", &[&head, &pad, &tail], &[("axis", Attr::Int(0))]);
        let padded = g.op("Pad", &[x, &pads], &[]);
        g.op("Slice", &[&padded, &start, &end, &axis2], &[])
    };
    let fa = fit(&mut g, &a);
    let fb = fit(&mut g, &b);
    let cat = g.op("Concat", &[&fa, &fb], &[("axis", Attr::Int(0))]);
    let y = g.op("Gather", &[&cat, &rows], &[("axis", Attr::Int(0))]);
    let out = [
        Dim::named("m"),
        Dim::named("h"),
        Dim::named("p"),
        Dim::named("d"),
    ];
    g.output(&y, "y", act, &out);
    g.finish(&[("", 21)], &[]).map_err(RepackError::Graph)?;
    Ok(dir.join(format!("{PART}.onnx")))
}

impl Repacker {
    /// The repack session for a decoder on `provider` whose KV cache is in `kv` memory;
    /// `alloc_from` is the decoder session.
    pub fn new(
        env: &ort::environment::Environment,
        provider: Provider,
        device_id: i32,
        act: DType,
        kv: &MemoryInfo<'static>,
        alloc_from: &Session,
    ) -> Result<Repacker, RepackError> {
        let dir = tempfile::tempdir().map_err(RepackError::TempDir)?;
        let path = write_graph(dir.path(), act)?;
        let build = || -> ort::Result<Session> {
            let mut b = Session::builder(env)?
                .with_optimization_level(GraphOptimizationLevel::All)?
                .with_log_level(ort::logging::LogLevel::Error)?
                .with_intra_threads(1)?;
            if provider.is_gpu() {
                // CUDA for TensorRT decoders too: TensorRT would build engines per shape.
                b = b.with_execution_providers([ep::CUDA::default()
                    .with_device_id(device_id)
                    .with_arena_extend_strategy(ep::ArenaExtendStrategy::SameAsRequested)
                    .build()
                    .error_on_failure()])?;
            }
            b.commit_from_file(&path)
        };
        let session = build().map_err(RepackError::Ort)?;
        let alloc = Allocator::new(alloc_from, kv.clone()).map_err(RepackError::Ort)?;
        let elem = super::tensors::element_type(act);
        Ok(Repacker {
            session,
            alloc,
            elem,
        })
    }

    /// One run: `y = Gather(Concat(fit(a), fit(b)), rows)` into a new `[rows, h, p, d]`
    /// tensor of the decoder's allocator.
    fn run(
        &mut self,
        a: &DynTensor,
        b: &DynTensor,
        p: usize,
        rows: &[i64],
    ) -> Result<DynTensor, BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        let (h, d) = (a.shape()[1], a.shape()[3]);
        let mut y = DynTensor::new(&self.alloc, self.elem, [rows.len() as i64, h, p as i64, d])
            .map_err(rt)?;
        let mut bind = self.session.create_binding().map_err(rt)?;
        bind.bind_input("a", a).map_err(rt)?;
        bind.bind_input("b", b).map_err(rt)?;
        bind.bind_input("p", &i64_tensor(vec![1], vec![p as i64], PART)?)
            .map_err(rt)?;
        bind.bind_input(
            "rows",
            &i64_tensor(vec![rows.len() as i64], rows.to_vec(), PART)?,
        )
        .map_err(rt)?;
        bind.bind_output("y", &mut y).map_err(rt)?;
        bind.synchronize_inputs().map_err(rt)?;
        self.session.run_binding(&bind).map_err(rt)?;
        drop(bind);
        Ok(y)
    }

    /// Builds the padded cache `[rows, kv_heads, p, head_dim]` per tensor in the decoder's
    /// memory; see [`super::kv::pack`] for the layout.
    pub fn pack(
        &mut self,
        rows: &[(RowSrc, usize)],
        old: Option<&BatchKv>,
        p: usize,
        d: KvDims,
    ) -> Result<Vec<DynTensor>, BackendError> {
        if let Some((_, l)) = rows.iter().find(|r| r.1 > p) {
            return Err(BackendError::Invalid(format!(
                "KV repack: row of {l} positions does not fit {p}"
            )));
        }
        // Sources in concatenation order: the old batch (if any row comes from it), then
        // each own cache; `index` is each new row's row in the concatenation.
        let from_old = rows.iter().any(|r| matches!(r.0, RowSrc::Batch(_)));
        let old_rows = match old {
            Some(o) if from_old => o.ids.len(),
            _ => 0,
        };
        let mut next = old_rows;
        let index: Vec<i64> = rows
            .iter()
            .map(|(src, _)| match src {
                RowSrc::Batch(r) => *r as i64,
                RowSrc::Own(_) => {
                    next += 1;
                    (next - 1) as i64
                }
            })
            .collect();
        let mut out = Vec::with_capacity(d.tensors);
        for j in 0..d.tensors {
            let mut sources: Vec<&DynTensor> = Vec::new();
            if let (Some(o), true) = (old, from_old) {
                sources.push(&o.kv[j]);
            }
            for (src, _) in rows {
                if let RowSrc::Own(kv) = src {
                    sources.push(&kv[j]);
                }
            }
            let y = match sources.as_slice() {
                [] => unreachable!("a repack has at least one row"),
                [only] => self.run(only, only, p, &index)?,
                [first, rest @ ..] => {
                    let mut acc: Option<DynTensor> = None;
                    let mut count = first.shape()[0];
                    for (k, s) in rest.iter().enumerate() {
                        count += s.shape()[0];
                        let rows_k: Vec<i64> = if k + 1 == rest.len() {
                            index.clone()
                        } else {
                            (0..count).collect()
                        };
                        let a = acc.as_ref().unwrap_or(*first);
                        acc = Some(self.run(a, s, p, &rows_k)?);
                    }
                    acc.expect("at least two sources")
                }
            };
            out.push(y);
        }
        Ok(out)
    }
}

//! `embed_tokens.onnx`: `input_ids [B, S]` (int64) → `inputs_embeds [B, S, hidden]`.
//!
//! A single `Gather` over `model.language_model.embed_tokens.weight`. The runner replaces
//! the rows at image-token positions with the vision encoder's features.

use crate::checkpoint::Weights;
use crate::config::ModelConfig;
use crate::contract::tensor;
use crate::graph::{Attr, DType, Dim, Graph};
use crate::layers::Emit;
use crate::ExportError;

/// Name of the token embedding tensor.
pub const EMBED: &str = "model.language_model.embed_tokens.weight";

/// Builds `<dir>/<stem>.onnx`.
pub fn build(
    dir: &std::path::Path,
    stem: &str,
    cfg: &ModelConfig,
    w: &dyn Weights,
    e: Emit,
) -> Result<crate::graph::GraphInfo, ExportError> {
    let (v, d) = (cfg.text.vocab_size, cfg.text.hidden_size);
    let mut g = Graph::create(dir, stem)?;
    let ids = g.input(
        tensor::INPUT_IDS,
        DType::I64,
        &[Dim::named("batch_size"), Dim::named("sequence_length")],
    );
    let table = w.get(EMBED, &[v, d])?;
    // With INT4 exports the table stays 16-bit (a gather reads few rows; int4 would need a
    // contrib op) and float32 graphs cast the gathered rows.
    let store = if e.quant.is_some() { DType::F16 } else { e.act };
    let table = g.weight(EMBED, store, &[v as i64, d as i64], &table)?;
    let out = g.op("Gather", &[&table, &ids], &[("axis", Attr::Int(0))]);
    let out = crate::layers::cast(&mut g, &out, store, e.act);
    g.output(
        &out,
        tensor::INPUTS_EMBEDS,
        e.act,
        &[
            Dim::named("batch_size"),
            Dim::named("sequence_length"),
            Dim::Fixed(d as i64),
        ],
    );
    g.finish(&[("", e.opset())], &[])
}

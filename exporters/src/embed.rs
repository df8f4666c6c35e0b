//! `embed_tokens.onnx`: `input_ids [B, S]` (int64) → `inputs_embeds [B, S, hidden]`.
//!
//! A single `Gather` over `model.language_model.embed_tokens.weight`. The runner replaces
//! the rows at image-token positions with the vision encoder's features.

use crate::checkpoint::Weights;
use crate::config::ModelConfig;
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
        "input_ids",
        DType::I64,
        &[Dim::named("batch_size"), Dim::named("sequence_length")],
    );
    let table = w.get(EMBED, &[v, d])?;
    let table = g.weight(EMBED, e.act, &[v as i64, d as i64], &table)?;
    let out = g.op("Gather", &[&table, &ids], &[("axis", Attr::Int(0))]);
    g.output(
        &out,
        "inputs_embeds",
        e.act,
        &[
            Dim::named("batch_size"),
            Dim::named("sequence_length"),
            Dim::Fixed(d as i64),
        ],
    );
    g.finish(&[("", 21)], &[])
}

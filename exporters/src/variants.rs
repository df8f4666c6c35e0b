//! What an export is made of: the weight precisions ([`Precision`]) and decoder graphs
//! ([`DecoderVariant`]) it holds, with the names flags, files and the manifest use.

use crate::contract::graph;
use crate::graph::DType;
use crate::ExportError;
use serde::{Deserialize, Serialize};

/// Weight precision of an exported graph set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// float32 weights and activations (file suffix ``).
    Fp32,
    /// float16 weights and activations, float32 logits (suffix `_fp16`).
    Fp16,
    /// INT4 Linear weights, float32 activations (suffix `_q4`).
    Int4,
    /// INT4 Linear weights, float16 activations (suffix `_q4f16`).
    #[serde(rename = "int4-fp16")]
    Int4Fp16,
}

impl Precision {
    /// The onnx-community file-name suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            Precision::Fp32 => "",
            Precision::Fp16 => "_fp16",
            Precision::Int4 => "_q4",
            Precision::Int4Fp16 => "_q4f16",
        }
    }

    /// Activation dtype.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Fp32 | Precision::Int4 => DType::F32,
            Precision::Fp16 | Precision::Int4Fp16 => DType::F16,
        }
    }

    /// Whether Linear weights are INT4.
    pub fn is_int4(self) -> bool {
        matches!(self, Precision::Int4 | Precision::Int4Fp16)
    }

    /// Parses `fp32` / `fp16`.
    pub fn parse(s: &str) -> Result<Precision, ExportError> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "fp16" => Ok(Precision::Fp16),
            "int4" => Ok(Precision::Int4),
            "int4-fp16" => Ok(Precision::Int4Fp16),
            other => Err(ExportError::Invalid(format!(
                "unknown precision `{other}` (expected fp32, fp16, int4 or int4-fp16)"
            ))),
        }
    }

    /// `fp32` / `fp16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Int4 => "int4",
            Precision::Int4Fp16 => "int4-fp16",
        }
    }
}

/// Which decoder graph (a part of the manifest's `graphs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderVariant {
    /// `decoder_model_merged`: past + new keys concatenated each step (any ONNX runtime,
    /// TensorRT too; the onnx-community layout).
    Merged,
    /// `decoder_model_gqa`: GroupQueryAttention over a fixed-size cache updated in place
    /// (ONNX Runtime only; see [`crate::decoder_gqa`]).
    Gqa,
    /// `decoder_model_paged`: PagedAttention over a KV cache in blocks (ONNX Runtime's CUDA
    /// provider only, float16; see [`crate::decoder_paged`]).
    Paged,
}

impl DecoderVariant {
    /// `merged`, `gqa` or `paged`.
    pub fn parse(s: &str) -> Result<DecoderVariant, ExportError> {
        match s.trim() {
            "merged" => Ok(DecoderVariant::Merged),
            "gqa" => Ok(DecoderVariant::Gqa),
            "paged" => Ok(DecoderVariant::Paged),
            other => Err(ExportError::Invalid(format!(
                "unknown decoder `{other}` (expected merged, gqa or paged)"
            ))),
        }
    }

    /// The manifest part name (`decoder_model_merged`, `decoder_gqa`, `decoder_paged`).
    pub fn part(self) -> &'static str {
        match self {
            DecoderVariant::Merged => graph::DECODER_MERGED,
            DecoderVariant::Gqa => "decoder_gqa",
            DecoderVariant::Paged => "decoder_paged",
        }
    }

    /// The name `--decoder` takes.
    pub fn name(self) -> &'static str {
        match self {
            DecoderVariant::Merged => "merged",
            DecoderVariant::Gqa => "gqa",
            DecoderVariant::Paged => "paged",
        }
    }

    /// The graph's file stem without the precision suffix.
    pub fn stem(self) -> &'static str {
        match self {
            DecoderVariant::Merged => graph::DECODER_MERGED,
            DecoderVariant::Gqa => graph::DECODER_GQA,
            DecoderVariant::Paged => graph::DECODER_PAGED,
        }
    }
}

//! [`DType`]: the element types ocrctl writes into graphs, with their ONNX codes, manifest
//! names and float encodings (re-exported as `graph::DType`).

use half::f16;

/// Element types ocrctl writes (values are `TensorProto.DataType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
    Bool,
    U8,
    /// Signed 4-bit integers, two per byte.
    I4,
    /// Signed 8-bit integers (an 8-bit KV cache).
    I8,
    /// float8 E4M3 (finite only; an 8-bit KV cache).
    F8E4M3,
}

impl DType {
    /// The `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i64 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::BF16 => 16,
            DType::I4 => 22,
            DType::I8 => 3,
            DType::F8E4M3 => 17,
        }
    }

    /// Lower-case name used in manifests (`float32`, `float16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I4 => "int4",
            DType::I8 => "int8",
            DType::F8E4M3 => "float8e4m3fn",
        }
    }

    /// Encodes `values` as little-endian bytes of this (floating) type.
    pub fn encode_floats(self, values: &[f32]) -> Vec<u8> {
        match self {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            other => panic!("encode_floats called with non-float type {other:?}"),
        }
    }
}

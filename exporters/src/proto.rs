//! A minimal protobuf encoder for the subset of `onnx.proto` that ocrctl writes.
//!
//! ONNX files are protobuf messages (`ModelProto`). Only encoding is needed, and only a
//! handful of message types, so rather than pulling in a code generator this module writes
//! the wire format by hand: varints, length-delimited fields and packed repeated integers.
//! Field numbers follow `onnx/onnx.proto` (IR version 10) and are named below, one
//! constant per field written or read (`<MESSAGE>_<FIELD>`), with the enum values used.
//!
//! ```
//! use ocrctl_exporters::proto::{Encoder, MODEL_IR_VERSION};
//! let mut e = Encoder::default();
//! e.int64(MODEL_IR_VERSION, 10); // ModelProto.ir_version = 10
//! assert_eq!(e.into_bytes(), vec![0x08, 0x0a]);
//! ```

// ModelProto.
/// `ModelProto.ir_version` (int64).
pub const MODEL_IR_VERSION: u32 = 1;
/// `ModelProto.producer_name` (string).
pub const MODEL_PRODUCER_NAME: u32 = 2;
/// `ModelProto.producer_version` (string).
pub const MODEL_PRODUCER_VERSION: u32 = 3;
/// `ModelProto.graph` (GraphProto).
pub const MODEL_GRAPH: u32 = 7;
/// `ModelProto.opset_import` (repeated OperatorSetIdProto).
pub const MODEL_OPSET_IMPORT: u32 = 8;
/// `ModelProto.metadata_props` (repeated StringStringEntryProto).
pub const MODEL_METADATA_PROPS: u32 = 14;

// OperatorSetIdProto.
/// `OperatorSetIdProto.domain` (string).
pub const OPSET_ID_DOMAIN: u32 = 1;
/// `OperatorSetIdProto.version` (int64).
pub const OPSET_ID_VERSION: u32 = 2;

// StringStringEntryProto.
/// `StringStringEntryProto.key` (string).
pub const STRING_ENTRY_KEY: u32 = 1;
/// `StringStringEntryProto.value` (string).
pub const STRING_ENTRY_VALUE: u32 = 2;

// GraphProto.
/// `GraphProto.node` (repeated NodeProto).
pub const GRAPH_NODE: u32 = 1;
/// `GraphProto.name` (string).
pub const GRAPH_NAME: u32 = 2;
/// `GraphProto.initializer` (repeated TensorProto).
pub const GRAPH_INITIALIZER: u32 = 5;
/// `GraphProto.input` (repeated ValueInfoProto).
pub const GRAPH_INPUT: u32 = 11;
/// `GraphProto.output` (repeated ValueInfoProto).
pub const GRAPH_OUTPUT: u32 = 12;

// NodeProto.
/// `NodeProto.input` (repeated string).
pub const NODE_INPUT: u32 = 1;
/// `NodeProto.output` (repeated string).
pub const NODE_OUTPUT: u32 = 2;
/// `NodeProto.name` (string).
pub const NODE_NAME: u32 = 3;
/// `NodeProto.op_type` (string).
pub const NODE_OP_TYPE: u32 = 4;
/// `NodeProto.attribute` (repeated AttributeProto).
pub const NODE_ATTRIBUTE: u32 = 5;
/// `NodeProto.domain` (string).
pub const NODE_DOMAIN: u32 = 7;

// AttributeProto.
/// `AttributeProto.name` (string).
pub const ATTRIBUTE_NAME: u32 = 1;
/// `AttributeProto.f` (float).
pub const ATTRIBUTE_F: u32 = 2;
/// `AttributeProto.i` (int64).
pub const ATTRIBUTE_I: u32 = 3;
/// `AttributeProto.s` (bytes).
pub const ATTRIBUTE_S: u32 = 4;
/// `AttributeProto.ints` (repeated int64).
pub const ATTRIBUTE_INTS: u32 = 8;
/// `AttributeProto.type` (AttributeType).
pub const ATTRIBUTE_TYPE: u32 = 20;
/// `AttributeProto.AttributeType.FLOAT`.
pub const ATTRIBUTE_TYPE_FLOAT: i64 = 1;
/// `AttributeProto.AttributeType.INT`.
pub const ATTRIBUTE_TYPE_INT: i64 = 2;
/// `AttributeProto.AttributeType.STRING`.
pub const ATTRIBUTE_TYPE_STRING: i64 = 3;
/// `AttributeProto.AttributeType.INTS`.
pub const ATTRIBUTE_TYPE_INTS: i64 = 7;

// TensorProto.
/// `TensorProto.dims` (repeated int64).
pub const TENSOR_DIMS: u32 = 1;
/// `TensorProto.data_type` (int32, a `TensorProto.DataType`).
pub const TENSOR_DATA_TYPE: u32 = 2;
/// `TensorProto.name` (string).
pub const TENSOR_NAME: u32 = 8;
/// `TensorProto.raw_data` (bytes).
pub const TENSOR_RAW_DATA: u32 = 9;
/// `TensorProto.external_data` (repeated StringStringEntryProto).
pub const TENSOR_EXTERNAL_DATA: u32 = 13;
/// `TensorProto.data_location` (DataLocation).
pub const TENSOR_DATA_LOCATION: u32 = 14;
/// `TensorProto.DataLocation.EXTERNAL`.
pub const TENSOR_DATA_LOCATION_EXTERNAL: i64 = 1;

// ValueInfoProto.
/// `ValueInfoProto.name` (string).
pub const VALUE_INFO_NAME: u32 = 1;
/// `ValueInfoProto.type` (TypeProto).
pub const VALUE_INFO_TYPE: u32 = 2;

// TypeProto and TypeProto.Tensor.
/// `TypeProto.tensor_type` (TypeProto.Tensor).
pub const TYPE_TENSOR_TYPE: u32 = 1;
/// `TypeProto.Tensor.elem_type` (int32, a `TensorProto.DataType`).
pub const TYPE_TENSOR_ELEM_TYPE: u32 = 1;
/// `TypeProto.Tensor.shape` (TensorShapeProto).
pub const TYPE_TENSOR_SHAPE: u32 = 2;

// TensorShapeProto and TensorShapeProto.Dimension.
/// `TensorShapeProto.dim` (repeated TensorShapeProto.Dimension).
pub const TENSOR_SHAPE_DIM: u32 = 1;
/// `TensorShapeProto.Dimension.dim_value` (int64).
pub const DIMENSION_DIM_VALUE: u32 = 1;
/// `TensorShapeProto.Dimension.dim_param` (string).
pub const DIMENSION_DIM_PARAM: u32 = 2;

/// Appends protobuf fields to a byte buffer.
#[derive(Default, Debug, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

const WIRE_VARINT: u32 = 0;
const WIRE_LEN: u32 = 2;
const WIRE_FIXED32: u32 = 5;

impl Encoder {
    /// The encoded bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u32) {
        self.varint(((field << 3) | wire) as u64);
    }

    /// An `int64`/`int32`/enum field (negative values use ten bytes, as protobuf requires).
    pub fn int64(&mut self, field: u32, v: i64) {
        self.key(field, WIRE_VARINT);
        self.varint(v as u64);
    }

    /// A `float` field.
    pub fn float(&mut self, field: u32, v: f32) {
        self.key(field, WIRE_FIXED32);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A `bytes` field.
    pub fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, WIRE_LEN);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// A `string` field.
    pub fn string(&mut self, field: u32, v: &str) {
        self.bytes(field, v.as_bytes());
    }

    /// An embedded message field.
    pub fn message(&mut self, field: u32, m: Encoder) {
        self.bytes(field, &m.buf);
    }

    /// A packed `repeated int64` field.
    pub fn packed_int64(&mut self, field: u32, vs: &[i64]) {
        let mut inner = Encoder::default();
        for &v in vs {
            inner.varint(v as u64);
        }
        self.bytes(field, &inner.buf);
    }

    /// A packed `repeated float` field.
    pub fn packed_float(&mut self, field: u32, vs: &[f32]) {
        let mut raw = Vec::with_capacity(vs.len() * 4);
        for v in vs {
            raw.extend_from_slice(&v.to_le_bytes());
        }
        self.bytes(field, &raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_negative_ints_follow_the_wire_format() {
        let mut e = Encoder::default();
        e.int64(3, 300);
        e.int64(3, -1);
        let b = e.into_bytes();
        assert_eq!(&b[..3], &[0x18, 0xac, 0x02]);
        assert_eq!(b[3], 0x18);
        assert_eq!(
            &b[4..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }

    #[test]
    fn strings_and_packed_fields_are_length_delimited() {
        let mut e = Encoder::default();
        e.string(4, "Add");
        e.packed_int64(1, &[1, 2, 150]);
        assert_eq!(
            e.into_bytes(),
            vec![0x22, 3, b'A', b'd', b'd', 0x0a, 4, 1, 2, 0x96, 0x01]
        );
    }
}

/// A minimal reader for the same wire format, enough to inspect a model ONNX Runtime has
/// written (e.g. which ops its optimiser produced). Unknown fields are skipped.
pub mod read {
    use super::{
        GRAPH_INITIALIZER, GRAPH_NODE, MODEL_GRAPH, NODE_DOMAIN, NODE_OP_TYPE, TENSOR_DATA_TYPE,
        TENSOR_DIMS, TENSOR_NAME,
    };

    /// One decoded field: number and payload.
    #[derive(Debug, Clone, Copy)]
    pub enum Field<'a> {
        Varint(u32, u64),
        Bytes(u32, &'a [u8]),
        Fixed(u32),
    }

    fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*pos)?;
            *pos += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// Decodes the top-level fields of one message; `None` on malformed input.
    pub fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < b.len() {
            let key = varint(b, &mut pos)?;
            let (num, wire) = ((key >> 3) as u32, key & 7);
            match wire {
                0 => out.push(Field::Varint(num, varint(b, &mut pos)?)),
                1 => {
                    pos += 8;
                    out.push(Field::Fixed(num));
                }
                2 => {
                    let len = varint(b, &mut pos)? as usize;
                    let end = pos.checked_add(len).filter(|e| *e <= b.len())?;
                    out.push(Field::Bytes(num, &b[pos..end]));
                    pos = end;
                }
                5 => {
                    pos += 4;
                    out.push(Field::Fixed(num));
                }
                _ => return None,
            }
        }
        (pos == b.len()).then_some(out)
    }

    /// A node's domain and operator type.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct NodeSummary {
        pub domain: String,
        pub op_type: String,
    }

    /// An initializer's name, `TensorProto.DataType` code and element count.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct InitSummary {
        pub name: String,
        pub data_type: i64,
        pub elements: u64,
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// Nodes and initializers of the main graph of a serialized `ModelProto`.
    pub fn summarize(model: &[u8]) -> Option<(Vec<NodeSummary>, Vec<InitSummary>)> {
        let graph = fields(model)?.into_iter().find_map(|f| match f {
            Field::Bytes(MODEL_GRAPH, g) => Some(g),
            _ => None,
        })?;
        let (mut nodes, mut inits) = (Vec::new(), Vec::new());
        for f in fields(graph)? {
            match f {
                Field::Bytes(GRAPH_NODE, n) => {
                    let mut s = NodeSummary {
                        domain: String::new(),
                        op_type: String::new(),
                    };
                    for nf in fields(n)? {
                        match nf {
                            Field::Bytes(NODE_OP_TYPE, v) => s.op_type = text(v),
                            Field::Bytes(NODE_DOMAIN, v) => s.domain = text(v),
                            _ => {}
                        }
                    }
                    nodes.push(s);
                }
                Field::Bytes(GRAPH_INITIALIZER, t) => {
                    let mut s = InitSummary {
                        name: String::new(),
                        data_type: 0,
                        elements: 1,
                    };
                    for tf in fields(t)? {
                        match tf {
                            Field::Bytes(TENSOR_NAME, v) => s.name = text(v),
                            Field::Varint(TENSOR_DATA_TYPE, v) => s.data_type = v as i64,
                            Field::Varint(TENSOR_DIMS, d) => s.elements *= d,
                            Field::Bytes(TENSOR_DIMS, packed) => {
                                let mut p = 0;
                                while p < packed.len() {
                                    s.elements *= varint(packed, &mut p)?;
                                }
                            }
                            _ => {}
                        }
                    }
                    inits.push(s);
                }
                _ => {}
            }
        }
        Some((nodes, inits))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::graph::{DType, Dim, Graph};

        #[test]
        fn a_written_graph_reads_back() {
            let d = tempfile::tempdir().unwrap();
            let mut g = Graph::create(d.path(), "m").unwrap();
            let x = g.input("x", DType::F32, &[Dim::Fixed(2)]);
            let w = g
                .weight("w", DType::F32, &[2, 300], &vec![0.5; 600])
                .unwrap();
            let y = g.op("MatMul", &[&x, &w], &[]);
            let y = g.op_in("com.microsoft", "Gelu", &[&y], &[]);
            g.output(&y, "y", DType::F32, &[Dim::Fixed(300)]);
            g.finish(&[("", 21)], &[]).unwrap();
            let bytes = std::fs::read(d.path().join("m.onnx")).unwrap();
            let (nodes, inits) = summarize(&bytes).unwrap();
            let ops: Vec<_> = nodes
                .iter()
                .map(|n| (n.domain.as_str(), n.op_type.as_str()))
                .collect();
            assert_eq!(
                ops,
                vec![("", "MatMul"), ("com.microsoft", "Gelu"), ("", "Identity")]
            );
            assert_eq!(
                inits,
                vec![InitSummary {
                    name: "w".into(),
                    data_type: 1,
                    elements: 600
                }]
            );
        }
    }
}

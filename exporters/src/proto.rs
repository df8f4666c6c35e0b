//! A minimal protobuf encoder for the subset of `onnx.proto` that ocrctl writes.
//!
//! ONNX files are protobuf messages (`ModelProto`). Only encoding is needed, and only a
//! handful of message types, so rather than pulling in a code generator this module writes
//! the wire format by hand: varints, length-delimited fields and packed repeated integers.
//! Field numbers follow `onnx/onnx.proto3` (IR version 10).
//!
//! ```
//! use ocrctl_exporters::proto::Encoder;
//! let mut e = Encoder::default();
//! e.int64(1, 10); // ModelProto.ir_version = 10
//! assert_eq!(e.into_bytes(), vec![0x08, 0x0a]);
//! ```

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

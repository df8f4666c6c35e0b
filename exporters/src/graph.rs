//! A small typed ONNX graph builder that streams weights to an external-data file.
//!
//! [`Graph`] collects nodes, inputs and outputs in memory and writes every large
//! initializer straight to `<model>.onnx_data` as it is created, so exporting a model
//! never holds all of its weights at once. [`Graph::finish`] writes the `ModelProto`
//! (IR version 10) with the external-data references.
//!
//! ```no_run
//! use ocrctl_exporters::graph::{Graph, DType, Dim};
//! let dir = std::path::Path::new("/tmp/g");
//! let mut g = Graph::create(dir, "add").unwrap();
//! let x = g.input("x", DType::F32, &[Dim::named("n")]);
//! let one = g.scalar(DType::F32, 1.0);
//! let y = g.op("Add", &[&x, &one], &[]);
//! g.output(&y, "y", DType::F32, &[Dim::named("n")]);
//! g.finish(&[("", 21)], &[]).unwrap();
//! ```

use crate::proto::*;
use crate::ExportError;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// ONNX IR version written into every model.
pub const IR_VERSION: i64 = 10;
/// IR version of graphs whose default-domain opset is 23 or later (ONNX requires 11).
pub const IR_VERSION_OPSET_23: i64 = 11;

/// The IR version a graph with these opsets needs.
pub fn ir_version_for(opsets: &[(&str, i64)]) -> i64 {
    if opsets.iter().any(|(d, v)| d.is_empty() && *v >= 23) {
        IR_VERSION_OPSET_23
    } else {
        IR_VERSION
    }
}
/// Initializers at least this large go to the external-data file.
pub const EXTERNAL_THRESHOLD: usize = 1024;
/// Alignment of tensors in the external-data file (lets ONNX Runtime map them).
pub const EXTERNAL_ALIGN: u64 = 4096;

pub use crate::dtype::DType;

/// One dimension of a graph input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(i64),
    Named(String),
}

impl Dim {
    /// A symbolic dimension such as `batch_size`.
    pub fn named(s: &str) -> Dim {
        Dim::Named(s.to_string())
    }
}

/// A handle to a tensor in the graph (its name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value(String);

impl Value {
    /// The tensor's name in the graph.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// An optional input left out (ONNX's empty name), for inputs before one that is given.
    pub fn absent() -> Value {
        Value(String::new())
    }
}

/// A node attribute value.
#[derive(Debug, Clone)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Ints(Vec<i64>),
    Str(String),
}

struct Node {
    op: String,
    domain: String,
    name: String,
    inputs: Vec<String>,
    outputs: Vec<String>,
    attrs: Vec<(String, Attr)>,
}

enum Location {
    Inline(Vec<u8>),
    External { offset: u64, length: u64 },
}

struct Initializer {
    name: String,
    dtype: DType,
    dims: Vec<i64>,
    location: Location,
}

struct ValueInfo {
    name: String,
    dtype: DType,
    dims: Vec<Dim>,
}

/// An ONNX graph under construction, bound to `<dir>/<name>.onnx` and its data file.
pub struct Graph {
    dir: PathBuf,
    file_stem: String,
    data_name: String,
    data: Option<BufWriter<File>>,
    data_len: u64,
    nodes: Vec<Node>,
    inits: Vec<Initializer>,
    inputs: Vec<ValueInfo>,
    outputs: Vec<ValueInfo>,
    scope: Vec<String>,
    counter: usize,
}

impl Graph {
    /// Starts a graph that will be written as `<dir>/<file_stem>.onnx` with weights in
    /// `<dir>/<file_stem>.onnx_data`.
    pub fn create(dir: &Path, file_stem: &str) -> Result<Graph, ExportError> {
        Ok(Graph {
            dir: dir.to_path_buf(),
            file_stem: file_stem.to_string(),
            data_name: format!("{file_stem}.onnx_data"),
            data: None,
            data_len: 0,
            nodes: Vec::new(),
            inits: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            scope: Vec::new(),
            counter: 0,
        })
    }

    /// Runs `f` with node names prefixed by `name/` (e.g. `layers.3/attn`).
    pub fn scoped<R>(&mut self, name: &str, f: impl FnOnce(&mut Graph) -> R) -> R {
        self.scope.push(name.to_string());
        let r = f(self);
        self.scope.pop();
        r
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.counter += 1;
        if self.scope.is_empty() {
            format!("{hint}_{}", self.counter)
        } else {
            format!("{}/{hint}_{}", self.scope.join("/"), self.counter)
        }
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, dtype: DType, dims: &[Dim]) -> Value {
        self.inputs.push(ValueInfo {
            name: name.to_string(),
            dtype,
            dims: dims.to_vec(),
        });
        Value(name.to_string())
    }

    /// Declares `v` as a graph output called `name` (through an `Identity` when renamed).
    pub fn output(&mut self, v: &Value, name: &str, dtype: DType, dims: &[Dim]) {
        if v.0 != name {
            self.push_node("Identity", "", &[v], vec![name.to_string()], &[]);
        }
        self.outputs.push(ValueInfo {
            name: name.to_string(),
            dtype,
            dims: dims.to_vec(),
        });
    }

    fn push_node(
        &mut self,
        op: &str,
        domain: &str,
        inputs: &[&Value],
        outputs: Vec<String>,
        attrs: &[(&str, Attr)],
    ) {
        let name = self.fresh(op);
        self.nodes.push(Node {
            op: op.to_string(),
            domain: domain.to_string(),
            name,
            inputs: inputs.iter().map(|v| v.0.clone()).collect(),
            outputs,
            attrs: attrs
                .iter()
                .map(|(k, a)| (k.to_string(), a.clone()))
                .collect(),
        });
    }

    /// Adds a standard-domain node with one output.
    pub fn op(&mut self, op: &str, inputs: &[&Value], attrs: &[(&str, Attr)]) -> Value {
        self.op_in("", op, inputs, attrs)
    }

    /// Adds a node of `domain` (e.g. `com.microsoft`) with one output.
    pub fn op_in(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&Value],
        attrs: &[(&str, Attr)],
    ) -> Value {
        let out = self.fresh(&op.to_lowercase());
        self.push_node(op, domain, inputs, vec![out.clone()], attrs);
        Value(out)
    }

    /// Adds a standard-domain node with `n` outputs.
    pub fn op_multi(
        &mut self,
        op: &str,
        inputs: &[&Value],
        attrs: &[(&str, Attr)],
        n: usize,
    ) -> Vec<Value> {
        self.op_multi_in("", op, inputs, attrs, n)
    }

    /// Adds a node of `domain` with `n` outputs.
    pub fn op_multi_in(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&Value],
        attrs: &[(&str, Attr)],
        n: usize,
    ) -> Vec<Value> {
        let outs: Vec<String> = (0..n).map(|_| self.fresh(&op.to_lowercase())).collect();
        self.push_node(op, domain, inputs, outs.clone(), attrs);
        outs.into_iter().map(Value).collect()
    }

    /// Adds a node of `domain` whose optional outputs are only partly used: `used[i]` says
    /// whether output `i` gets a name (and is returned, in order); the others are written as
    /// empty names, ONNX's way of saying "not produced".
    pub fn op_some_outputs_in(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&Value],
        attrs: &[(&str, Attr)],
        used: &[bool],
    ) -> Vec<Value> {
        let outs: Vec<String> = used
            .iter()
            .map(|u| {
                if *u {
                    self.fresh(&op.to_lowercase())
                } else {
                    String::new()
                }
            })
            .collect();
        self.push_node(op, domain, inputs, outs.clone(), attrs);
        outs.into_iter()
            .filter(|o| !o.is_empty())
            .map(Value)
            .collect()
    }

    /// Adds an initializer from raw little-endian bytes; large ones are streamed to the
    /// external-data file immediately.
    pub fn initializer(
        &mut self,
        name: &str,
        dtype: DType,
        dims: &[i64],
        bytes: Vec<u8>,
    ) -> Result<Value, ExportError> {
        let location = if bytes.len() >= EXTERNAL_THRESHOLD {
            let (offset, length) = self.append_external(&bytes)?;
            Location::External { offset, length }
        } else {
            Location::Inline(bytes)
        };
        self.inits.push(Initializer {
            name: name.to_string(),
            dtype,
            dims: dims.to_vec(),
            location,
        });
        Ok(Value(name.to_string()))
    }

    fn append_external(&mut self, bytes: &[u8]) -> Result<(u64, u64), ExportError> {
        let path = self.dir.join(&self.data_name);
        if self.data.is_none() {
            let f = File::create(&path).map_err(|e| ExportError::io(&path, e))?;
            self.data = Some(BufWriter::with_capacity(1 << 20, f));
        }
        let w = self.data.as_mut().expect("data file opened above");
        let pad = (EXTERNAL_ALIGN - self.data_len % EXTERNAL_ALIGN) % EXTERNAL_ALIGN;
        w.write_all(&vec![0u8; pad as usize])
            .and_then(|_| w.write_all(bytes))
            .map_err(|e| ExportError::io(&path, e))?;
        let offset = self.data_len + pad;
        self.data_len = offset + bytes.len() as u64;
        Ok((offset, bytes.len() as u64))
    }

    /// A float initializer from `f32` values, stored as `dtype`.
    pub fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        dims: &[i64],
        values: &[f32],
    ) -> Result<Value, ExportError> {
        let bytes = dtype.encode_floats(values);
        self.initializer(name, dtype, dims, bytes)
    }

    /// A 1-D `int64` constant.
    pub fn const_i64(&mut self, values: &[i64]) -> Value {
        let name = self.fresh("const");
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializer(&name, DType::I64, &[values.len() as i64], bytes)
            .expect("small constants are stored inline")
    }

    /// A 0-D (scalar) constant of a float type.
    pub fn scalar(&mut self, dtype: DType, v: f32) -> Value {
        let name = self.fresh("scalar");
        let bytes = dtype.encode_floats(&[v]);
        self.initializer(&name, dtype, &[], bytes)
            .expect("small constants are stored inline")
    }

    /// A 0-D `int64` constant.
    pub fn scalar_i64(&mut self, v: i64) -> Value {
        let name = self.fresh("scalar");
        self.initializer(&name, DType::I64, &[], v.to_le_bytes().to_vec())
            .expect("small constants are stored inline")
    }

    /// Number of nodes so far, by operator type (for reports and tests).
    pub fn op_counts(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for n in &self.nodes {
            let key = if n.domain.is_empty() {
                n.op.clone()
            } else {
                format!("{}.{}", n.domain, n.op)
            };
            *m.entry(key).or_insert(0) += 1;
        }
        m
    }

    /// Writes `<dir>/<stem>.onnx` (and flushes the data file). Returns what was written.
    pub fn finish(
        mut self,
        opsets: &[(&str, i64)],
        metadata: &[(String, String)],
    ) -> Result<GraphInfo, ExportError> {
        if let Some(mut w) = self.data.take() {
            let path = self.dir.join(&self.data_name);
            w.flush().map_err(|e| ExportError::io(&path, e))?;
            w.into_inner()
                .map_err(|e| ExportError::io(&path, e.into_error()))?
                .sync_all()
                .map_err(|e| ExportError::io(&path, e))?;
        }
        let mut graph = Encoder::default();
        for n in &self.nodes {
            graph.message(GRAPH_NODE, encode_node(n));
        }
        graph.string(GRAPH_NAME, &self.file_stem);
        for i in &self.inits {
            graph.message(GRAPH_INITIALIZER, encode_initializer(i, &self.data_name));
        }
        for v in &self.inputs {
            graph.message(GRAPH_INPUT, encode_value_info(v));
        }
        for v in &self.outputs {
            graph.message(GRAPH_OUTPUT, encode_value_info(v));
        }
        let mut model = Encoder::default();
        model.int64(MODEL_IR_VERSION, ir_version_for(opsets));
        model.string(MODEL_PRODUCER_NAME, "ocrctl");
        model.string(MODEL_PRODUCER_VERSION, env!("CARGO_PKG_VERSION"));
        model.message(MODEL_GRAPH, graph);
        for (domain, version) in opsets {
            let mut o = Encoder::default();
            o.string(OPSET_ID_DOMAIN, domain);
            o.int64(OPSET_ID_VERSION, *version);
            model.message(MODEL_OPSET_IMPORT, o);
        }
        for (k, v) in metadata {
            let mut e = Encoder::default();
            e.string(STRING_ENTRY_KEY, k);
            e.string(STRING_ENTRY_VALUE, v);
            model.message(MODEL_METADATA_PROPS, e);
        }
        let path = self.dir.join(format!("{}.onnx", self.file_stem));
        std::fs::write(&path, model.into_bytes()).map_err(|e| ExportError::io(&path, e))?;
        let io = |v: &Vec<ValueInfo>| {
            v.iter()
                .map(|i| IoInfo {
                    name: i.name.clone(),
                    dtype: i.dtype.name().to_string(),
                    shape: i
                        .dims
                        .iter()
                        .map(|d| match d {
                            Dim::Fixed(n) => n.to_string(),
                            Dim::Named(s) => s.clone(),
                        })
                        .collect(),
                })
                .collect()
        };
        Ok(GraphInfo {
            file: format!("{}.onnx", self.file_stem),
            data_file: (self.data_len > 0).then(|| self.data_name.clone()),
            data_bytes: self.data_len,
            inputs: io(&self.inputs),
            outputs: io(&self.outputs),
            op_counts: self.op_counts(),
        })
    }
}

/// One graph input or output as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<String>,
}

/// What [`Graph::finish`] wrote.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GraphInfo {
    /// File name of the `.onnx` model (relative to its directory).
    pub file: String,
    /// File name of the external data, if any.
    pub data_file: Option<String>,
    pub data_bytes: u64,
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    /// Node count per operator (`com.microsoft.X` for contrib ops).
    pub op_counts: std::collections::BTreeMap<String, usize>,
}

fn encode_node(n: &Node) -> Encoder {
    let mut e = Encoder::default();
    for i in &n.inputs {
        e.string(NODE_INPUT, i);
    }
    for o in &n.outputs {
        e.string(NODE_OUTPUT, o);
    }
    e.string(NODE_NAME, &n.name);
    e.string(NODE_OP_TYPE, &n.op);
    for (name, a) in &n.attrs {
        let mut ae = Encoder::default();
        ae.string(ATTRIBUTE_NAME, name);
        match a {
            Attr::Float(f) => {
                ae.float(ATTRIBUTE_F, *f);
                ae.int64(ATTRIBUTE_TYPE, ATTRIBUTE_TYPE_FLOAT);
            }
            Attr::Int(i) => {
                ae.int64(ATTRIBUTE_I, *i);
                ae.int64(ATTRIBUTE_TYPE, ATTRIBUTE_TYPE_INT);
            }
            Attr::Str(s) => {
                ae.string(ATTRIBUTE_S, s);
                ae.int64(ATTRIBUTE_TYPE, ATTRIBUTE_TYPE_STRING);
            }
            Attr::Ints(v) => {
                ae.packed_int64(ATTRIBUTE_INTS, v);
                ae.int64(ATTRIBUTE_TYPE, ATTRIBUTE_TYPE_INTS);
            }
        }
        e.message(NODE_ATTRIBUTE, ae);
    }
    if !n.domain.is_empty() {
        e.string(NODE_DOMAIN, &n.domain);
    }
    e
}

fn encode_initializer(i: &Initializer, data_name: &str) -> Encoder {
    let mut e = Encoder::default();
    e.packed_int64(TENSOR_DIMS, &i.dims);
    e.int64(TENSOR_DATA_TYPE, i.dtype.onnx_code());
    e.string(TENSOR_NAME, &i.name);
    match &i.location {
        Location::Inline(bytes) => e.bytes(TENSOR_RAW_DATA, bytes),
        Location::External { offset, length } => {
            for (k, v) in [
                ("location", data_name.to_string()),
                ("offset", offset.to_string()),
                ("length", length.to_string()),
            ] {
                let mut kv = Encoder::default();
                kv.string(STRING_ENTRY_KEY, k);
                kv.string(STRING_ENTRY_VALUE, &v);
                e.message(TENSOR_EXTERNAL_DATA, kv);
            }
            e.int64(TENSOR_DATA_LOCATION, TENSOR_DATA_LOCATION_EXTERNAL);
        }
    }
    e
}

fn encode_value_info(v: &ValueInfo) -> Encoder {
    let mut shape = Encoder::default();
    for d in &v.dims {
        let mut de = Encoder::default();
        match d {
            Dim::Fixed(n) => de.int64(DIMENSION_DIM_VALUE, *n),
            Dim::Named(s) => de.string(DIMENSION_DIM_PARAM, s),
        }
        shape.message(TENSOR_SHAPE_DIM, de);
    }
    let mut tensor = Encoder::default();
    tensor.int64(TYPE_TENSOR_ELEM_TYPE, v.dtype.onnx_code());
    tensor.message(TYPE_TENSOR_SHAPE, shape);
    let mut ty = Encoder::default();
    ty.message(TYPE_TENSOR_TYPE, tensor);
    let mut e = Encoder::default();
    e.string(VALUE_INFO_NAME, &v.name);
    e.message(VALUE_INFO_TYPE, ty);
    e
}

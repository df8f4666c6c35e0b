//! Static check of the `--target tensorrt` graphs against the onnx-tensorrt operator support
//! matrix (TensorRT 10, `docs/operators.md` of onnx/onnx-tensorrt): TensorRT cannot be
//! installed here, so this is what can be verified without it. Every node must be a
//! standard-domain op the parser supports, with the restrictions that apply to our usage
//! (Slice/Squeeze/Unsqueeze axes and Conv weights are initializers, DequantizeLinear has no
//! zero point and feeds a MatMul).

mod common;
use common::*;
use ocrctl_exporters::proto::read::{fields, summarize, Field};
use std::collections::BTreeSet;

/// Operators of the onnx-tensorrt support matrix that the exporter may emit.
const TRT_SUPPORTED: &[&str] = &[
    "Add",
    "And",
    "Cast",
    "Concat",
    "Conv",
    "Cos",
    "DequantizeLinear",
    "Div",
    "Erf",
    "Expand",
    "Gather",
    "Identity",
    "LessOrEqual",
    "MatMul",
    "Mul",
    "Neg",
    "Range",
    "ReduceMean",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Sin",
    "Slice",
    "Softmax",
    "Split",
    "Sqrt",
    "Squeeze",
    "Transpose",
    "Unsqueeze",
    "Where",
];

type Node = (String, String, Vec<String>, Vec<String>);

/// Per node: (domain, op type, inputs, outputs); initializer names alongside.
fn graph(bytes: &[u8]) -> (Vec<Node>, BTreeSet<String>) {
    let g = fields(bytes).unwrap().into_iter().find_map(|f| match f {
        Field::Bytes(7, g) => Some(g),
        _ => None,
    });
    let mut nodes = Vec::new();
    let mut inits = BTreeSet::new();
    for f in fields(g.unwrap()).unwrap() {
        match f {
            Field::Bytes(1, n) => {
                let (mut op, mut dom, mut ins, mut outs) =
                    (String::new(), String::new(), Vec::new(), Vec::new());
                for nf in fields(n).unwrap() {
                    match nf {
                        Field::Bytes(1, v) => ins.push(String::from_utf8_lossy(v).into_owned()),
                        Field::Bytes(2, v) => outs.push(String::from_utf8_lossy(v).into_owned()),
                        Field::Bytes(4, v) => op = String::from_utf8_lossy(v).into_owned(),
                        Field::Bytes(7, v) => dom = String::from_utf8_lossy(v).into_owned(),
                        _ => {}
                    }
                }
                nodes.push((dom, op, ins, outs));
            }
            Field::Bytes(5, t) => {
                for tf in fields(t).unwrap() {
                    if let Field::Bytes(8, v) = tf {
                        inits.insert(String::from_utf8_lossy(v).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    (nodes, inits)
}

#[test]
fn tensorrt_graphs_use_only_ops_the_onnx_tensorrt_parser_supports() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("trt");
    export_fixture(
        &out,
        &["--target", "tensorrt", "--precision", "fp32,fp16,int4-fp16"],
    );
    let mut files = 0;
    for e in std::fs::read_dir(out.join("onnx")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("onnx") {
            continue;
        }
        files += 1;
        let bytes = std::fs::read(&p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let (nodes, inits) = graph(&bytes);
        assert!(summarize(&bytes).is_some());
        for (dom, op, ins, _) in &nodes {
            assert!(dom.is_empty(), "{name}: {dom}.{op} is not a standard op");
            assert!(
                TRT_SUPPORTED.contains(&op.as_str()),
                "{name}: {op} is not in the onnx-tensorrt support matrix"
            );
            match op.as_str() {
                "Slice" => assert!(
                    ins.len() >= 4 && inits.contains(&ins[3]),
                    "{name}: Slice axes must be an initializer"
                ),
                "Squeeze" | "Unsqueeze" => assert!(
                    ins.len() == 2 && inits.contains(&ins[1]),
                    "{name}: {op} axes must be an initializer"
                ),
                "Conv" => assert!(
                    inits.contains(&ins[1]),
                    "{name}: Conv weights must be an initializer"
                ),
                "DequantizeLinear" => {
                    assert_eq!(
                        ins.len(),
                        2,
                        "{name}: DequantizeLinear must have no zero point"
                    );
                    assert!(
                        inits.contains(&ins[0]) && inits.contains(&ins[1]),
                        "{name}: constant INT4 weights and scales"
                    );
                }
                _ => {}
            }
        }
        // Every DequantizeLinear output is the weight input of a MatMul (weight-only INT4).
        for dq in nodes.iter().filter(|n| n.1 == "DequantizeLinear") {
            let out = &dq.3[0];
            assert!(
                nodes
                    .iter()
                    .any(|n| n.1 == "MatMul" && n.2.get(1) == Some(out)),
                "{name}: {out} does not feed a MatMul"
            );
        }
    }
    assert_eq!(files, 9, "three graphs for each of three precisions");
}

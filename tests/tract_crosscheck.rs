//! A second runtime: tract-onnx loads the fp32 standard-op graphs (`--target tensorrt`, the
//! ones without ONNX Runtime contrib ops) and must agree with ONNX Runtime on the vision
//! features and the first-step logits of the fixture.

mod common;
use common::*;
use ndarray::Array2;
use ocrctl::model::preprocess::{self, PreprocessConfig};
use ocrctl::model::prompt::Prompter;
use ocrctl::runtime::backend::Backend;
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl_exporters::export::{Manifest, Precision};
use tract_onnx::prelude::*;

fn export_standard_ops() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("trt");
    export_fixture(&out, &["--target", "tensorrt"]);
    (d, out)
}

#[test]
fn tract_agrees_with_onnx_runtime_on_features_and_first_logits() {
    let (_d, dir) = export_standard_ops();
    let manifest = Manifest::load(&dir).unwrap();
    let cfg = manifest.model.clone();
    let mut ort_model = OrtModel::load(&dir, &LoadOptions::new(Precision::Fp32)).unwrap();
    let pre = PreprocessConfig::from_model_dir(&dir, 14, 2).unwrap();
    let img = preprocess::load_image(
        &fixture().join("images/aligned.png"),
        preprocess::DEFAULT_MAX_PIXELS,
    )
    .unwrap();
    let p = preprocess::preprocess(&img, &pre);
    let (h, w) = (p.height as usize, p.width as usize);

    // Vision encoder + projector.
    let vision = tract_onnx::onnx()
        .model_for_path(dir.join("onnx/vision_encoder.onnx"))
        .unwrap()
        .with_input_fact(0, f32::fact([1, 3, h, w]).into())
        .unwrap()
        .into_optimized()
        .unwrap()
        .into_runnable()
        .unwrap();
    let pix: Tensor = p.pixel_values.to_array().into_dyn().into();
    let out = vision.run(tvec!(pix.into())).unwrap();
    let tract_feats = out[0].to_plain_array_view::<f32>().unwrap().to_owned();
    let ort_feats = ort_model.encode_image(&p.pixel_values).unwrap();
    // The graph's [1, N, hidden]; the runtime hands out [N, hidden].
    assert_eq!(tract_feats.shape()[0], 1);
    assert_eq!(&tract_feats.shape()[1..], ort_feats.shape());
    let d = max_abs_diff(
        tract_feats.as_slice().unwrap(),
        ort_feats.as_slice().unwrap(),
    );
    assert!(d < 1e-4, "vision features: tract vs ORT differ by {d}");

    // First decoder step (prefill with an empty cache).
    let prompter = Prompter::from_model_dir(&dir, cfg.image_token_id).unwrap();
    let ids = prompter.encode(&[p.num_image_tokens], None).unwrap();
    let mut embeds: Array2<f32> = ort_model.embed(&ids).unwrap();
    ocrctl::generation::generate::merge_image_features(
        &mut embeds,
        &ids,
        cfg.image_token_id,
        &ort_feats,
    )
    .unwrap();
    let (ort_logits, _) = ort_model.forward(embeds.clone(), None).unwrap();

    let t = &cfg.text;
    let s = ids.len();
    let mut model = tract_onnx::onnx()
        .model_for_path(dir.join("onnx/decoder_model_merged.onnx"))
        .unwrap();
    model
        .set_input_fact(0, f32::fact([1, s, t.hidden_size]).into())
        .unwrap();
    model.set_input_fact(1, i64::fact([1, s]).into()).unwrap();
    model.set_input_fact(2, i64::fact([1, s]).into()).unwrap();
    for i in 0..2 * t.num_layers {
        model
            .set_input_fact(3 + i, f32::fact([1, t.num_kv_heads, 0, t.head_dim]).into())
            .unwrap();
    }
    // tract folds `num_logits_to_keep` (an input with a default initializer) into a
    // constant; ONNX Runtime keeps it as an overridable input.
    let has_keep = model.input_outlets().unwrap().len() > 3 + 2 * t.num_layers;
    if has_keep {
        model
            .set_input_fact(3 + 2 * t.num_layers, i64::scalar_fact().into())
            .unwrap();
    }
    let decoder = model.into_optimized().unwrap().into_runnable().unwrap();
    let mut inputs: TVec<TValue> = tvec![
        Tensor::from(embeds.insert_axis(ndarray::Axis(0)).into_dyn()).into(),
        Tensor::from(ndarray::Array2::<i64>::ones((1, s)).into_dyn()).into(),
        Tensor::from(ndarray::Array2::from_shape_fn((1, s), |(_, j)| j as i64).into_dyn()).into(),
    ];
    for _ in 0..2 * t.num_layers {
        inputs.push(
            Tensor::zero::<f32>(&[1, t.num_kv_heads, 0, t.head_dim])
                .unwrap()
                .into(),
        );
    }
    if has_keep {
        inputs.push(tensor0(1i64).into());
    }
    let out = decoder.run(inputs).unwrap();
    let logits_idx = decoder
        .model()
        .output_outlets()
        .unwrap()
        .iter()
        .position(|o| {
            decoder
                .model()
                .outlet_label(*o)
                .map(|l| l == "logits")
                .unwrap_or(false)
                || decoder.model().node(o.node).name == "logits"
        });
    let logits = out[logits_idx.unwrap_or(out.len() - 1)]
        .to_plain_array_view::<f32>()
        .unwrap();
    let last: Vec<f32> = logits
        .iter()
        .copied()
        .skip(logits.len() - t.vocab_size)
        .collect();
    let d = max_abs_diff(&last, &ort_logits);
    assert!(d < 1e-3, "first-step logits: tract vs ORT differ by {d}");
}

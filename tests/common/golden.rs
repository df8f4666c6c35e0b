//! The transformers goldens of the tiny fixture (`tests/fixtures/tiny-lightonocr/golden/`,
//! made by `scripts/make_fixture.py`) and the comparisons the parity tests share.

use super::fixture;
use ndarray::{Array2, Array4};
use ocrctl::generation::generate::TokenLogprob;
use ocrctl::model::preprocess;
use ocrctl_exporters::checkpoint::{Checkpoint, Weights};
use serde_json::Value;

/// The goldens: `golden.json` and `golden.safetensors`.
pub struct Golden {
    pub json: Value,
    pub tensors: Checkpoint,
}

pub fn golden() -> Golden {
    let dir = fixture().join("golden");
    let json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let tensors = Checkpoint::open_files(vec![dir.join("golden.safetensors")]).unwrap();
    Golden { json, tensors }
}

impl Golden {
    /// The image as the reference saw it: Pillow's decoded pixels when recorded (JPEG),
    /// else our own decode of the file.
    pub fn reference_image(&self, im: &Value) -> image::RgbImage {
        let stem = im["stem"].as_str().unwrap();
        let ours = preprocess::load_image(
            &fixture().join(im["file"].as_str().unwrap()),
            preprocess::DEFAULT_MAX_PIXELS,
        )
        .unwrap();
        let decoded = format!("decoded_rgb.{stem}");
        match self.tensors.shape(&decoded).map(|s| s.to_vec()) {
            Some(shape) => {
                let pil = self.tensors.get_u8(&decoded, &shape).unwrap();
                image::RgbImage::from_raw(ours.width(), ours.height(), pil).unwrap()
            }
            None => ours,
        }
    }

    pub fn images(&self) -> &Vec<Value> {
        self.json["images"].as_array().unwrap()
    }
    pub fn tensor(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let shape = self
            .tensors
            .shape(name)
            .unwrap_or_else(|| panic!("golden tensor {name}"))
            .to_vec();
        let v = self.tensors.get(name, &shape).unwrap();
        (shape, v)
    }
    pub fn pixel_values(&self, stem: &str) -> Array4<f32> {
        let (s, v) = self.tensor(&format!("pixel_values.{stem}"));
        Array4::from_shape_vec((s[0], s[1], s[2], s[3]), v).unwrap()
    }
    pub fn features(&self, stem: &str) -> Array2<f32> {
        let (s, v) = self.tensor(&format!("image_features.{stem}"));
        Array2::from_shape_vec((s[0], s[1]), v).unwrap()
    }
}

/// A JSON list of ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Checks our top-5 log-probabilities of every step against the reference's (`want`: the
/// image's `top5` list) within `tol`; returns the largest difference seen.
pub fn check_top5(stem: &str, got_steps: &[Vec<TokenLogprob>], want: &Value, tol: f32) -> f32 {
    let mut worst = 0f32;
    for (step, (got, want)) in got_steps.iter().zip(want.as_array().unwrap()).enumerate() {
        for w in want.as_array().unwrap() {
            let id = w["id"].as_u64().unwrap() as u32;
            let lp = w["logprob"].as_f64().unwrap() as f32;
            match got.iter().find(|t| t.id == id) {
                Some(t) => {
                    let d = (t.logprob - lp).abs();
                    worst = worst.max(d);
                    assert!(
                        d <= tol,
                        "{stem} step {step} token {id}: logprob {} vs {lp}",
                        t.logprob
                    );
                }
                // A token may leave our top 5 only through a near-tie with the 5th.
                None => {
                    let fifth = got.last().unwrap().logprob;
                    assert!(
                        (fifth - lp).abs() <= tol,
                        "{stem} step {step}: reference top-5 token {id} ({lp}) missing"
                    );
                }
            }
        }
    }
    worst
}

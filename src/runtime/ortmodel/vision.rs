//! The vision encoder's run (`pixel_values` → `image_features`), shared by
//! [`super::OrtModel`]'s `encode_image` and the [`VisionHandle`] a vision stage runs on its
//! own thread ([`crate::generation::vision`]).

use super::tensors::{float_tensor, float_tensor_from, read_f};
use super::{graph, tap_outputs, tensor, DType, Tap};
use crate::runtime::backend::{BackendError, ImageEncoder};
use ndarray::{Array2, Array4};
use ort::session::{Session, SessionInputValue};
use ort::value::TensorRef;
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// The vision encoder's session and the image sizes (height, width) it has encoded.
pub(super) struct Vision {
    session: Session,
    sizes: HashSet<(usize, usize)>,
}

impl Vision {
    pub(super) fn new(session: Session) -> Self {
        Self {
            session,
            sizes: HashSet::new(),
        }
    }
}

/// The vision encoder of an [`super::OrtModel`], for a vision stage's thread (the model keeps using
/// it too: runs take turns through the mutex).
pub(super) struct VisionHandle {
    pub(super) vision: Arc<Mutex<Vision>>,
}

impl ImageEncoder for VisionHandle {
    fn encode(&mut self, pixel_values: &Array4<f32>) -> Result<Array2<f32>, BackendError> {
        run(&self.vision, pixel_values, &mut None)
    }
}

fn lock(vision: &Mutex<Vision>) -> MutexGuard<'_, Vision> {
    vision.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`encode`] under the capture lock: alone for an image size the encoder has not run yet
/// (cuDNN most likely captures a stream of its own on a new shape, and then any other thread's
/// synchronisation fails both: see [`super::capture`]), shared otherwise. The first page
/// of a size thus waits for the decode step in flight and holds the next one back for one
/// encoder run, once per size.
pub(super) fn run(
    vision: &Mutex<Vision>,
    pixel_values: &Array4<f32>,
    tap: &mut Option<Tap>,
) -> Result<Array2<f32>, BackendError> {
    let size = (pixel_values.shape()[2], pixel_values.shape()[3]);
    let new = !lock(vision).sizes.contains(&size);
    let _gpu = super::capture::hold(new);
    let mut v = lock(vision);
    let out = encode(&mut v.session, pixel_values, tap)?;
    v.sizes.insert(size);
    Ok(out)
}

/// `pixel_values [1, 3, H, W]` through the vision session → `[N, hidden]` float32.
fn encode(
    vision: &mut Session,
    pixel_values: &Array4<f32>,
    tap: &mut Option<Tap>,
) -> Result<Array2<f32>, BackendError> {
    const PART: &str = graph::VISION;
    let shape: Vec<i64> = pixel_values.shape().iter().map(|d| *d as i64).collect();
    // float32 pixels (exports before the onnx-community contract took the activation dtype).
    let pixel_dtype = match vision.inputs().first().map(|i| i.dtype().tensor_type()) {
        Some(Some(ort::value::TensorElementType::Float16)) => DType::F16,
        _ => DType::F32,
    };
    // float32 pixels are lent to ONNX Runtime as they lie, not copied: an A4 page's are
    // 19 MiB, and copying them cost ~3 ms of each page's vision time on the H200's host
    // (docs/benchmarks/2026-12-04-h200/).
    let input = match (pixel_dtype, pixel_values.as_slice()) {
        (DType::F32, Some(s)) => SessionInputValue::from(
            TensorRef::from_array_view((shape, s)).map_err(|e| BackendError::runtime(PART, e))?,
        ),
        (_, Some(s)) => SessionInputValue::from(float_tensor_from(pixel_dtype, shape, s, PART)?),
        (_, None) => SessionInputValue::from(float_tensor(
            pixel_dtype,
            shape,
            pixel_values.iter().copied().collect(),
            PART,
        )?),
    };
    let mut out = vision
        .run(vec![(Cow::from(tensor::PIXEL_VALUES), input)])
        .map_err(|e| BackendError::runtime(PART, e))?;
    tap_outputs(tap, &out, PART)?;
    let v = out
        .remove(tensor::IMAGE_FEATURES)
        .ok_or_else(|| BackendError::runtime(PART, "no image_features output"))?;
    let (shape, data) = read_f(&v, PART)?;
    // [1, N, hidden] (older exports: [N, hidden]).
    let (n, h) = match shape[..] {
        [1, n, h] | [n, h] => (n, h),
        _ => {
            return Err(BackendError::runtime(
                PART,
                format!("image_features has shape {shape:?}, expected [1, N, hidden]"),
            ))
        }
    };
    Array2::from_shape_vec((n, h), data).map_err(|e| BackendError::runtime(PART, e))
}

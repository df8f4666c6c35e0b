//! The vision encoder's run (`pixel_values` → `image_features`), shared by
//! [`super::OrtModel`]'s `encode_image` and the [`VisionHandle`] a vision stage runs on its
//! own thread ([`crate::generation::vision`]).

use super::tensors::{float_tensor, float_tensor_from, read_f};
use super::{graph, tap_outputs, tensor, DType, Tap};
use crate::model::preprocess::Pixels;
use crate::runtime::backend::{BackendError, ImageEncoder};
use crate::runtime::providers::Provider;
use ndarray::Array2;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{Session, SessionInputValue};
use ort::value::{Tensor, TensorRef, TensorRefMut};
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// The vision encoder's session, the image sizes (height, width) it has encoded, and the
/// page-locked buffer its pixels are uploaded from on CUDA.
pub(super) struct Vision {
    session: Session,
    sizes: HashSet<(usize, usize)>,
    /// The size of the last run (ONNX Runtime's cuDNN convolution rebuilds its plan when the
    /// input shape differs from its previous run's).
    last: Option<(usize, usize)>,
    staging: Option<Staging>,
}

impl Vision {
    /// `provider` is the session's main provider: on CUDA (device `device_id`) the pixels go
    /// through a [`Staging`] buffer (when ONNX Runtime gives the session a pinned allocator).
    pub(super) fn new(session: Session, provider: Provider, device_id: i32) -> Self {
        let staging = (provider == Provider::Cuda)
            .then(|| Staging::new(&session, device_id))
            .flatten();
        Self {
            session,
            sizes: HashSet::new(),
            last: None,
            staging,
        }
    }
}

/// Page-locked (pinned) host memory for the pixels, from the CUDA provider's allocator,
/// grown to the largest image so far and reused for every smaller one.
///
/// Why: CUDA copies pageable memory to the device through its own bounce buffers, ~3 ms for an A4
/// page's 19 MiB on the H200 against 0.4 ms from pinned memory, and the vision run waits for it
/// (`docs/benchmarks/2026-12-04-h200/gpu_vision_io.py`: 42.6 ms with pageable pixels, 39.5 pinned).
/// The float32 values are written straight into it from the page's 8-bit pixels
/// ([`Pixels::write_nchw`], on a few threads), which costs less than what it saves. Growing only,
/// pages of changing sizes do not allocate (and zero) pinned memory each time.
struct Staging {
    allocator: Allocator,
    buffer: Option<Tensor<f32>>,
    /// Threads the values are written on: up to 4 (read once, not per page).
    threads: usize,
    /// Tests: every fill fails, as a refused allocation or run would.
    #[cfg(test)]
    refuse: bool,
}

impl Staging {
    fn new(session: &Session, device_id: i32) -> Option<Self> {
        // ONNX Runtime's CUDA provider makes its pinned allocator with its own device id
        // (`CUDAPinnedAllocator(device_id, …)`); a session without one lends the pixels.
        let pinned = MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            device_id.max(0),
            AllocatorType::Device,
            MemoryType::CPUInput,
        );
        match pinned.and_then(|m| Allocator::new(session, m)) {
            Ok(allocator) => Some(Self {
                allocator,
                buffer: None,
                threads: write_threads(),
                #[cfg(test)]
                refuse: false,
            }),
            Err(e) => {
                tracing::debug!("no pinned allocator for the vision encoder ({e}): pixels upload from pageable memory");
                None
            }
        }
    }

    /// A tensor of `shape` over the pinned buffer, holding `pixels` (of that shape).
    fn fill(&mut self, shape: &[i64], pixels: &Pixels) -> ort::Result<TensorRefMut<'_, f32>> {
        #[cfg(test)]
        if self.refuse {
            return Err(ort::Error::new("refused (test)"));
        }
        let n = pixels.len();
        if self
            .buffer
            .as_ref()
            .is_none_or(|b| (b.shape()[0] as usize) < n)
        {
            self.buffer = None; // free the old buffer before taking the new one
            self.buffer = Some(Tensor::new(&self.allocator, [n])?);
        }
        let buffer = self.buffer.as_mut().expect("set above");
        pixels.write_nchw(&mut buffer.extract_tensor_mut().1[..n], self.threads);
        let data = buffer.data_ptr_mut();
        let info = self.allocator.memory_info().to_owned();
        // SAFETY: the buffer holds at least `n` float32s, `n` being `shape`'s element count
        // (`pixels` is the array of that shape), in the allocator's memory, which `info`
        // describes; the view borrows `self` mutably, so the buffer outlives it and is not
        // written while ONNX Runtime reads it.
        unsafe { TensorRefMut::from_raw(info, data, shape.into()) }
    }
}

/// The host's cores, at most 4: what a page's values are written on.
fn write_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// The vision encoder of an [`super::OrtModel`], for a vision stage's thread (the model keeps using
/// it too: runs take turns through the mutex).
pub(super) struct VisionHandle {
    pub(super) vision: Arc<Mutex<Vision>>,
}

impl ImageEncoder for VisionHandle {
    fn encode(&mut self, pixel_values: &Pixels) -> Result<Array2<f32>, BackendError> {
        run(&self.vision, pixel_values, &mut None)
    }
}

/// `"pinned"` while the encoder stages its pixels ([`Staging`]), `"lent"` otherwise.
pub(super) fn pixels_source(vision: &Mutex<Vision>) -> &'static str {
    match lock(vision).staging {
        Some(_) => "pinned",
        None => "lent",
    }
}

fn lock(vision: &Mutex<Vision>) -> MutexGuard<'_, Vision> {
    vision.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`encode`] under the capture lock: alone when the image size differs from the encoder's
/// previous run (cuDNN most likely captures a stream of its own when its convolution's shape
/// changes, and then any other thread's synchronisation fails both: see [`super::capture`]),
/// shared otherwise. Such a page waits for the decode step in flight and holds the next one
/// back for one encoder run.
pub(super) fn run(
    vision: &Mutex<Vision>,
    pixel_values: &Pixels,
    tap: &mut Option<Tap>,
) -> Result<Array2<f32>, BackendError> {
    let size = (pixel_values.height(), pixel_values.width());
    let alone = {
        let v = lock(vision);
        match alone_policy() {
            AlonePolicy::NewSize => !v.sizes.contains(&size),
            AlonePolicy::ChangedSize => v.last != Some(size),
            AlonePolicy::Always => true,
        }
    };
    let _gpu = super::capture::hold(alone);
    let mut v = lock(vision);
    let Vision {
        session, staging, ..
    } = &mut *v;
    let out = match encode(session, staging.as_mut(), pixel_values, tap) {
        // A run that fails with staged pixels and succeeds with lent ones: the staging is at
        // fault, and is dropped for good (one warning), so the pages go on.
        Err(e) if staging.is_some() => {
            let out = encode(session, None, pixel_values, tap)?;
            tracing::warn!("the vision encoder refused page-locked pixels ({e}); they upload from pageable memory from now on");
            *staging = None;
            out
        }
        r => r?,
    };
    v.sizes.insert(size);
    v.last = Some(size);
    Ok(out)
}

/// When a vision run holds the capture lock alone: for a size other than the previous run's
/// (the default), for a size never run, or always (`OCRCTL_VISION_ALONE=changed|new|always`).
/// ONNX Runtime's cuDNN convolution keeps the plan of its last shape only: with `new`, 15
/// fixture pages of five sizes at batch 15 on an H100 lost a page in 10 of 40 runs (both
/// decoders), with `changed` in none of 40; a 16 GiB server (paged, fp8, 32 clients, mixed
/// sizes) did 6 % fewer pages/s (docs/benchmarks/2026-12-06-paged §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AlonePolicy {
    NewSize,
    ChangedSize,
    Always,
}

fn alone_policy() -> AlonePolicy {
    static POLICY: std::sync::OnceLock<AlonePolicy> = std::sync::OnceLock::new();
    *POLICY.get_or_init(|| match std::env::var("OCRCTL_VISION_ALONE").as_deref() {
        Ok("new") => AlonePolicy::NewSize,
        Ok("always") => AlonePolicy::Always,
        _ => AlonePolicy::ChangedSize,
    })
}

/// `pixel_values [1, 3, H, W]` through the vision session → `[N, hidden]` float32.
fn encode(
    vision: &mut Session,
    staging: Option<&mut Staging>,
    pixel_values: &Pixels,
    tap: &mut Option<Tap>,
) -> Result<Array2<f32>, BackendError> {
    const PART: &str = graph::VISION;
    let shape: Vec<i64> = pixel_values.shape().iter().map(|d| *d as i64).collect();
    // float32 pixels (exports before the onnx-community contract took the activation dtype).
    let pixel_dtype = match vision.inputs().first().map(|i| i.dtype().tensor_type()) {
        Some(Some(ort::value::TensorElementType::Float16)) => DType::F16,
        _ => DType::F32,
    };
    // float32 pixels are written into the page-locked staging buffer on CUDA ([`Staging`]).
    // Otherwise float32 values already held are lent to ONNX Runtime as they lie, not copied
    // (an A4 page's are 19 MiB, and copying them cost ~3 ms of each page's vision time on the
    // H200's host: docs/benchmarks/2026-12-04-h200/), and a page's 8-bit pixels are written
    // once into the array the run takes.
    let input = match (pixel_dtype, pixel_values.as_slice(), staging) {
        (DType::F32, _, Some(staging)) => SessionInputValue::from(
            staging
                .fill(&shape, pixel_values)
                .map_err(|e| BackendError::runtime(PART, e))?,
        ),
        (DType::F32, Some(s), None) => SessionInputValue::from(
            TensorRef::from_array_view((shape, s)).map_err(|e| BackendError::runtime(PART, e))?,
        ),
        (_, Some(s), _) => SessionInputValue::from(float_tensor_from(pixel_dtype, shape, s, PART)?),
        (_, None, _) => {
            let mut values = vec![0f32; pixel_values.len()];
            pixel_values.write_nchw(&mut values, 1);
            SessionInputValue::from(float_tensor(pixel_dtype, shape, values, PART)?)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixels `[1, 3, h, w]` with values that differ per element, held as float32.
    fn pixels(h: usize, w: usize) -> Pixels {
        Pixels::dense(ndarray::Array4::from_shape_fn(
            (1, 3, h, w),
            |(_, c, y, x)| ((c * 31 + y * 7 + x * 3) % 17) as f32 / 8.0 - 1.0,
        ))
    }

    #[test]
    fn staged_pixels_give_the_features_of_lent_ones_and_the_buffer_only_grows() {
        // The CPU allocator stands in for CUDA's pinned one: the same view over a reused buffer.
        let model = super::super::tests::model();
        let mut v = lock(&model.vision);
        let mut staging = Staging {
            allocator: Allocator::default(),
            buffer: None,
            threads: 2,
            refuse: false,
        };
        let capacity = |s: &Staging| s.buffer.as_ref().map(|b| b.shape()[0]);
        for (h, w, cap) in [
            (56, 84, 3 * 56 * 84),
            (28, 56, 3 * 56 * 84),
            (84, 84, 3 * 84 * 84),
        ] {
            let px = pixels(h, w);
            let lent = encode(&mut v.session, None, &px, &mut None).unwrap();
            let staged = encode(&mut v.session, Some(&mut staging), &px, &mut None).unwrap();
            assert_eq!(staged, lent, "{h}×{w}");
            assert_eq!(lent.nrows(), (h / 28) * (w / 28));
            assert_eq!(capacity(&staging), Some(cap as i64), "{h}×{w}");
        }
    }

    #[test]
    fn a_staging_that_fails_gives_way_to_lent_pixels_for_good() {
        let model = super::super::tests::model();
        let px = pixels(56, 56);
        let lent = encode(&mut lock(&model.vision).session, None, &px, &mut None).unwrap();
        lock(&model.vision).staging = Some(Staging {
            allocator: Allocator::default(),
            buffer: None,
            threads: 2,
            refuse: true,
        });
        assert_eq!(model.vision_pixels(), "pinned");
        let got = run(&model.vision, &px, &mut None).unwrap();
        assert_eq!(got, lent);
        assert_eq!(model.vision_pixels(), "lent", "the staging is dropped");
    }

    /// A page's 8-bit pixels give the features of the same values held as float32, written
    /// into the staging buffer or into the array a lent run takes.
    #[test]
    fn eight_bit_pixels_give_the_features_of_their_float_values() {
        let model = super::super::tests::model();
        let mut v = lock(&model.vision);
        let (h, w) = (56, 84);
        let rgb: Vec<u8> = (0..3 * h * w).map(|i| (i * 37 % 256) as u8).collect();
        let lut = crate::model::preprocess::normalisation_table(&Default::default());
        let compact = Pixels::from_rgb(rgb, h, w, lut);
        let dense = Pixels::dense(compact.to_array());
        let want = encode(&mut v.session, None, &dense, &mut None).unwrap();
        let lent = encode(&mut v.session, None, &compact, &mut None).unwrap();
        let mut staging = Staging {
            allocator: Allocator::default(),
            buffer: None,
            threads: 3,
            refuse: false,
        };
        let staged = encode(&mut v.session, Some(&mut staging), &compact, &mut None).unwrap();
        assert_eq!(lent, want);
        assert_eq!(staged, want);
    }
}

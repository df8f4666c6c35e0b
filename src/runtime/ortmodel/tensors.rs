//! Tensor helpers: host data ↔ ONNX Runtime values in the graph's float type, and host
//! copies of values that live in an execution provider's memory.

use crate::runtime::backend::BackendError;
use half::f16;
use half::slice::HalfFloatSliceExt;
use ocrctl_exporters::graph::DType;
use ort::memory::AllocationDevice;
use ort::value::{DynTensor, DynTensorValueType, DynValue, Tensor, TensorValueTypeMarker, Value};
use std::borrow::Cow;

/// ONNX Runtime's element type for the activation type `act` (float16, else float32).
pub(super) fn element_type(act: DType) -> ort::value::TensorElementType {
    match act {
        DType::F16 => ort::value::TensorElementType::Float16,
        _ => ort::value::TensorElementType::Float32,
    }
}

/// A float tensor of the graph's activation type (`act`) from f32 data.
pub(super) fn float_tensor(
    act: DType,
    shape: Vec<i64>,
    data: Vec<f32>,
    part: &str,
) -> Result<DynTensor, BackendError> {
    match act {
        DType::F16 => float_tensor_from(act, shape, &data, part),
        _ => Tensor::from_array((shape, data))
            .map(|t| t.upcast())
            .map_err(|e| BackendError::runtime(part, e)),
    }
}

/// [`float_tensor`] from borrowed data: float16 is converted straight from the slice (no
/// float32 copy first). Conversions go through `half`'s slice routines (F16C/NEON where the
/// CPU has them): a page's pixels and a prompt's embeddings are millions of values, and
/// converting them one at a time cost milliseconds of every page's time to first token.
pub(super) fn float_tensor_from(
    act: DType,
    shape: Vec<i64>,
    data: &[f32],
    part: &str,
) -> Result<DynTensor, BackendError> {
    let r = match act {
        DType::F16 => {
            let mut h = vec![f16::ZERO; data.len()];
            h.convert_from_f32_slice(data);
            Tensor::from_array((shape, h)).map(|t| t.upcast())
        }
        _ => Tensor::from_array((shape, data.to_vec())).map(|t| t.upcast()),
    };
    r.map_err(|e| BackendError::runtime(part, e))
}

/// An int64 tensor.
pub(super) fn i64_tensor(
    shape: Vec<i64>,
    data: Vec<i64>,
    part: &str,
) -> Result<DynTensor, BackendError> {
    Tensor::from_array((shape, data))
        .map(|t| t.upcast())
        .map_err(|e| BackendError::runtime(part, e))
}

/// A session output as a tensor.
pub(super) fn as_tensor(v: DynValue, part: &str) -> Result<DynTensor, BackendError> {
    v.downcast::<DynTensorValueType>()
        .map_err(|e| BackendError::runtime(part, e))
}

/// Reads a float tensor (f32 or f16, in host memory) as f32 with its shape.
pub(super) fn read_f<V: TensorValueTypeMarker + ?Sized>(
    v: &Value<V>,
    part: &str,
) -> Result<(Vec<usize>, Vec<f32>), BackendError> {
    if let Ok((shape, data)) = v.try_extract_tensor::<f32>() {
        return Ok((shape.iter().map(|d| *d as usize).collect(), data.to_vec()));
    }
    let (shape, data) = v
        .try_extract_tensor::<f16>()
        .map_err(|e| BackendError::runtime(part, e))?;
    let mut f = vec![0f32; data.len()];
    data.convert_to_f32_slice(&mut f);
    Ok((shape.iter().map(|d| *d as usize).collect(), f))
}

/// The elements of `a` in row-major order, without a copy when `a` is already laid out so.
pub(super) fn into_row_major<D: ndarray::Dimension>(a: ndarray::Array<f32, D>) -> Vec<f32> {
    if !a.is_standard_layout() {
        return a.iter().copied().collect();
    }
    let n = a.len();
    let (mut v, offset) = a.into_raw_vec_and_offset();
    let offset = offset.unwrap_or(0);
    if offset > 0 || v.len() != n {
        v.drain(..offset);
        v.truncate(n);
    }
    v
}

/// `v` itself when its data is readable from the host, otherwise a copy in host memory
/// (a device-to-host transfer through ONNX Runtime).
pub(super) fn on_host<'a>(
    v: &'a DynTensor,
    part: &str,
) -> Result<Cow<'a, DynTensor>, BackendError> {
    if v.memory_info().is_cpu_accessible() {
        return Ok(Cow::Borrowed(v));
    }
    v.to(AllocationDevice::CPU, 0)
        .map(Cow::Owned)
        .map_err(|e| BackendError::runtime(part, format!("copying the KV cache to the host: {e}")))
}

/// Where a tensor's data is, e.g. `Cpu:0` or `Cuda:0`.
pub(super) fn location(v: &DynTensor) -> String {
    let m = v.memory_info();
    format!("{}:{}", m.allocation_device().as_str(), m.device_id())
}

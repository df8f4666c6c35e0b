//! Views of KV cache memory as ONNX Runtime values, bound in place.
//!
//! Written against ONNX Runtime's C API rather than ort's `TensorRefMut<T>` for two reasons:
//! an 8-bit cache's element types (int8 is one, float8 E4M3 has no Rust type in ort) must be
//! named at run time from the graph's inputs, and ort's `IoBinding::bind_input` copies a
//! tensor made over borrowed memory before binding it (a safety net for host arrays) — for
//! these views that copy would be the whole cache.

use super::PART;
use crate::runtime::backend::BackendError;
use ort::memory::{Allocator, MemoryInfo};
use ort::session::IoBinding;
use ort::value::{DynTensor, TensorElementType};
use ort::AsPointer;
use std::ffi::CStr;

/// An `OrtValue` over memory someone else owns; released (not the memory) when dropped.
#[derive(Debug)]
pub(crate) struct RawView(*mut ort::sys::OrtValue);

// SAFETY: an OrtValue that only refers to memory may move between threads; the memory's
// owner keeps it alive longer than every view (see the callers' safety comments).
unsafe impl Send for RawView {}

impl RawView {
    /// A `shape` tensor of `ty` at `ptr` in `mem`'s memory.
    ///
    /// # Safety
    /// `ptr` must address at least the tensor's bytes in `mem`'s memory, for as long as the
    /// view and every binding it is bound to live.
    pub unsafe fn new(
        mem: &MemoryInfo<'_>,
        ptr: *mut std::ffi::c_void,
        shape: &[i64],
        ty: TensorElementType,
    ) -> Result<RawView, BackendError> {
        let elems = shape.iter().product::<i64>().max(0) as usize;
        let bytes = ty.byte_size(elems).ok_or_else(|| {
            BackendError::runtime(PART, format!("no byte size for KV cache type {ty:?}"))
        })?;
        let mut value = std::ptr::null_mut();
        let api = ort::api();
        // SAFETY: the caller's contract for `ptr`; `mem` and `shape` outlive the call.
        let status = unsafe {
            (api.CreateTensorWithDataAsOrtValue)(
                mem.ptr(),
                ptr,
                bytes,
                shape.as_ptr(),
                shape.len(),
                ty.into(),
                &mut value,
            )
        };
        check(status, "creating a KV cache view")?;
        Ok(RawView(value))
    }

    /// Binds this view as input `name` of `b`, as is.
    pub fn bind_input(&self, b: &mut IoBinding, name: &CStr) -> Result<(), BackendError> {
        // SAFETY: both pointers come from live objects; ONNX Runtime keeps its own reference
        // to the OrtValue (which refers to the caller's memory) in the binding.
        let status = unsafe { (ort::api().BindInput)(b.ptr_mut(), name.as_ptr(), self.0) };
        check(status, &format!("binding {}", name.to_string_lossy()))
    }

    /// Binds this view as output `name` of `b` (the run writes into its memory). Through
    /// ort's `bind_output`, which must know every output it is to hand back: an output bound
    /// behind its back would shift the names of the outputs it returns.
    pub fn bind_output(self, b: &mut IoBinding, name: &str) -> Result<(), BackendError> {
        let ptr = std::ptr::NonNull::new(self.0).expect("created non-null");
        std::mem::forget(self);
        // SAFETY: a live tensor OrtValue whose ownership moves into the ort value (released
        // when the binding lets go of it); the allocator is only kept, never asked to free
        // memory the value does not own.
        let value = unsafe { DynTensor::from_ptr(ptr, Some(&Allocator::default())) };
        b.bind_output(name, value)
            .map_err(|e| BackendError::runtime(PART, format!("binding {name}: {e}")))
    }
}

impl Drop for RawView {
    fn drop(&mut self) {
        // SAFETY: created by CreateTensorWithDataAsOrtValue and released once, here.
        unsafe { (ort::api().ReleaseValue)(self.0) };
    }
}

/// `Ok` for a null status, else its message (the status released).
pub(super) fn check(status: ort::sys::OrtStatusPtr, what: &str) -> Result<(), BackendError> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status is an OrtStatus we own and must release.
    let msg = unsafe {
        let m = CStr::from_ptr((api.GetErrorMessage)(status.0))
            .to_string_lossy()
            .into_owned();
        (api.ReleaseStatus)(status.0);
        m
    };
    Err(BackendError::runtime(PART, format!("{what}: {msg}")))
}

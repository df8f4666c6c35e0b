//! A CUDA stream of the greatest priority for the decode steps ([`decode_stream`]).
//!
//! With the vision stage (and the prefill stage) the GPU runs two kinds of work at once:
//! compute-bound encoder and prefill GEMMs on the stages' streams, and a batch's decode step,
//! hundreds of short, memory-bound kernels, on the decoder session's stream. ONNX Runtime
//! creates its streams at the default (lowest) priority, so a decode kernel waits behind
//! every queued block of a large GEMM and the whole batch slows down for the page being
//! encoded. On a stream of higher priority the block scheduler starts the decode kernels'
//! blocks first as SMs free up, and the stages fill the rest.
//!
//! ONNX Runtime takes such a stream through the CUDA provider's `user_compute_stream`
//! option. It is made here with the driver API (`libcuda.so.1`, present wherever the CUDA
//! provider can run) in the device's primary context, the context ONNX Runtime's CUDA
//! runtime uses too; the CUDA runtime library would do the same but is only found once the
//! provider has been loaded. One stream per device, kept for the life of the process.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

type CuResult = c_int;

/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream,
/// as ONNX Runtime's own streams.
const NON_BLOCKING: c_uint = 1;

/// Streams made so far, by device ordinal (the handle as an address).
static STREAMS: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();

/// The greatest-priority stream of `device` (made on first use), as the address ONNX
/// Runtime's `user_compute_stream` takes; the reason when the driver refuses.
pub fn decode_stream(device: i32) -> Result<usize, String> {
    let streams = STREAMS.get_or_init(Default::default);
    let mut streams = streams.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = streams.get(&device) {
        return Ok(*s);
    }
    let s = create(device)?;
    streams.insert(device, s);
    Ok(s)
}

fn create(device: i32) -> Result<usize, String> {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
    // SAFETY: the NVIDIA driver library; the symbols below are called with the C signatures
    // of cuda.h, and the library is kept loaded (the stream lives in it).
    unsafe {
        let lib = Library::open(Some("libcuda.so.1"), RTLD_LAZY | RTLD_LOCAL)
            .map_err(|e| format!("libcuda.so.1: {e}"))?;
        let call = |name: &str, r: CuResult| {
            if r == 0 {
                Ok(())
            } else {
                Err(format!("{name} failed (CUresult {r})"))
            }
        };
        let init = lib
            .get::<unsafe extern "C" fn(c_uint) -> CuResult>(b"cuInit\0")
            .map_err(|e| e.to_string())?;
        let device_get = lib
            .get::<unsafe extern "C" fn(*mut c_int, c_int) -> CuResult>(b"cuDeviceGet\0")
            .map_err(|e| e.to_string())?;
        let retain = lib
            .get::<unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult>(
                b"cuDevicePrimaryCtxRetain\0",
            )
            .map_err(|e| e.to_string())?;
        let push = lib
            .get::<unsafe extern "C" fn(*mut c_void) -> CuResult>(b"cuCtxPushCurrent_v2\0")
            .map_err(|e| e.to_string())?;
        let pop = lib
            .get::<unsafe extern "C" fn(*mut *mut c_void) -> CuResult>(b"cuCtxPopCurrent_v2\0")
            .map_err(|e| e.to_string())?;
        let range = lib
            .get::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> CuResult>(
                b"cuCtxGetStreamPriorityRange\0",
            )
            .map_err(|e| e.to_string())?;
        let stream_create = lib
            .get::<unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> CuResult>(
                b"cuStreamCreateWithPriority\0",
            )
            .map_err(|e| e.to_string())?;
        call("cuInit", init(0))?;
        let mut dev: c_int = 0;
        call("cuDeviceGet", device_get(&mut dev, device))?;
        // The primary context stays retained: ONNX Runtime's runtime calls use it, and the
        // stream belongs to it.
        let mut ctx: *mut c_void = std::ptr::null_mut();
        call("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
        call("cuCtxPushCurrent", push(ctx))?;
        let (mut least, mut greatest) = (0, 0);
        let made = call(
            "cuCtxGetStreamPriorityRange",
            range(&mut least, &mut greatest),
        )
        .and_then(|()| {
            let mut s: *mut c_void = std::ptr::null_mut();
            call(
                "cuStreamCreateWithPriority",
                stream_create(&mut s, NON_BLOCKING, greatest),
            )
            .map(|()| s as usize)
        });
        let mut popped: *mut c_void = std::ptr::null_mut();
        let _ = pop(&mut popped);
        std::mem::forget(lib);
        let s = made?;
        tracing::debug!(device, priority = greatest, least, "decode stream created");
        Ok(s)
    }
}

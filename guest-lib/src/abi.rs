//! The C types of the driver API and checked access to the pointers an
//! application passes in.

use std::ffi::{c_char, c_int, c_void, CStr};

use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;

pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;

/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// Stores `value` through an out-parameter; NULL is `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn write_out<T>(ptr: *mut T, value: T) -> Result<(), u32> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the driver API contract makes a non-NULL
    // out-parameter point to writable, aligned storage for a T.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Stores `value` through an out-parameter the API allows to be NULL.
pub(crate) fn write_optional<T>(ptr: *mut T, value: T) {
    if !ptr.is_null() {
        // SAFETY: as in `write_out`.
        unsafe { ptr.write(value) };
    }
}

/// Reads a NUL-terminated string argument; NULL is `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn c_str<'a>(ptr: *const c_char) -> Result<&'a CStr, u32> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a NUL-terminated string
    // that outlives the call.
    Ok(unsafe { CStr::from_ptr(ptr) })
}

/// The `len` bytes at `ptr` (an application buffer).
pub(crate) fn bytes<'a>(ptr: *const c_void, len: usize) -> Result<&'a [u8], u32> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() || len > isize::MAX as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and in range; the API contract makes it `len`
    // readable bytes for the duration of the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// The `len` writable bytes at `ptr` (an application buffer).
pub(crate) fn bytes_mut<'a>(ptr: *mut c_void, len: usize) -> Result<&'a mut [u8], u32> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() || len > isize::MAX as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and in range; the API contract makes it `len`
    // writable bytes, not aliased by us, for the duration of the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

/// Copies `text` into a C buffer of `len` bytes, truncated, NUL-terminated.
pub(crate) fn write_c_string(dst: *mut c_char, len: c_int, text: &str) -> Result<(), u32> {
    let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if dst.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let out = bytes_mut(dst.cast(), len)?;
    let n = text.len().min(len - 1);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out[n] = 0;
    Ok(())
}

//! `cuMemcpy`/`cuMemcpyAsync`: copies between unified addresses, whose
//! direction the guest finds itself: an address inside a device range this
//! process may name (an allocation of any of its contexts, or a module
//! global: [`crate::device_ranges`]) is device memory, anything else is
//! host memory (page-locked or not: the host-side paths tell those apart).
//! A device side that runs past its range is `CUDA_ERROR_INVALID_VALUE`.

use std::ffi::c_void;

use crate::abi::{CUdeviceptr, CUstream};
use crate::api::memory::{dtod_unchecked, dtoh_unchecked, htod_unchecked};
use crate::device_ranges;
use crate::state::{current, resolve_stream, sync_stream, Context};

fn copy(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    // One lookup tells the direction and checks the device sides.
    match device_ranges::classify([dst, src], len as u64)? {
        [true, true] => dtod_unchecked(ctx, stream, dst, src, len, sync),
        [true, false] => htod_unchecked(ctx, stream, dst, src as *const c_void, len, sync),
        // Into host memory the copy completes before returning either way.
        [false, true] => dtoh_unchecked(ctx, stream, dst as *mut c_void, src, len, true),
        [false, false] => {
            if sync {
                ctx.call(&rgpu_proto::Command::StreamSynchronize { stream })?;
            }
            // SAFETY: two host buffers of `len` bytes from the caller (the
            // API contract); `copy` allows them to overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            Ok(())
        }
    }
}

pub(crate) fn memcpy(dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<(), u32> {
    copy(current()?.as_ref(), sync_stream(false), dst, src, len, true)
}

pub(crate) fn memcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<(), u32> {
    copy(current()?.as_ref(), sync_stream(true), dst, src, len, true)
}

pub(crate) fn memcpy_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, false)?;
    copy(&ctx, stream, dst, src, len, false)
}

pub(crate) fn memcpy_async_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, true)?;
    copy(&ctx, stream, dst, src, len, false)
}

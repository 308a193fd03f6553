//! `cuMemcpy`/`cuMemcpyAsync`: copies between unified addresses, whose
//! direction the guest finds itself: an address inside a device range this
//! process may name (an allocation of any of its contexts, or a module
//! global: [`crate::device_ranges`]) is device memory, anything else is
//! host memory (page-locked or not: the host-side paths tell those apart).
//! A device side that runs past its range is `CUDA_ERROR_INVALID_VALUE`.
//! A side in another carrier's device memory (`RGPU_DEVICES`) is reached
//! through a context of that device ([`crate::api::peer`]).

use std::ffi::c_void;

use crate::abi::{CUdeviceptr, CUstream};
use crate::api::memory::{dtod_unchecked, dtoh_unchecked, htod_unchecked};
use crate::api::peer;
use crate::device_ranges::{self, Location};
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
    let [to, from] = device_ranges::locate(ctx.space, [(dst, len as u64), (src, len as u64)])?;
    let (dst_owner, src_owner) = match (to, from) {
        (Location::Nowhere, Location::Nowhere) => (None, None),
        (Location::Nowhere, from) => (None, peer::owner(from)?),
        (to, Location::Nowhere) => (peer::owner(to)?, None),
        (to, from) => (peer::owner(to)?, peer::owner(from)?),
    };
    let dst_ctx = dst_owner.as_deref().unwrap_or(ctx);
    let src_ctx = src_owner.as_deref().unwrap_or(ctx);
    match (to, from) {
        (Location::Here, Location::Here) => dtod_unchecked(ctx, stream, dst, src, len, sync),
        (Location::Nowhere, Location::Nowhere) => {
            if sync {
                ctx.call(&rgpu_proto::Command::StreamSynchronize { stream })?;
            }
            // SAFETY: two host buffers of `len` bytes from the caller (the
            // API contract); `copy` allows them to overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            Ok(())
        }
        (_, Location::Nowhere) => peer::run_on(ctx, stream, dst_ctx, sync, |c, s, sync| {
            htod_unchecked(c, s, dst, src as *const c_void, len, sync)
        }),
        // Into host memory the copy completes before returning either way.
        (Location::Nowhere, _) => peer::run_on(ctx, stream, src_ctx, true, |c, s, _| {
            dtoh_unchecked(c, s, dst as *mut c_void, src, len, true)
        }),
        _ => peer::device_to_device(ctx, stream, (dst_ctx, dst), (src_ctx, src), len, sync),
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

//! `cuMemcpy`/`cuMemcpyAsync`: copies between unified addresses, whose
//! direction the guest finds itself: an address inside a device range this
//! process may name (an allocation of any of its contexts, or a module
//! global: `crate::device_ranges`) is device memory, anything else is
//! host memory (page-locked or not: the host-side paths tell those apart).
//! A device side that runs past its range is `CUDA_ERROR_INVALID_VALUE`.
//! A side in another carrier's device memory (`RGPU_DEVICES`) is reached
//! through a context of that device ([`crate::api::peer`]).

use std::ffi::c_void;

use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;

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
    let [mut to, mut from] =
        device_ranges::locate(ctx.space, [(dst, len as u64), (src, len as u64)])?;
    // Page-locked memory of this process only (network carrier) is host
    // memory, whatever device memory on the host its address might name.
    for (side, ptr) in [(&mut to, dst), (&mut from, src)] {
        if crate::pinned::host_cannot_reach(ptr, len as u64) {
            *side = Location::Nowhere;
        }
    }
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
            // Made here, now: a capture would not record it.
            crate::api::memory::refuse_captured_over_network(ctx, stream, "cuMemcpyAsync")?;
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

/// Copies one `cuMemcpyBatchAsync` takes at most.
const MAX_BATCH_COPIES: usize = 65536;

/// `cuMemcpyBatchAsync`: each copy as `cuMemcpyAsync` makes it, in order
/// on `stream` (not the legacy stream). The attributes are hints (access order, location hints)
/// that the copies, each ordered on the stream, already satisfy; `attrs`
/// is checked present. The index of the copy that failed goes to
/// `fail_index` (`usize::MAX`: none, or the call's shape).
#[allow(clippy::too_many_arguments)]
fn batch_async_on(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const c_void,
    attrs_indices: *const usize,
    num_attrs: usize,
    fail_index: *mut usize,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), u32> {
    if !fail_index.is_null() {
        // SAFETY: non-NULL; the caller passes a writable size_t.
        unsafe { fail_index.write(usize::MAX) };
    }
    if count == 0
        || count > MAX_BATCH_COPIES
        || dsts.is_null()
        || srcs.is_null()
        || sizes.is_null()
        || num_attrs == 0
        || num_attrs > count
        || attrs.is_null()
        || attrs_indices.is_null()
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Not on the legacy stream, the driver says.
    if stream.is_null() && !per_thread {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, stream) = resolve_stream(stream, per_thread)?;
    // SAFETY: non-NULL, `count` entries each (the API contract), bounded.
    let (dsts, srcs, sizes) = unsafe {
        (
            std::slice::from_raw_parts(dsts, count),
            std::slice::from_raw_parts(srcs, count),
            std::slice::from_raw_parts(sizes, count),
        )
    };
    for (i, ((dst, src), len)) in dsts.iter().zip(srcs).zip(sizes).enumerate() {
        if let Err(code) = copy(&ctx, stream, *dst, *src, *len, false) {
            if !fail_index.is_null() {
                // SAFETY: as above.
                unsafe { fail_index.write(i) };
            }
            return Err(code);
        }
    }
    Ok(())
}

/// `cuMemcpyBatchAsync` (CUDA 12.8: with a failure index).
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_async(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const c_void,
    attrs_indices: *const usize,
    num_attrs: usize,
    fail_index: *mut usize,
    stream: CUstream,
) -> Result<(), u32> {
    batch_async_on(
        dsts,
        srcs,
        sizes,
        count,
        attrs,
        attrs_indices,
        num_attrs,
        fail_index,
        stream,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_async_ptsz(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const c_void,
    attrs_indices: *const usize,
    num_attrs: usize,
    fail_index: *mut usize,
    stream: CUstream,
) -> Result<(), u32> {
    batch_async_on(
        dsts,
        srcs,
        sizes,
        count,
        attrs,
        attrs_indices,
        num_attrs,
        fail_index,
        stream,
        true,
    )
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13: no failure index).
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_async_v2(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const c_void,
    attrs_indices: *const usize,
    num_attrs: usize,
    stream: CUstream,
) -> Result<(), u32> {
    batch_async_on(
        dsts,
        srcs,
        sizes,
        count,
        attrs,
        attrs_indices,
        num_attrs,
        std::ptr::null_mut(),
        stream,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_async_v2_ptsz(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const c_void,
    attrs_indices: *const usize,
    num_attrs: usize,
    stream: CUstream,
) -> Result<(), u32> {
    batch_async_on(
        dsts,
        srcs,
        sizes,
        count,
        attrs,
        attrs_indices,
        num_attrs,
        std::ptr::null_mut(),
        stream,
        true,
    )
}

//! Copies between devices, and peer access.
//!
//! With `RGPU_DEVICES` each device is behind a carrier of its own: its
//! memory lives on its own daemon, which no other device's kernels or copies
//! can reach. So no device has peer access to another
//! (`cuDeviceCanAccessPeer` answers 0, `cuCtxEnablePeerAccess`
//! `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`), and a copy between two carriers'
//! devices (`cuMemcpyPeer`, and `cuMemcpyDtoD`/`cuMemcpy` whose pointers
//! belong to different devices) is staged through this process: read
//! through the source context's channel into a buffer, written through the
//! destination's, a few MiB at a time. Copies within one carrier stay one
//! device-to-device command.
//!
//! Ordering: a stream belongs to one context. The side of a copy that is
//! the stream's context runs on that stream; the other side runs on its
//! context's default stream and is waited for. When the stream's context is
//! neither side, its stream is drained first. Waiting is stronger than the
//! stream order the application asked for, never weaker.

use std::ffi::c_uint;
use std::sync::Arc;

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{CUcontext, CUdeviceptr, CUstream};
use crate::api::memory::dtod_unchecked;
use crate::device_ranges::{self, Location};
use crate::state::{
    context_by_id, current, driver, resolve_stream, sync_stream, Context, CONTEXTS,
};

/// The piece a staged copy moves at once: the buffer it allocates.
const PIECE: usize = 4 << 20;

/// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, `..._NOT_ENABLED` (cuda.h).
const PEER_ACCESS_UNSUPPORTED: u32 = 217;
const PEER_ACCESS_NOT_ENABLED: u32 = 705;

/// The context through which memory at `location` is reached: `None` for
/// the asking context's own space, the owner of another space's memory.
pub(crate) fn owner(location: Location) -> Result<Option<Arc<Context>>, u32> {
    match location {
        Location::Here => Ok(None),
        Location::Elsewhere { context, .. } => context_by_id(context)
            .map(Some)
            // Its context was destroyed since: the memory went with it.
            .ok_or(CUDA_ERROR_INVALID_VALUE),
        Location::Nowhere => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn same(a: &Context, b: &Context) -> bool {
    a.id == b.id
}

/// The default stream of another context that matches `stream`'s kind: the
/// per-thread one for the `_ptds`/`_ptsz` forms' streams, else the legacy
/// one.
fn default_like(stream: u32) -> u32 {
    sync_stream(stream == rgpu_proto::STREAM_PER_THREAD)
}

/// Waits until `stream` of `ctx` has done what was queued on it.
fn drain(ctx: &Context, stream: u32) -> Result<(), u32> {
    ctx.call(&Command::StreamSynchronize { stream }).map(|_| ())
}

/// Runs `copy(context, stream, sync)` for a copy on `stream` of `ctx` whose
/// memory is `target`'s: as asked on `ctx` itself, else on `target`'s
/// default stream, waited for, once `stream` has drained.
pub(crate) fn run_on(
    ctx: &Context,
    stream: u32,
    target: &Context,
    sync: bool,
    copy: impl FnOnce(&Context, u32, bool) -> Result<(), u32>,
) -> Result<(), u32> {
    if same(ctx, target) {
        return copy(ctx, stream, sync);
    }
    drain(ctx, stream)?;
    copy(target, default_like(stream), true)
}

fn result(code: u32) -> Result<(), u32> {
    match code {
        CUDA_SUCCESS => Ok(()),
        code => Err(code),
    }
}

/// A copy of `len` bytes from `src` (device memory of `src.0`) to `dst`
/// (device memory of `dst.0`), asked on `stream` of `ctx`.
pub(crate) fn device_to_device(
    ctx: &Context,
    stream: u32,
    dst: (&Context, CUdeviceptr),
    src: (&Context, CUdeviceptr),
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    let ((dst_ctx, dst), (src_ctx, src)) = (dst, src);
    if len == 0 {
        return Ok(());
    }
    if dst_ctx.space == src_ctx.space {
        // One daemon: one device-to-device command, in any of its contexts
        // (they share the daemon's worker process and its addresses).
        let target = if ctx.space == dst_ctx.space {
            ctx
        } else {
            dst_ctx
        };
        return run_on(ctx, stream, target, sync, |c, s, sync| {
            dtod_unchecked(c, s, dst, src, len, sync)
        });
    }
    let (src_stream, dst_stream, write_sync) = if same(ctx, src_ctx) {
        (stream, default_like(stream), true)
    } else if same(ctx, dst_ctx) {
        // The read is done before the write is queued: the write may stay
        // asynchronous, in order on the stream.
        (default_like(stream), stream, sync)
    } else {
        drain(ctx, stream)?;
        (default_like(stream), default_like(stream), true)
    };
    log::debug!(
        "rgpu: staging {len} bytes from device {} ({src:#x}) to device {} ({dst:#x})",
        src_ctx.device,
        dst_ctx.device
    );
    let mut buffer = vec![0u8; len.min(PIECE)];
    let mut done = 0usize;
    while done < len {
        let piece_len = PIECE.min(len - done);
        let piece = buffer.get_mut(..piece_len).ok_or(CUDA_ERROR_UNKNOWN)?;
        let offset = done as u64;
        result(
            src_ctx.with_channel(|c| {
                c.copy_from_device(src_stream, piece, src.wrapping_add(offset))
            })?,
        )?;
        result(dst_ctx.with_channel(|c| {
            c.copy_to_device(dst_stream, dst.wrapping_add(offset), piece, write_sync)
        })?)?;
        done += piece_len;
    }
    Ok(())
}

/// A live context argument; NULL is not one (peer calls name both).
fn context_arg(handle: CUcontext) -> Result<Arc<Context>, u32> {
    driver()?;
    CONTEXTS
        .get(handle)
        .filter(|c| c.is_alive())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// `cuMemcpyPeer(Async)`: both pointers must be their context's device
/// memory.
fn memcpy_peer(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    len: usize,
    on: Option<(Arc<Context>, u32)>,
    per_thread: bool,
) -> Result<(), u32> {
    let dst_ctx = context_arg(dst_context)?;
    let src_ctx = context_arg(src_context)?;
    if len == 0 {
        return Ok(());
    }
    let len64 = len as u64;
    device_ranges::check(dst_ctx.space, &[(dst, len64)])?;
    device_ranges::check(src_ctx.space, &[(src, len64)])?;
    let (ctx, stream, sync) = match on {
        Some((ctx, stream)) => (ctx, stream, false),
        // The synchronous form: on the destination's default stream.
        None => (dst_ctx.clone(), sync_stream(per_thread), true),
    };
    device_to_device(&ctx, stream, (&dst_ctx, dst), (&src_ctx, src), len, sync)
}

pub(crate) fn memcpy_peer_sync(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    len: usize,
) -> Result<(), u32> {
    memcpy_peer(dst, dst_context, src, src_context, len, None, false)
}

pub(crate) fn memcpy_peer_sync_ptds(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    len: usize,
) -> Result<(), u32> {
    memcpy_peer(dst, dst_context, src, src_context, len, None, true)
}

pub(crate) fn memcpy_peer_async(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let on = resolve_stream(stream, false)?;
    memcpy_peer(dst, dst_context, src, src_context, len, Some(on), false)
}

pub(crate) fn memcpy_peer_async_ptsz(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let on = resolve_stream(stream, true)?;
    memcpy_peer(dst, dst_context, src, src_context, len, Some(on), true)
}

/// The checks `cuCtxEnablePeerAccess` and `cuCtxDisablePeerAccess` share:
/// a current context, and a live peer that is not it.
fn peer_of_current(peer_context: CUcontext) -> Result<(Arc<Context>, Arc<Context>), u32> {
    let ctx = current()?;
    let peer = context_arg(peer_context)?;
    if same(&ctx, &peer) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok((ctx, peer))
}

/// No device has peer access to another (see the module documentation).
/// Two contexts of one device answer as NVIDIA's driver does for them.
pub(crate) fn enable_peer_access(peer_context: CUcontext, flags: c_uint) -> Result<(), u32> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, peer) = peer_of_current(peer_context)?;
    if ctx.device == peer.device {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    log::debug!(
        "rgpu: cuCtxEnablePeerAccess: device {} cannot reach device {}'s memory",
        ctx.device,
        peer.device
    );
    Err(PEER_ACCESS_UNSUPPORTED)
}

/// Never enabled (see [`enable_peer_access`]).
pub(crate) fn disable_peer_access(peer_context: CUcontext) -> Result<(), u32> {
    peer_of_current(peer_context)?;
    Err(PEER_ACCESS_NOT_ENABLED)
}

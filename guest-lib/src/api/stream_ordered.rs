//! Stream-ordered work the host cannot do for the guest: allocations
//! (`cuMemAllocAsync`/`cuMemFreeAsync`, served by ordinary allocations from
//! the device's current pool (`api::memory_pool`), which are valid at once
//! and freed in order with the channel's commands) and
//! host functions (`cuLaunchHostFunc`: the stream is drained, then the
//! function runs on the calling thread, so it still sees all work queued
//! before it and nothing queued after it runs first).

use std::ffi::c_void;

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{CUdeviceptr, CUstream};
use crate::api::memory::free;
use crate::api::memory_pool;
use crate::state::resolve_stream;

/// `CUhostFn`.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

fn ordered_on(stream: CUstream, per_thread: bool) -> Result<(), u32> {
    // Resolving checks the stream handle, as the driver does.
    resolve_stream(stream, per_thread).map(|_| ())
}

pub(crate) fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> Result<(), u32> {
    ordered_on(stream, false)?;
    memory_pool::alloc_async_from_current(dptr, size, stream, false)
}

pub(crate) fn alloc_async_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> Result<(), u32> {
    ordered_on(stream, true)?;
    memory_pool::alloc_async_from_current(dptr, size, stream, true)
}

pub(crate) fn free_async(dptr: CUdeviceptr, stream: CUstream) -> Result<(), u32> {
    ordered_on(stream, false)?;
    free(dptr)?;
    memory_pool::forget(dptr);
    Ok(())
}

pub(crate) fn free_async_ptsz(dptr: CUdeviceptr, stream: CUstream) -> Result<(), u32> {
    ordered_on(stream, true)?;
    free(dptr)?;
    memory_pool::forget(dptr);
    Ok(())
}

fn launch_host_func_on(
    stream: CUstream,
    function: HostFn,
    user_data: *mut c_void,
    per_thread: bool,
) -> Result<(), u32> {
    let function = function.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if crate::api::graph::capture_of(&ctx, handle).is_some() {
        // Natively a host node of the graph; here the function runs after
        // a synchronize, which a capturing stream refuses (and the refusal
        // would end the capture): refused before the host is asked.
        log::warn!("rgpu: cuLaunchHostFunc on a capturing stream (a host node) is not supported");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    ctx.call(&Command::StreamSynchronize { stream: handle })?;
    // SAFETY: the caller's host function and its argument (the API
    // contract), called once, as the driver would.
    unsafe { function(user_data) };
    Ok(())
}

pub(crate) fn launch_host_func(
    stream: CUstream,
    function: HostFn,
    user_data: *mut c_void,
) -> Result<(), u32> {
    launch_host_func_on(stream, function, user_data, false)
}

pub(crate) fn launch_host_func_ptsz(
    stream: CUstream,
    function: HostFn,
    user_data: *mut c_void,
) -> Result<(), u32> {
    launch_host_func_on(stream, function, user_data, true)
}

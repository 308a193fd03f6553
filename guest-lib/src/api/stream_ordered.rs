//! Stream-ordered work the host cannot do for the guest: allocations
//! (`cuMemAllocAsync`/`cuMemFreeAsync`, served by ordinary allocations from
//! the device's current pool (`api::memory_pool`), which are valid at once
//! and freed in order with the channel's commands) and
//! host functions (`cuLaunchHostFunc`: in stream order on a runner thread,
//! through gates the stream's memory operations raise and wait on, see
//! `crate::host_functions`; where the host's GPU cannot reach page-locked
//! memory, the stream is drained and the function runs on the calling
//! thread, so it still sees all work queued before it and nothing queued
//! after it runs first).

use std::ffi::{c_int, c_uint, c_void};

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{CUdeviceptr, CUstream};
use crate::api::memory::free;
use crate::api::memory_pool;
use crate::device_ranges::{self, Location};
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
    let function = crate::host_functions::checked(function)?;
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    let captured = crate::api::graph::capture_of(&ctx, handle).is_some();
    if crate::host_functions::launch(&ctx, handle, function, user_data, captured)? {
        return Ok(());
    }
    if captured {
        // Natively a host node of the graph; without a gate the function
        // would run after a synchronize, which a capturing stream refuses
        // (and the refusal would end the capture): refused first.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            log::warn!(
                "rgpu: cuLaunchHostFunc on a capturing stream is not supported where the host's \
                 GPU cannot reach page-locked memory (as over the network carrier, which shares \
                 no memory with the host)"
            );
        });
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

/// `cuStreamWriteValue*` / `cuStreamWaitValue*`: a stream memory operation
/// on `width` bytes at `address`, which must be device memory of this
/// process (an allocation, or page-locked memory by its device address).
#[allow(clippy::too_many_arguments)]
fn memory_operation_on(
    stream: CUstream,
    address: CUdeviceptr,
    value: u64,
    width: u32,
    flags: c_uint,
    wait: bool,
    per_thread: bool,
) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if !address.is_multiple_of(u64::from(width)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let call = if wait {
        "cuStreamWaitValue"
    } else {
        "cuStreamWriteValue"
    };
    crate::pinned::refuse_as_device(call, address, u64::from(width))?;
    match device_ranges::locate(ctx.space, [(address, u64::from(width))])? {
        [Location::Here] => {}
        _ => {
            log::debug!("rgpu: stream memory operation at {address:#x}: not this process's memory");
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let command = if wait {
        Command::StreamWaitValue {
            stream: handle,
            width,
            address,
            value,
            flags,
        }
    } else {
        Command::StreamWriteValue {
            stream: handle,
            width,
            address,
            value,
            flags,
        }
    };
    ctx.send(&command)
}

fn memory_operation(
    stream: CUstream,
    address: CUdeviceptr,
    value: u64,
    width: u32,
    flags: c_uint,
    wait: bool,
) -> Result<(), u32> {
    memory_operation_on(stream, address, value, width, flags, wait, false)
}

/// `CUstreamBatchMemOpParams`: 48 bytes, the operation first; a wait or
/// write has its address at byte 8, its value at 16 and flags at 24.
#[repr(C)]
pub struct BatchMemOpParams {
    operation: c_uint,
    pad: c_uint,
    address: CUdeviceptr,
    value: u64,
    flags: c_uint,
    pad2: c_uint,
    alias: CUdeviceptr,
    reserved: u64,
}

/// Operations one `cuStreamBatchMemOp` takes at most.
const MAX_BATCH_OPS: c_uint = 256;

/// `cuStreamBatchMemOp`: its waits and writes of 32 and 64 bits, in
/// order, as the single calls do; a memory barrier or a flush of remote
/// writes is CUDA_ERROR_NOT_SUPPORTED (said once).
fn batch_mem_op_on(
    stream: CUstream,
    count: c_uint,
    params: *const BatchMemOpParams,
    flags: c_uint,
    per_thread: bool,
) -> Result<(), u32> {
    if count == 0 || count > MAX_BATCH_OPS || params.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, `count` entries (the API contract), bounded.
    let params = unsafe { std::slice::from_raw_parts(params, count as usize) };
    // Checked whole before any is queued.
    let kinds: Vec<(u32, bool)> = params
        .iter()
        .map(|op| match op.operation {
            1 => Ok((4, true)),
            2 => Ok((4, false)),
            4 => Ok((8, true)),
            5 => Ok((8, false)),
            other => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    log::warn!(
                        "rgpu: cuStreamBatchMemOp: operation {other} (a barrier or a flush) is \
                         not supported"
                    );
                });
                Err(CUDA_ERROR_NOT_SUPPORTED)
            }
        })
        .collect::<Result<_, u32>>()?;
    for (op, (width, wait)) in params.iter().zip(kinds) {
        memory_operation_on(
            stream, op.address, op.value, width, op.flags, wait, per_thread,
        )?;
    }
    Ok(())
}

pub(crate) fn batch_mem_op(
    stream: CUstream,
    count: c_uint,
    params: *const BatchMemOpParams,
    flags: c_uint,
) -> Result<(), u32> {
    batch_mem_op_on(stream, count, params, flags, false)
}

pub(crate) fn batch_mem_op_ptsz(
    stream: CUstream,
    count: c_uint,
    params: *const BatchMemOpParams,
    flags: c_uint,
) -> Result<(), u32> {
    batch_mem_op_on(stream, count, params, flags, true)
}

/// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` and
/// `..._CAN_USE_64_BIT_STREAM_MEM_OPS_V1`.
const STREAM_MEM_OPS_V1: c_int = 92;
const STREAM_MEM_OPS_64_BIT_V1: c_int = 93;

/// The entry points without `_v2` (what programs built before CUDA 12
/// call) work only where the host's device says so: driver 580 on the
/// H200 answers 0 and the calls CUDA_ERROR_NOT_SUPPORTED, so rgpu does too.
fn v1_allowed(stream: CUstream, per_thread: bool, wide: bool) -> Result<(), u32> {
    let (ctx, _) = resolve_stream(stream, per_thread)?;
    let can = |attribute| crate::api::device::attribute(ctx.device, attribute).unwrap_or(0) != 0;
    if can(STREAM_MEM_OPS_V1) && (!wide || can(STREAM_MEM_OPS_64_BIT_V1)) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}

pub(crate) fn write_value32_v1(
    stream: CUstream,
    address: CUdeviceptr,
    value: c_uint,
    flags: c_uint,
) -> Result<(), u32> {
    v1_allowed(stream, false, false)?;
    write_value32(stream, address, value, flags)
}

pub(crate) fn write_value64_v1(
    stream: CUstream,
    address: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> Result<(), u32> {
    v1_allowed(stream, false, true)?;
    write_value64(stream, address, value, flags)
}

pub(crate) fn wait_value32_v1(
    stream: CUstream,
    address: CUdeviceptr,
    value: c_uint,
    flags: c_uint,
) -> Result<(), u32> {
    v1_allowed(stream, false, false)?;
    wait_value32(stream, address, value, flags)
}

pub(crate) fn wait_value64_v1(
    stream: CUstream,
    address: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> Result<(), u32> {
    v1_allowed(stream, false, true)?;
    wait_value64(stream, address, value, flags)
}

pub(crate) fn batch_mem_op_v1(
    stream: CUstream,
    count: c_uint,
    params: *const BatchMemOpParams,
    flags: c_uint,
) -> Result<(), u32> {
    v1_allowed(stream, false, false)?;
    batch_mem_op(stream, count, params, flags)
}

pub(crate) fn batch_mem_op_v1_ptsz(
    stream: CUstream,
    count: c_uint,
    params: *const BatchMemOpParams,
    flags: c_uint,
) -> Result<(), u32> {
    v1_allowed(stream, true, false)?;
    batch_mem_op_ptsz(stream, count, params, flags)
}

pub(crate) fn write_value32(
    stream: CUstream,
    address: CUdeviceptr,
    value: c_uint,
    flags: c_uint,
) -> Result<(), u32> {
    memory_operation(stream, address, value.into(), 4, flags, false)
}

pub(crate) fn write_value64(
    stream: CUstream,
    address: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> Result<(), u32> {
    memory_operation(stream, address, value, 8, flags, false)
}

pub(crate) fn wait_value32(
    stream: CUstream,
    address: CUdeviceptr,
    value: c_uint,
    flags: c_uint,
) -> Result<(), u32> {
    memory_operation(stream, address, value.into(), 4, flags, true)
}

pub(crate) fn wait_value64(
    stream: CUstream,
    address: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> Result<(), u32> {
    memory_operation(stream, address, value, 8, flags, true)
}

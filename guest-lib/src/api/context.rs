//! Contexts created with `cuCtxCreate`, the per-thread context stack, and
//! the context queries (local except synchronize and the limits).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;

use crate::abi::{write_optional, write_out, CUcontext, CUdevice};
use crate::api::module::{check_cache_config, check_shared_mem_config};
use crate::state::{self, context_or_current, current, driver, Context, CONTEXTS};

/// The API version reported for every context (the `_v2` context API).
const CONTEXT_API_VERSION: c_uint = 3020;
/// Stream priorities of current NVIDIA GPUs: 0 (least) to -5 (greatest).
const LEAST_STREAM_PRIORITY: c_int = 0;
const GREATEST_STREAM_PRIORITY: c_int = -5;
/// `CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE`.
const SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE: c_int = 1;

/// `CUctxCreateParams`.
#[repr(C)]
pub struct CtxCreateParams {
    pub exec_affinity_params: *mut c_void,
    pub num_exec_affinity_params: c_int,
    pub cig_params: *mut c_void,
}

fn create_context(pctx: *mut CUcontext, flags: c_uint, device: CUdevice) -> Result<(), u32> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = Context::open(driver()?, device, flags, false)?;
    let handle = CONTEXTS.insert(ctx.clone());
    state::push_current(ctx);
    write_out(pctx, handle)
}

pub(crate) fn create(pctx: *mut CUcontext, flags: c_uint, device: CUdevice) -> Result<(), u32> {
    create_context(pctx, flags, device)
}

/// Execution-affinity parameters are ignored: the host schedules its GPU.
pub(crate) fn create_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    device: CUdevice,
) -> Result<(), u32> {
    if num_params > 0 {
        log::debug!(
            "rgpu: cuCtxCreate_v3: ignoring {num_params} affinity parameter(s) at {params:?}"
        );
    }
    create_context(pctx, flags, device)
}

pub(crate) fn create_v4(
    pctx: *mut CUcontext,
    params: *mut CtxCreateParams,
    flags: c_uint,
    device: CUdevice,
) -> Result<(), u32> {
    if !params.is_null() {
        // SAFETY: non-NULL; the API contract makes it a CUctxCreateParams.
        let p = unsafe { params.read() };
        if !p.cig_params.is_null() {
            // CUDA-in-graphics sharing needs a graphics API on the host.
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if p.num_exec_affinity_params > 0 {
            log::debug!("rgpu: cuCtxCreate_v4: ignoring affinity parameters");
        }
    }
    create_context(pctx, flags, device)
}

pub(crate) fn destroy(ctx: CUcontext) -> Result<(), u32> {
    driver()?;
    let context = CONTEXTS
        .get(ctx)
        .filter(|c| !c.primary)
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    CONTEXTS.remove(ctx);
    state::forget_current(&context);
    context.close();
    crate::context_storage::context_destroyed(ctx);
    Ok(())
}

pub(crate) fn push_current(ctx: CUcontext) -> Result<(), u32> {
    if ctx.is_null() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    state::push_current(context_or_current(ctx)?);
    Ok(())
}

pub(crate) fn pop_current(pctx: *mut CUcontext) -> Result<(), u32> {
    driver()?;
    let ctx = state::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    write_optional(pctx, Arc::as_ptr(&ctx) as CUcontext);
    Ok(())
}

pub(crate) fn set_current(ctx: CUcontext) -> Result<(), u32> {
    let ctx = if ctx.is_null() {
        driver()?;
        None
    } else {
        Some(context_or_current(ctx)?)
    };
    state::set_current(ctx);
    Ok(())
}

pub(crate) fn get_current(pctx: *mut CUcontext) -> Result<(), u32> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let handle = state::current_or_none()
        .ok()
        .flatten()
        .map_or(std::ptr::null_mut(), |c| Arc::as_ptr(&c) as CUcontext);
    write_out(pctx, handle)
}

pub(crate) fn get_device(device: *mut CUdevice) -> Result<(), u32> {
    if device.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(device, current()?.device)
}

pub(crate) fn get_device_v2(device: *mut CUdevice, ctx: CUcontext) -> Result<(), u32> {
    if device.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(device, context_or_current(ctx)?.device)
}

pub(crate) fn synchronize() -> Result<(), u32> {
    current()?.call(&Command::CtxSynchronize).map(|_| ())
}

pub(crate) fn synchronize_v2(ctx: CUcontext) -> Result<(), u32> {
    context_or_current(ctx)?
        .call(&Command::CtxSynchronize)
        .map(|_| ())
}

pub(crate) fn get_api_version(ctx: CUcontext, version: *mut c_uint) -> Result<(), u32> {
    if version.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    context_or_current(ctx)?;
    write_out(version, CONTEXT_API_VERSION)
}

pub(crate) fn get_flags(flags: *mut c_uint) -> Result<(), u32> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(flags, current()?.flags.load(Ordering::Relaxed))
}

pub(crate) fn get_stream_priority_range(
    least: *mut c_int,
    greatest: *mut c_int,
) -> Result<(), u32> {
    current()?;
    write_optional(least, LEAST_STREAM_PRIORITY);
    write_optional(greatest, GREATEST_STREAM_PRIORITY);
    Ok(())
}

pub(crate) fn get_limit(value: *mut usize, limit: c_int) -> Result<(), u32> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let limit = u32::try_from(limit).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let payload = current()?.call(&Command::CtxGetLimit { limit })?;
    let [v] = decode_u64s::<1>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(value, usize::try_from(v).unwrap_or(usize::MAX))
}

pub(crate) fn set_limit(limit: c_int, value: usize) -> Result<(), u32> {
    let limit = u32::try_from(limit).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    current()?
        .call(&Command::CtxSetLimit {
            limit,
            value: value as u64,
        })
        .map(|_| ())
}

pub(crate) fn get_cache_config(config: *mut c_int) -> Result<(), u32> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(config, current()?.cache_config.load(Ordering::Relaxed))
}

/// A preference for the host driver, which chooses per launch anyway:
/// kept for `cuCtxGetCacheConfig`.
pub(crate) fn set_cache_config(config: c_int) -> Result<(), u32> {
    let ctx = current()?;
    check_cache_config(config)?;
    ctx.cache_config.store(config, Ordering::Relaxed);
    Ok(())
}

/// The GPUs rgpu serves have fixed 4-byte shared memory banks, which is
/// what cuda.h says such devices report.
pub(crate) fn get_shared_mem_config(config: *mut c_int) -> Result<(), u32> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    current()?;
    write_out(config, SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE)
}

/// Accepted without effect on fixed-bank devices (cuda.h).
pub(crate) fn set_shared_mem_config(config: c_int) -> Result<(), u32> {
    current()?;
    check_shared_mem_config(config)
}

pub(crate) fn get_id(ctx: CUcontext, id: *mut u64) -> Result<(), u32> {
    if id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(id, context_or_current(ctx)?.id)
}

/// Persisting L2 lines come only from access policy windows, which rgpu
/// leaves out of launches: there is nothing to reset.
pub(crate) fn reset_persisting_l2_cache() -> Result<(), u32> {
    current().map(|_| ())
}

/// Streams and events name their own context; a NULL/legacy one, the
/// current context.
pub(crate) fn same_context(a: &Arc<Context>, b: &Arc<Context>) -> Result<(), u32> {
    if Arc::ptr_eq(a, b) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_HANDLE)
    }
}

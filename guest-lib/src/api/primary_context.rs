//! The primary context of each device: created at the first retain, closed
//! when released to zero or reset. `cuDevicePrimaryCtxGetState` is called
//! thousands of times per training step, so it is a lock and two loads.

use std::ffi::{c_int, c_uint};
use std::sync::{Arc, MutexGuard};

use rgpu_proto::cuda_result::*;

use crate::abi::{write_out, CUcontext, CUdevice};
use crate::state::{self, driver, Context, Primary, CONTEXTS};

fn lock(device: CUdevice) -> Result<MutexGuard<'static, Primary>, u32> {
    driver()?
        .primary(device)?
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)
}

pub(crate) fn retain(pctx: *mut CUcontext, device: CUdevice) -> Result<(), u32> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut primary = lock(device)?;
    let ctx = match (primary.context.clone(), primary.dormant.take()) {
        (Some(ctx), _) => ctx,
        (None, Some(ctx)) => {
            ctx.reopen(driver()?)?;
            ctx.flags
                .store(primary.flags, std::sync::atomic::Ordering::Relaxed);
            CONTEXTS.insert(ctx.clone());
            primary.context = Some(ctx.clone());
            ctx
        }
        (None, None) => {
            let ctx = Context::open(driver()?, device, primary.flags, true)?;
            CONTEXTS.insert(ctx.clone());
            primary.context = Some(ctx.clone());
            ctx
        }
    };
    primary.refcount = primary.refcount.saturating_add(1);
    write_out(pctx, Arc::as_ptr(&ctx) as CUcontext)
}

/// Closes the primary context; returns its handle, whose context-local
/// storage the caller clears once the lock is released.
fn close(primary: &mut Primary) -> Option<CUcontext> {
    primary.refcount = 0;
    let ctx = primary.context.take()?;
    let handle = Arc::as_ptr(&ctx) as CUcontext;
    CONTEXTS.remove(handle);
    state::forget_current(&ctx);
    ctx.close();
    primary.dormant = Some(ctx);
    Some(handle)
}

/// Runs the context-local storage destructors of a closed context (they may
/// call back into the driver, so never under the primary's lock).
fn closed(handle: Option<CUcontext>) {
    if let Some(handle) = handle {
        crate::context_storage::context_destroyed(handle);
    }
}

pub(crate) fn release(device: CUdevice) -> Result<(), u32> {
    let mut primary = lock(device)?;
    if primary.refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    primary.refcount -= 1;
    if primary.refcount == 0 {
        let handle = close(&mut primary);
        drop(primary);
        closed(handle);
    }
    Ok(())
}

pub(crate) fn reset(device: CUdevice) -> Result<(), u32> {
    let primary = lock(device)?;
    // The driver frees the context's state but not its retains, and its
    // handle stays valid: the next call through it starts afresh.
    let Some(ctx) = primary.context.clone() else {
        return Ok(());
    };
    ctx.reset();
    drop(primary);
    closed(Some(Arc::as_ptr(&ctx) as CUcontext));
    Ok(())
}

pub(crate) fn get_state(
    device: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> Result<(), u32> {
    if flags.is_null() || active.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let primary = lock(device)?;
    write_out(flags, primary.flags)?;
    write_out(active, c_int::from(primary.context.is_some()))
}

pub(crate) fn set_flags(device: CUdevice, flags: c_uint) -> Result<(), u32> {
    let mut primary = lock(device)?;
    primary.flags = flags;
    if let Some(ctx) = &primary.context {
        ctx.flags.store(flags, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

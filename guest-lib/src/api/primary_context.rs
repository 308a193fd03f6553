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
    let ctx = match &primary.context {
        Some(ctx) => ctx.clone(),
        None => {
            let ctx = Context::open(driver()?, device, primary.flags, true)?;
            CONTEXTS.insert(ctx.clone());
            primary.context = Some(ctx.clone());
            ctx
        }
    };
    primary.refcount = primary.refcount.saturating_add(1);
    write_out(pctx, Arc::as_ptr(&ctx) as CUcontext)
}

fn close(primary: &mut Primary) {
    if let Some(ctx) = primary.context.take() {
        CONTEXTS.remove(Arc::as_ptr(&ctx) as CUcontext);
        state::forget_current(&ctx);
        ctx.close();
    }
    primary.refcount = 0;
}

pub(crate) fn release(device: CUdevice) -> Result<(), u32> {
    let mut primary = lock(device)?;
    if primary.refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    primary.refcount -= 1;
    if primary.refcount == 0 {
        close(&mut primary);
    }
    Ok(())
}

pub(crate) fn reset(device: CUdevice) -> Result<(), u32> {
    let mut primary = lock(device)?;
    close(&mut primary);
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

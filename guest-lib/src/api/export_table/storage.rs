//! Context-local storage (C693336E, no size slot): the runtime keeps its
//! per-context state in the driver under a key, with a callback the driver
//! calls when the context goes away (so the runtime forgets that state on
//! `cudaDeviceReset`). Layout and meaning from ZLUDA's `dark_api` and
//! `driver.rs` and Wine-staging's `nvcuda` (set, remove, get); a missing key
//! must be an error, or the runtime never creates its state.

use std::ffi::c_void;
use std::sync::Arc;

use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;

use super::{run, unknown_slot, Slot, CONTEXT_STORAGE};
use crate::abi::{write_out, CUcontext};
use crate::context_storage::{forget_at, lookup_at, store_at, Destructor};
use crate::state::context_or_current;

pub static TABLE: [Slot; 4] = [
    Slot::function(set as *const c_void),
    Slot::function(remove as *const c_void),
    Slot::function(get as *const c_void),
    unknown_slot!(CONTEXT_STORAGE, 3),
];

/// The handle of a live context; NULL means the current one.
fn context_key(ctx: CUcontext) -> Result<usize, u32> {
    context_or_current(ctx).map(|c| Arc::as_ptr(&c) as usize)
}

/// Slot 0: stores `value` under `key` in a context (NULL: the current one).
extern "C" fn set(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    destructor: Option<Destructor>,
) -> u32 {
    run(CONTEXT_STORAGE, 0, || {
        store_at(context_key(ctx)?, key as usize, value as usize, destructor)
    })
}

/// Slot 1: removes `key` from a context, without calling its destructor.
extern "C" fn remove(ctx: CUcontext, key: *mut c_void) -> u32 {
    run(CONTEXT_STORAGE, 1, || {
        forget_at(context_key(ctx)?, key as usize)
    })
}

/// Slot 2: the value stored under `key`; `CUDA_ERROR_INVALID_HANDLE` when
/// there is none.
extern "C" fn get(value: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> u32 {
    run(CONTEXT_STORAGE, 2, || {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let found = lookup_at(context_key(ctx)?, key as usize)?;
        write_out(value, found as *mut c_void)
    })
}

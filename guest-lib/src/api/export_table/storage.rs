//! Context-local storage (C693336E, no size slot): the runtime keeps its
//! per-context state in the driver under a key, with a callback the driver
//! calls when the context goes away (so the runtime forgets that state on
//! `cudaDeviceReset`). Layout and meaning from ZLUDA's `dark_api` and
//! `driver.rs` and Wine-staging's `nvcuda` (set, remove, get); a missing key
//! must be an error, or the runtime never creates its state.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use rgpu_proto::cuda_result::*;

use super::{run, unknown_slot, Slot, CONTEXT_STORAGE};
use crate::abi::{write_out, CUcontext};
use crate::state::context_or_current;

/// Called with `(context, key, value)` when the context is destroyed.
pub type Destructor = extern "C" fn(CUcontext, *mut c_void, *mut c_void);

pub static TABLE: [Slot; 4] = [
    Slot::function(set as *const c_void),
    Slot::function(remove as *const c_void),
    Slot::function(get as *const c_void),
    unknown_slot!(CONTEXT_STORAGE, 3),
];

struct Entry {
    value: usize,
    destructor: Option<Destructor>,
}

/// `(context handle, key)` -> entry.
static STORAGE: Mutex<Option<HashMap<(usize, usize), Entry>>> = Mutex::new(None);

fn with_storage<R>(f: impl FnOnce(&mut HashMap<(usize, usize), Entry>) -> R) -> Result<R, u32> {
    let mut guard = STORAGE.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    Ok(f(guard.get_or_insert_with(HashMap::new)))
}

/// The handle of a live context; NULL means the current one.
fn context_key(ctx: CUcontext) -> Result<usize, u32> {
    context_or_current(ctx).map(|c| Arc::as_ptr(&c) as usize)
}

/// Stores `value` under `key` for the context `handle`.
pub fn store_at(
    handle: usize,
    key: usize,
    value: usize,
    destructor: Option<Destructor>,
) -> Result<(), u32> {
    with_storage(|s| {
        s.insert((handle, key), Entry { value, destructor });
    })
}

pub fn forget_at(handle: usize, key: usize) -> Result<(), u32> {
    with_storage(|s| {
        s.remove(&(handle, key));
    })
}

pub fn lookup_at(handle: usize, key: usize) -> Result<usize, u32> {
    with_storage(|s| s.get(&(handle, key)).map(|e| e.value))?.ok_or(CUDA_ERROR_INVALID_HANDLE)
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

/// A context was destroyed (or a primary context released to zero or
/// reset): its entries go, and their destructors run, outside every lock
/// since they may call back into the driver.
pub(crate) fn context_destroyed(ctx: CUcontext) {
    let handle = ctx as usize;
    let gone: Vec<((usize, usize), Entry)> = with_storage(|s| {
        let keys: Vec<(usize, usize)> = s.keys().filter(|k| k.0 == handle).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|e| (k, e)))
            .collect()
    })
    .unwrap_or_default();
    for ((_, key), entry) in gone {
        if let Some(destructor) = entry.destructor {
            log::debug!("rgpu: context-local storage: destructor for key {key:#x} of {ctx:?}");
            destructor(ctx, key as *mut c_void, entry.value as *mut c_void);
        }
    }
}

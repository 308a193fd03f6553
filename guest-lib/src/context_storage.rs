//! Context-local storage: values NVIDIA's runtime keeps per context in the
//! driver (through the export table of `api::export_table::storage`), with
//! a destructor to run when the context goes away. Below the API modules:
//! closing a context (`cuCtxDestroy`, the last release or a reset of a
//! primary context) calls [`context_destroyed`] without knowing the export
//! tables.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use rgpu_proto::cuda_result::*;

use crate::abi::CUcontext;

/// Called with `(context, key, value)` when the context is destroyed.
pub type Destructor = extern "C" fn(CUcontext, *mut c_void, *mut c_void);

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

/// Stores `value` under `key` for the context `handle`.
pub(crate) fn store_at(
    handle: usize,
    key: usize,
    value: usize,
    destructor: Option<Destructor>,
) -> Result<(), u32> {
    with_storage(|s| {
        s.insert((handle, key), Entry { value, destructor });
    })
}

pub(crate) fn forget_at(handle: usize, key: usize) -> Result<(), u32> {
    with_storage(|s| {
        s.remove(&(handle, key));
    })
}

pub(crate) fn lookup_at(handle: usize, key: usize) -> Result<usize, u32> {
    with_storage(|s| s.get(&(handle, key)).map(|e| e.value))?.ok_or(CUDA_ERROR_INVALID_HANDLE)
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

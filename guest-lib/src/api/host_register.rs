//! `cuMemHostRegister`: the application's own memory, page-locked by the
//! driver for DMA. Guest memory the application allocated itself is not in
//! a blob, so the host cannot reach it directly: registered ranges are
//! remembered (for the API's bookkeeping, errors and pointer attributes:
//! XLA asks a registered buffer's device) and copies from them take the
//! staged path, which is correct, only not zero-copy.

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::sync::{Mutex, PoisonError};

use rgpu_proto::cuda_result::*;

use crate::state::{current_or_none, driver, new_id};

/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
const ALREADY_REGISTERED: u32 = 712;
/// `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`.
const NOT_REGISTERED: u32 = 713;

/// A registered range, as pointer attributes report it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Registered {
    pub size: usize,
    /// The context current at registration (its `CUcontext` value; 0 if
    /// none) and its device.
    pub context: usize,
    pub device: i32,
    pub buffer_id: u64,
}

/// Registered ranges by start.
static REGISTERED: Mutex<BTreeMap<usize, Registered>> = Mutex::new(BTreeMap::new());

/// The registered range holding `ptr`, with its start.
pub(crate) fn lookup(ptr: usize) -> Option<(usize, Registered)> {
    let ranges = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    ranges
        .range(..=ptr)
        .next_back()
        .filter(|(start, r)| ptr - **start < r.size)
        .map(|(start, r)| (*start, *r))
}

pub(crate) fn register(p: *mut c_void, size: usize, flags: c_uint) -> Result<(), u32> {
    driver()?;
    if p.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let start = p as usize;
    let end = start.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut ranges = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let overlaps = ranges
        .range(..end)
        .next_back()
        .is_some_and(|(s, r)| s + r.size > start);
    if overlaps {
        return Err(ALREADY_REGISTERED);
    }
    log::debug!("rgpu: cuMemHostRegister {size} bytes at {p:p}, flags {flags:#x} (staged copies)");
    let current = current_or_none().ok().flatten();
    ranges.insert(
        start,
        Registered {
            size,
            context: current
                .as_ref()
                .map_or(0, |c| std::sync::Arc::as_ptr(c) as usize),
            device: current.as_ref().map_or(0, |c| c.device),
            buffer_id: new_id(),
        },
    );
    Ok(())
}

pub(crate) fn register_v1(p: *mut c_void, size: c_uint, flags: c_uint) -> Result<(), u32> {
    register(p, size as usize, flags)
}

pub(crate) fn unregister(p: *mut c_void) -> Result<(), u32> {
    driver()?;
    let mut ranges = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    ranges
        .remove(&(p as usize))
        .map(|_| ())
        .ok_or(NOT_REGISTERED)
}

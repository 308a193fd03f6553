//! `cuMemHostRegister`: the application's own memory, page-locked by the
//! driver for DMA. Guest memory the application allocated itself is not in
//! a blob, so the host cannot reach it directly: registered ranges are
//! remembered (for the API's bookkeeping and errors) and copies from them
//! take the staged path, which is correct, only not zero-copy.

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::sync::{Mutex, PoisonError};

use rgpu_proto::cuda_result::*;

use crate::state::driver;

/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
const ALREADY_REGISTERED: u32 = 712;
/// `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`.
const NOT_REGISTERED: u32 = 713;

/// Registered ranges: start -> length.
static REGISTERED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

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
        .is_some_and(|(s, l)| s + l > start);
    if overlaps {
        return Err(ALREADY_REGISTERED);
    }
    log::debug!("rgpu: cuMemHostRegister {size} bytes at {p:p}, flags {flags:#x} (staged copies)");
    ranges.insert(start, size);
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

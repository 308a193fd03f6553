//! Memory pools (`cuMemPoolCreate`, `cuDeviceGetDefaultMemPool`,
//! `cuMemAllocFromPoolAsync`...), kept in the guest: an allocation from a
//! pool is an ordinary device allocation on the host (counted against the
//! tenant's memory limit like any other), valid at once and given back
//! when freed, so a pool holds no memory of its own. Its attributes are
//! kept as set, and its statistics count what is allocated from it now and
//! at most (reserved and used are the same: nothing is kept for reuse).
//! Export, import and per-pool access are not supported.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use rgpu_proto::cuda_result::*;

use crate::abi::{write_out, CUdevice, CUdeviceptr, CUstream};
use crate::api::memory::{alloc, free};
use crate::state::{current, driver, resolve_stream, Registry};

pub(crate) type CUmemoryPool = *mut c_void;

/// `CUmemPool_attribute`.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const RELEASE_THRESHOLD: c_int = 4;
const RESERVED_MEM_CURRENT: c_int = 5;
const RESERVED_MEM_HIGH: c_int = 6;
const USED_MEM_CURRENT: c_int = 7;
const USED_MEM_HIGH: c_int = 8;

#[derive(Debug, Default)]
struct PoolState {
    /// The three reuse flags (attributes 1-3), as set.
    reuse: [c_int; 3],
    release_threshold: u64,
    /// Live allocations from the pool: address -> size.
    allocations: HashMap<u64, u64>,
    used: u64,
    used_high: u64,
}

pub(crate) struct Pool {
    device: CUdevice,
    state: Mutex<PoolState>,
}

static POOLS: Registry<Pool> = Registry::new();
/// Per device: its default pool and its current pool.
static DEVICE_POOLS: Mutex<Option<HashMap<CUdevice, (usize, usize)>>> = Mutex::new(None);

impl Pool {
    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn new_pool(device: CUdevice) -> *mut c_void {
    POOLS.insert(Arc::new(Pool {
        device,
        state: Mutex::new(PoolState {
            // The driver's defaults: reuse allowed.
            reuse: [1, 1, 1],
            ..PoolState::default()
        }),
    }))
}

/// The default and current pools of `device`, made on first use.
fn device_pools(device: CUdevice) -> Result<(usize, usize), u32> {
    let count = driver()?.device_count();
    if usize::try_from(device).map_or(true, |d| d >= count) {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let mut guard = DEVICE_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let pools = guard.get_or_insert_with(HashMap::new);
    Ok(*pools.entry(device).or_insert_with(|| {
        let pool = new_pool(device) as usize;
        (pool, pool)
    }))
}

fn pool(handle: CUmemoryPool) -> Result<Arc<Pool>, u32> {
    POOLS.get(handle).ok_or(CUDA_ERROR_INVALID_VALUE)
}

pub(crate) fn device_get_default_mem_pool(
    pool_out: *mut CUmemoryPool,
    device: CUdevice,
) -> Result<(), u32> {
    let (default, _) = device_pools(device)?;
    write_out(pool_out, default as CUmemoryPool)
}

pub(crate) fn device_get_mem_pool(
    pool_out: *mut CUmemoryPool,
    device: CUdevice,
) -> Result<(), u32> {
    let (_, current) = device_pools(device)?;
    write_out(pool_out, current as CUmemoryPool)
}

pub(crate) fn device_set_mem_pool(device: CUdevice, handle: CUmemoryPool) -> Result<(), u32> {
    let (default, _) = device_pools(device)?;
    if pool(handle)?.device != device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut guard = DEVICE_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pools) = guard.as_mut() {
        pools.insert(device, (default, handle as usize));
    }
    Ok(())
}

/// `CUmemPoolProps`' head: allocation type, handle types, location.
#[repr(C)]
pub struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: c_int,
}

pub(crate) fn create(pool_out: *mut CUmemoryPool, props: *const PoolProps) -> Result<(), u32> {
    driver()?;
    if pool_out.is_null() || props.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUmemPoolProps, whose
    // first fields these are.
    let props = unsafe { props.read() };
    // Pinned memory of a device, no shareable handles.
    if props.alloc_type != 1 || props.location_type != 1 || props.handle_types != 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    device_pools(props.location_id)?;
    write_out(pool_out, new_pool(props.location_id))
}

pub(crate) fn destroy(handle: CUmemoryPool) -> Result<(), u32> {
    let pool = pool(handle)?;
    let (default, current) = device_pools(pool.device)?;
    if handle as usize == default {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The driver frees what is still allocated from it.
    let left: Vec<u64> = pool.state().allocations.keys().copied().collect();
    for ptr in left {
        free(ptr)?;
    }
    POOLS.remove(handle);
    if handle as usize == current {
        let mut guard = DEVICE_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pools) = guard.as_mut() {
            pools.insert(pool.device, (default, default));
        }
    }
    Ok(())
}

pub(crate) fn set_attribute(
    handle: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut state = pool.state();
    match attribute {
        REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            // SAFETY: non-NULL; an int for these attributes.
            let flag = unsafe { value.cast::<c_int>().read() };
            state.reuse[(attribute - 1) as usize] = flag;
        }
        RELEASE_THRESHOLD => {
            // SAFETY: non-NULL; a cuuint64_t for this attribute.
            state.release_threshold = unsafe { value.cast::<u64>().read() };
        }
        RESERVED_MEM_HIGH | USED_MEM_HIGH => {
            // SAFETY: non-NULL; a cuuint64_t for these attributes.
            if unsafe { value.cast::<u64>().read() } != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            state.used_high = state.used;
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

pub(crate) fn get_attribute(
    handle: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    let state = pool.state();
    match attribute {
        REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            write_out(value.cast::<c_int>(), state.reuse[(attribute - 1) as usize])
        }
        RELEASE_THRESHOLD => write_out(value.cast::<u64>(), state.release_threshold),
        RESERVED_MEM_CURRENT | USED_MEM_CURRENT => write_out(value.cast::<u64>(), state.used),
        RESERVED_MEM_HIGH | USED_MEM_HIGH => write_out(value.cast::<u64>(), state.used_high),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Nothing is kept for reuse: there is nothing to trim.
pub(crate) fn trim_to(handle: CUmemoryPool, _keep: usize) -> Result<(), u32> {
    pool(handle).map(|_| ())
}

fn alloc_from_pool_on(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUmemoryPool,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    let (ctx, _) = resolve_stream(stream, per_thread)?;
    if ctx.device != pool.device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    alloc(dptr, size)?;
    // SAFETY: `alloc` wrote the address there.
    let ptr = unsafe { dptr.read() };
    let mut state = pool.state();
    state.allocations.insert(ptr, size as u64);
    state.used += size as u64;
    state.used_high = state.used_high.max(state.used);
    Ok(())
}

pub(crate) fn alloc_from_pool_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUmemoryPool,
    stream: CUstream,
) -> Result<(), u32> {
    alloc_from_pool_on(dptr, size, handle, stream, false)
}

pub(crate) fn alloc_from_pool_async_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUmemoryPool,
    stream: CUstream,
) -> Result<(), u32> {
    alloc_from_pool_on(dptr, size, handle, stream, true)
}

/// `cuMemAllocAsync`: from the current context device's current pool.
pub(crate) fn alloc_async_from_current(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), u32> {
    let ctx = current()?;
    let (_, pool) = device_pools(ctx.device)?;
    alloc_from_pool_on(dptr, size, pool as CUmemoryPool, stream, per_thread)
}

/// `cuMemFreeAsync` of an address: forgotten by the pool it came from.
pub(crate) fn forget(ptr: CUdeviceptr) {
    for pool in POOLS.values() {
        let mut state = pool.state();
        if let Some(size) = state.allocations.remove(&ptr) {
            state.used = state.used.saturating_sub(size);
            return;
        }
    }
}

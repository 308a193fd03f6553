//! Occupancy queries. Only the host's driver can answer them (they depend
//! on the compiled kernel), so each is asked once per function and
//! arguments and then answered from the function's cache, which
//! `cuFuncSetAttribute` clears: PyTorch asks thousands of times.
//! `cuOccupancyMaxPotentialBlockSize` runs NVIDIA's search over block sizes
//! here, because its callback lives in the application.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use rgpu_proto::command::ClusterQuery;
use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;

use crate::abi::{write_out, CUfunction};
use crate::api::device::attribute;
use crate::api::launch::LaunchConfig;
use crate::api::library::function_or_kernel;
use crate::api::module::function_attribute;
use crate::state::{current, driver, resolve_stream, Function, OccupancyQuery, FUNCTIONS};

/// `CUoccupancyB2DSize`: dynamic shared memory for a block size.
pub type BlockToDynamicSmem = Option<unsafe extern "C" fn(c_int) -> usize>;

/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
const FUNC_MAX_THREADS_PER_BLOCK: c_int = 0;
/// `CU_DEVICE_ATTRIBUTE_*`.
const DEVICE_MAX_THREADS_PER_BLOCK: c_int = 1;
const DEVICE_WARP_SIZE: c_int = 10;
const DEVICE_MULTIPROCESSOR_COUNT: c_int = 16;
const DEVICE_MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;

/// The function a `CUfunction` argument names (a `CUkernel` resolves in the
/// current context).
fn function(f: CUfunction) -> Result<Arc<Function>, u32> {
    driver()?;
    if let Some(function) = FUNCTIONS.get(f) {
        return Ok(function);
    }
    function_or_kernel(f, &current()?)
}

/// `query` from the function's cache, else from `ask` (then cached).
fn cached(
    f: &Function,
    query: OccupancyQuery,
    ask: impl FnOnce() -> Result<i64, u32>,
) -> Result<i64, u32> {
    let lock = || f.occupancy.lock().map_err(|_| CUDA_ERROR_UNKNOWN);
    if let Some(v) = lock()?.get(&query) {
        return Ok(*v);
    }
    let v = ask()?;
    lock()?.insert(query, v);
    Ok(v)
}

fn i32_payload(payload: &[u8]) -> Result<i32, u32> {
    let bytes: [u8; 4] = payload.try_into().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    Ok(i32::from_le_bytes(bytes))
}

fn max_active_blocks(
    f: &Function,
    block_size: c_int,
    dynamic_smem: usize,
    flags: c_uint,
) -> Result<c_int, u32> {
    let dynamic_smem_bytes = dynamic_smem as u64;
    let query = OccupancyQuery::MaxActiveBlocks(block_size, dynamic_smem_bytes, flags);
    let blocks = cached(f, query, || {
        let payload = f.context.call(&Command::OccupancyMaxActiveBlocks {
            function: f.handle,
            block_size,
            flags,
            dynamic_smem_bytes,
        })?;
        i32_payload(&payload).map(i64::from)
    })?;
    c_int::try_from(blocks).map_err(|_| CUDA_ERROR_UNKNOWN)
}

pub(crate) fn max_active_blocks_with_flags(
    blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
    flags: c_uint,
) -> Result<(), u32> {
    if blocks.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let f = function(func)?;
    write_out(
        blocks,
        max_active_blocks(&f, block_size, dynamic_smem, flags)?,
    )
}

pub(crate) fn max_active_blocks_default(
    blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
) -> Result<(), u32> {
    max_active_blocks_with_flags(blocks, func, block_size, dynamic_smem, 0)
}

pub(crate) fn available_dynamic_smem(
    bytes: *mut usize,
    func: CUfunction,
    num_blocks: c_int,
    block_size: c_int,
) -> Result<(), u32> {
    if bytes.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let f = function(func)?;
    let query = OccupancyQuery::AvailableDynamicSmem(num_blocks, block_size);
    let available = cached(&f, query, || {
        let payload = f.context.call(&Command::OccupancyAvailableDynamicSmem {
            function: f.handle,
            num_blocks,
            block_size,
        })?;
        let [v] = decode_u64s::<1>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
        i64::try_from(v).map_err(|_| CUDA_ERROR_UNKNOWN)
    })?;
    write_out(bytes, usize::try_from(available).unwrap_or(usize::MAX))
}

pub(crate) fn max_active_clusters(
    clusters: *mut c_int,
    func: CUfunction,
    config: *const LaunchConfig,
) -> Result<(), u32> {
    if clusters.is_null() || config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUlaunchConfig.
    let config = unsafe { &*config };
    let (stream, cluster) = config.stream_and_cluster()?;
    let (grid, block, shared_mem_bytes) = config.geometry();
    let (ctx, _) = resolve_stream(stream, false)?;
    let f = match FUNCTIONS.get(func) {
        Some(f) => f,
        None => function_or_kernel(func, &ctx)?,
    };
    let query = OccupancyQuery::MaxActiveClusters(grid, block, shared_mem_bytes, cluster);
    let count = cached(&f, query, || {
        let payload = f.context.call(&Command::OccupancyMaxActiveClusters {
            query: ClusterQuery {
                function: f.handle,
                grid,
                block,
                shared_mem_bytes,
                cluster,
            },
        })?;
        i32_payload(&payload).map(i64::from)
    })?;
    write_out(
        clusters,
        c_int::try_from(count).map_err(|_| CUDA_ERROR_UNKNOWN)?,
    )
}

/// `cuOccupancyMaxPotentialClusterSize`: the host's driver answers, once
/// per function and launch shape.
pub(crate) fn max_potential_cluster_size(
    size: *mut c_int,
    func: CUfunction,
    config: *const LaunchConfig,
) -> Result<(), u32> {
    if size.is_null() || config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUlaunchConfig.
    let config = unsafe { &*config };
    let (stream, _) = config.stream_and_cluster()?;
    let (grid, block, shared_mem_bytes) = config.geometry();
    let (ctx, _) = resolve_stream(stream, false)?;
    let f = match FUNCTIONS.get(func) {
        Some(f) => f,
        None => function_or_kernel(func, &ctx)?,
    };
    let query = OccupancyQuery::MaxPotentialClusterSize(grid, block, shared_mem_bytes);
    let answer = cached(&f, query, || {
        let payload = f.context.call(&Command::OccupancyMaxPotentialClusterSize {
            query: ClusterQuery {
                function: f.handle,
                grid,
                block,
                shared_mem_bytes,
                cluster: [0; 3],
            },
        })?;
        i32_payload(&payload).map(i64::from)
    })?;
    write_out(
        size,
        c_int::try_from(answer).map_err(|_| CUDA_ERROR_UNKNOWN)?,
    )
}

/// The block size with the most resident threads per multiprocessor (the
/// largest such on ties), searched from the largest allowed down in steps
/// of a warp, as NVIDIA's occupancy calculator does; and the grid that
/// fills the device with such blocks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn max_potential_block_size_with_flags(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    block_to_dynamic_smem: BlockToDynamicSmem,
    dynamic_smem: usize,
    block_size_limit: c_int,
    flags: c_uint,
) -> Result<(), u32> {
    if min_grid_size.is_null() || block_size.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let f = function(func)?;
    let device = f.context.device;
    let mut max_block = function_attribute(&f, FUNC_MAX_THREADS_PER_BLOCK)?
        .min(attribute(device, DEVICE_MAX_THREADS_PER_BLOCK)?);
    if block_size_limit > 0 {
        max_block = max_block.min(block_size_limit);
    }
    let warp = attribute(device, DEVICE_WARP_SIZE)?.max(1);
    let threads_per_sm = attribute(device, DEVICE_MAX_THREADS_PER_MULTIPROCESSOR)?;
    let sm_count = attribute(device, DEVICE_MULTIPROCESSOR_COUNT)?;
    let (mut best_block, mut best_blocks, mut best_threads) = (0, 0, 0);
    let mut aligned = max_block.saturating_add(warp - 1) / warp * warp;
    while aligned > 0 {
        let size = max_block.min(aligned);
        let dynamic = match block_to_dynamic_smem {
            // SAFETY: the application's CUoccupancyB2DSize callback, called
            // as the API contract says: with a block size.
            Some(callback) => unsafe { callback(size) },
            None => dynamic_smem,
        };
        let blocks = max_active_blocks(&f, size, dynamic, flags)?;
        let threads = size.saturating_mul(blocks);
        if threads > best_threads {
            (best_block, best_blocks, best_threads) = (size, blocks, threads);
        }
        if best_threads >= threads_per_sm {
            break;
        }
        aligned -= warp;
    }
    write_out(min_grid_size, best_blocks.saturating_mul(sm_count))?;
    write_out(block_size, best_block)
}

pub(crate) fn max_potential_block_size(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    block_to_dynamic_smem: BlockToDynamicSmem,
    dynamic_smem: usize,
    block_size_limit: c_int,
) -> Result<(), u32> {
    max_potential_block_size_with_flags(
        min_grid_size,
        block_size,
        func,
        block_to_dynamic_smem,
        dynamic_smem,
        block_size_limit,
        0,
    )
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_int, c_void};

    use rgpu_proto::cuda_result::CUDA_ERROR_NOT_INITIALIZED;

    use crate::api::proc_address::resolve_implemented as resolve;
    use crate::exports;

    /// The queries frameworks make (capture state, pointers, occupancy,
    /// function and context configuration) resolve to the implementations
    /// here, in the version NVIDIA's table gives for each request.
    #[test]
    fn proc_address_resolves_the_framework_queries_here() {
        let default: &[(&str, c_int, *const c_void)] = &[
            (
                "cuStreamIsCapturing",
                12080,
                exports::cuStreamIsCapturing as *const c_void,
            ),
            (
                "cuStreamGetCaptureInfo",
                10010,
                exports::cuStreamGetCaptureInfo as *const c_void,
            ),
            (
                "cuStreamGetCaptureInfo",
                11030,
                exports::cuStreamGetCaptureInfo_v2 as *const c_void,
            ),
            (
                "cuStreamGetCaptureInfo",
                12080,
                exports::cuStreamGetCaptureInfo_v3 as *const c_void,
            ),
            (
                "cuStreamGetCtx",
                12000,
                exports::cuStreamGetCtx as *const c_void,
            ),
            (
                "cuStreamGetCtx",
                12080,
                exports::cuStreamGetCtx_v2 as *const c_void,
            ),
            (
                "cuStreamGetId",
                12080,
                exports::cuStreamGetId as *const c_void,
            ),
            (
                "cuPointerGetAttribute",
                12080,
                exports::cuPointerGetAttribute as *const c_void,
            ),
            (
                "cuPointerGetAttributes",
                12080,
                exports::cuPointerGetAttributes as *const c_void,
            ),
            (
                "cuMemGetAddressRange",
                12080,
                exports::cuMemGetAddressRange_v2 as *const c_void,
            ),
            (
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                12080,
                exports::cuOccupancyMaxActiveBlocksPerMultiprocessor as *const c_void,
            ),
            (
                "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                12080,
                exports::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags as *const c_void,
            ),
            (
                "cuOccupancyMaxActiveClusters",
                12080,
                exports::cuOccupancyMaxActiveClusters as *const c_void,
            ),
            (
                "cuOccupancyAvailableDynamicSMemPerBlock",
                12080,
                exports::cuOccupancyAvailableDynamicSMemPerBlock as *const c_void,
            ),
            (
                "cuOccupancyMaxPotentialBlockSize",
                12080,
                exports::cuOccupancyMaxPotentialBlockSize as *const c_void,
            ),
            (
                "cuOccupancyMaxPotentialBlockSizeWithFlags",
                12080,
                exports::cuOccupancyMaxPotentialBlockSizeWithFlags as *const c_void,
            ),
            (
                "cuFuncSetAttribute",
                12080,
                exports::cuFuncSetAttribute as *const c_void,
            ),
            (
                "cuFuncSetCacheConfig",
                12080,
                exports::cuFuncSetCacheConfig as *const c_void,
            ),
            (
                "cuCtxGetCacheConfig",
                12080,
                exports::cuCtxGetCacheConfig as *const c_void,
            ),
            (
                "cuCtxSetCacheConfig",
                12080,
                exports::cuCtxSetCacheConfig as *const c_void,
            ),
            (
                "cuCtxGetSharedMemConfig",
                12080,
                exports::cuCtxGetSharedMemConfig as *const c_void,
            ),
            (
                "cuCtxSetSharedMemConfig",
                12080,
                exports::cuCtxSetSharedMemConfig as *const c_void,
            ),
            ("cuCtxGetId", 12080, exports::cuCtxGetId as *const c_void),
            (
                "cuCtxResetPersistingL2Cache",
                12080,
                exports::cuCtxResetPersistingL2Cache as *const c_void,
            ),
            (
                "cuDeviceCanAccessPeer",
                12080,
                exports::cuDeviceCanAccessPeer as *const c_void,
            ),
            (
                "cuEventRecordWithFlags",
                12080,
                exports::cuEventRecordWithFlags as *const c_void,
            ),
        ];
        for (name, version, address) in default {
            assert_eq!(resolve(name, *version, 0), *address, "{name} {version}");
        }
        // The per-thread-default-stream flavours.
        let per_thread: &[(&str, *const c_void)] = &[
            (
                "cuStreamIsCapturing",
                exports::cuStreamIsCapturing_ptsz as *const c_void,
            ),
            (
                "cuStreamGetCaptureInfo",
                exports::cuStreamGetCaptureInfo_v3_ptsz as *const c_void,
            ),
            (
                "cuStreamGetCtx",
                exports::cuStreamGetCtx_v2_ptsz as *const c_void,
            ),
            (
                "cuStreamGetId",
                exports::cuStreamGetId_ptsz as *const c_void,
            ),
            (
                "cuEventRecordWithFlags",
                exports::cuEventRecordWithFlags_ptsz as *const c_void,
            ),
        ];
        for (name, address) in per_thread {
            assert_eq!(resolve(name, 12080, 2), *address, "{name} per-thread");
        }
    }

    #[test]
    fn calls_before_init_fail_cleanly() {
        let mut blocks: c_int = 0;
        assert_eq!(
            exports::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                std::ptr::null_mut(),
                128,
                0
            ),
            CUDA_ERROR_NOT_INITIALIZED
        );
        let mut status: c_int = -1;
        assert_eq!(
            exports::cuStreamIsCapturing(std::ptr::null_mut(), &mut status),
            CUDA_ERROR_NOT_INITIALIZED
        );
    }
}

//! The `sim` executor's occupancy model: what an H200 answers to the
//! occupancy queries for a kernel of given registers and static shared
//! memory, computed from the per-multiprocessor limits (device attributes
//! 16, 39, 81, 82, 97, 106 and 111 of `data/h200-attributes.tsv`) the way
//! NVIDIA's occupancy calculator does: the fewest blocks that any one
//! resource (warps, registers, shared memory, the block slots) allows.

use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;

use crate::CuResult;

const WARP_SIZE: i64 = 32;
const MAX_THREADS_PER_BLOCK: i64 = 1024;
const MAX_WARPS_PER_SM: i64 = 2048 / WARP_SIZE;
const MAX_BLOCKS_PER_SM: i64 = 32;
const REGISTERS_PER_SM: i64 = 65536;
/// Registers are handed to warps in units of this many.
const REGISTER_UNIT: i64 = 256;
const SHARED_PER_SM: u64 = 233_472;
pub(crate) const SHARED_PER_BLOCK_OPTIN: u64 = 232_448;
/// Shared memory the system keeps per resident block.
const RESERVED_SHARED_PER_BLOCK: u64 = 1024;
/// Graphics processing clusters usable by thread-block clusters, and the
/// multiprocessors of each that a cluster may span.
const CLUSTER_GPCS: i64 = 8;
const SMS_PER_CLUSTER_GPC: i64 = 16;
/// Largest cluster (blocks) without / with the non-portable opt-in.
pub(crate) const MAX_PORTABLE_CLUSTER: u64 = 8;
pub(crate) const MAX_CLUSTER: u64 = 16;

/// What the model needs to know about a kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KernelResources {
    pub registers: i32,
    pub static_shared: u64,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub max_dynamic_shared: u64,
}

fn warps(block_size: i64) -> i64 {
    (block_size + WARP_SIZE - 1) / WARP_SIZE
}

/// Resident blocks per multiprocessor; 0 when the block cannot launch.
pub(crate) fn max_active_blocks(
    kernel: &KernelResources,
    block_size: i32,
    dynamic_shared: u64,
) -> CuResult<i32> {
    let block_size = i64::from(block_size);
    if block_size <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if block_size > MAX_THREADS_PER_BLOCK || dynamic_shared > kernel.max_dynamic_shared {
        return Ok(0);
    }
    let warps = warps(block_size);
    let by_warps = MAX_WARPS_PER_SM / warps;
    let per_warp_registers = (i64::from(kernel.registers.max(1)) * WARP_SIZE + REGISTER_UNIT - 1)
        / REGISTER_UNIT
        * REGISTER_UNIT;
    let by_registers = (REGISTERS_PER_SM / per_warp_registers) / warps;
    let shared = kernel
        .static_shared
        .saturating_add(dynamic_shared)
        .saturating_add(RESERVED_SHARED_PER_BLOCK);
    let by_shared = i64::try_from(SHARED_PER_SM / shared).unwrap_or(0);
    let blocks = by_warps
        .min(by_registers)
        .min(by_shared)
        .min(MAX_BLOCKS_PER_SM);
    Ok(i32::try_from(blocks).unwrap_or(0))
}

/// Dynamic shared memory per block that still lets `num_blocks` blocks of
/// `block_size` threads reside on one multiprocessor.
pub(crate) fn available_dynamic_shared(
    kernel: &KernelResources,
    num_blocks: i32,
    block_size: i32,
) -> CuResult<u64> {
    if num_blocks <= 0 || block_size <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let fits = max_active_blocks(
        &KernelResources {
            max_dynamic_shared: u64::MAX,
            ..*kernel
        },
        block_size,
        0,
    )?;
    if fits < num_blocks {
        return Ok(0);
    }
    let per_block = SHARED_PER_SM / u64::from(num_blocks.unsigned_abs());
    Ok(per_block
        .saturating_sub(RESERVED_SHARED_PER_BLOCK)
        .saturating_sub(kernel.static_shared)
        .min(SHARED_PER_BLOCK_OPTIN.saturating_sub(kernel.static_shared)))
}

/// Clusters of `cluster_size` blocks that can be resident at once.
pub(crate) fn max_active_clusters(
    kernel: &KernelResources,
    block_size: i32,
    dynamic_shared: u64,
    cluster_size: u64,
) -> CuResult<i32> {
    let blocks_per_sm = i64::from(max_active_blocks(kernel, block_size, dynamic_shared)?);
    let cluster_size = i64::try_from(cluster_size.max(1)).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let per_gpc = SMS_PER_CLUSTER_GPC * blocks_per_sm / cluster_size;
    Ok(i32::try_from(CLUSTER_GPCS * per_gpc).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: KernelResources = KernelResources {
        registers: 16,
        static_shared: 0,
        max_dynamic_shared: 49152,
    };

    #[test]
    fn blocks_follow_the_scarcest_resource() {
        // Warps: 2048 threads per SM.
        assert_eq!(max_active_blocks(&SMALL, 1024, 0), Ok(2));
        assert_eq!(max_active_blocks(&SMALL, 256, 0), Ok(8));
        assert_eq!(max_active_blocks(&SMALL, 33, 0), Ok(32));
        // Block slots: 32 per SM.
        assert_eq!(max_active_blocks(&SMALL, 32, 0), Ok(32));
        // Shared memory: 233472 / (48 KiB + 1 KiB) = 4.
        assert_eq!(max_active_blocks(&SMALL, 128, 49152), Ok(4));
        // Registers: 128 per thread leave 16 warps.
        let heavy = KernelResources {
            registers: 128,
            ..SMALL
        };
        assert_eq!(max_active_blocks(&heavy, 256, 0), Ok(2));
        // Impossible launches are 0, nonsense is an error.
        assert_eq!(max_active_blocks(&SMALL, 1025, 0), Ok(0));
        assert_eq!(max_active_blocks(&SMALL, 128, 49153), Ok(0));
        assert_eq!(
            max_active_blocks(&SMALL, 0, 0),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn available_shared_memory_shrinks_with_more_blocks() {
        assert_eq!(
            available_dynamic_shared(&SMALL, 1, 128),
            Ok(SHARED_PER_BLOCK_OPTIN)
        );
        assert_eq!(available_dynamic_shared(&SMALL, 4, 128), Ok(57344));
        // 3 blocks of 1024 threads never fit.
        assert_eq!(available_dynamic_shared(&SMALL, 3, 1024), Ok(0));
        assert_eq!(
            available_dynamic_shared(&SMALL, 0, 128),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        // What it says fits does fit.
        let generous = KernelResources {
            max_dynamic_shared: SHARED_PER_BLOCK_OPTIN,
            ..SMALL
        };
        let bytes = available_dynamic_shared(&generous, 4, 128).unwrap();
        assert_eq!(max_active_blocks(&generous, 128, bytes), Ok(4));
    }

    #[test]
    fn clusters_scale_with_their_size() {
        assert_eq!(max_active_clusters(&SMALL, 128, 0, 1), Ok(8 * 16 * 16));
        assert_eq!(max_active_clusters(&SMALL, 128, 0, 2), Ok(8 * 16 * 8));
        assert_eq!(max_active_clusters(&SMALL, 1024, 0, 8), Ok(8 * 4));
        assert_eq!(max_active_clusters(&SMALL, 1025, 0, 2), Ok(0));
    }
}

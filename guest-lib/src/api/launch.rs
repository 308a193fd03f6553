//! `cuLaunchKernel`: the parameters are marshalled here into the layout the
//! host returned with the function, and the launch is queued without a
//! round trip.

use std::ffi::{c_uint, c_void};

use rgpu_proto::command::Launch;
use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{CUfunction, CUstream};
use crate::api::context::same_context;
use crate::params::marshal;
use crate::state::{driver, resolve_stream, FUNCTIONS};

#[allow(clippy::too_many_arguments)]
fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> Result<(), u32> {
    driver()?;
    let function = FUNCTIONS.get(f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, stream) = resolve_stream(stream, per_thread)?;
    same_context(&ctx, &function.context)?;
    // SAFETY: the API contract on kernelParams / extra (see `marshal`).
    let params = unsafe { marshal(&function.info, kernel_params.cast(), extra.cast()) }?;
    ctx.send(&Command::LaunchKernel(Launch {
        function: function.handle,
        grid,
        block,
        shared_mem_bytes,
        stream,
        params,
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_kernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), u32> {
    launch(
        f,
        [grid_x, grid_y, grid_z],
        [block_x, block_y, block_z],
        shared_mem_bytes,
        stream,
        kernel_params,
        extra,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_kernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), u32> {
    launch(
        f,
        [grid_x, grid_y, grid_z],
        [block_x, block_y, block_z],
        shared_mem_bytes,
        stream,
        kernel_params,
        extra,
        true,
    )
}

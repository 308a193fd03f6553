//! `cuLaunchKernel` and `cuLaunchKernelEx`: the parameters are marshalled
//! here into the layout the host returned with the function, and the launch
//! is queued without a round trip. A `CUkernel` is accepted where a
//! `CUfunction` is expected and runs in the context of the stream.

use std::ffi::{c_uint, c_void};

use rgpu_proto::command::Launch;
use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{CUdevice, CUfunction, CUstream};
use crate::api::context::same_context;
use crate::api::library::function_or_kernel;
use crate::params::marshal;
use crate::state::{driver, resolve_stream};

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    attrs: *const LaunchAttribute,
    num_attrs: c_uint,
}

/// `CUlaunchAttribute`: an id, then a 64-byte value union at offset 8.
#[repr(C)]
pub struct LaunchAttribute {
    id: u32,
    _pad: u32,
    value: [u32; 16],
}

impl LaunchConfig {
    /// Its stream and the cluster shape its attributes ask for (all zero
    /// when none): what `cuOccupancyMaxActiveClusters` reads of it.
    pub(crate) fn stream_and_cluster(&self) -> Result<(CUstream, [u32; 3]), u32> {
        let mut cluster = [0; 3];
        for attribute in attributes(self)? {
            if attribute.id == ATTRIBUTE_CLUSTER_DIMENSION {
                cluster.copy_from_slice(&attribute.value[..3]);
            }
        }
        Ok((self.stream, cluster))
    }

    pub(crate) fn geometry(&self) -> ([c_uint; 3], [c_uint; 3], c_uint) {
        (self.grid, self.block, self.shared_mem_bytes)
    }
}

/// The attribute list of a launch configuration.
fn attributes(config: &LaunchConfig) -> Result<&[LaunchAttribute], u32> {
    if config.num_attrs == 0 {
        return Ok(&[]);
    }
    if config.attrs.is_null() || config.num_attrs > MAX_ATTRIBUTES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, `num_attrs` entries (the API contract), bounded.
    Ok(unsafe { std::slice::from_raw_parts(config.attrs, config.num_attrs as usize) })
}

const ATTRIBUTE_IGNORE: u32 = 0;
const ATTRIBUTE_ACCESS_POLICY_WINDOW: u32 = 1;
const ATTRIBUTE_COOPERATIVE: u32 = 2;
const ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;
const ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
const ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
const ATTRIBUTE_PRIORITY: u32 = 8;
const ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: u32 = 9;
const ATTRIBUTE_MEM_SYNC_DOMAIN: u32 = 10;
const ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION: u32 = 11;
/// Largest attribute list accepted.
const MAX_ATTRIBUTES: c_uint = 64;

/// Whether a launch attribute can be left out without changing what the
/// launch computes: hints, permissions and default values can; cooperative
/// launches, cluster shapes and events cannot (yet).
fn attribute_is_optional(attribute: &LaunchAttribute) -> bool {
    match attribute.id {
        ATTRIBUTE_IGNORE
        | ATTRIBUTE_ACCESS_POLICY_WINDOW
        | ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        | ATTRIBUTE_PRIORITY
        | ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
        | ATTRIBUTE_MEM_SYNC_DOMAIN
        | ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION => true,
        ATTRIBUTE_COOPERATIVE => attribute.value[0] == 0,
        ATTRIBUTE_CLUSTER_DIMENSION => attribute.value[..3].iter().all(|d| *d <= 1),
        _ => false,
    }
}

/// Refuses a launch the device cannot run, at once, as the driver does
/// (launches are otherwise asynchronous, and an error found by the host
/// would only surface later): the limits are the device's attributes.
fn check_geometry(
    device: CUdevice,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
) -> Result<(), u32> {
    const MAX_THREADS_PER_BLOCK: i32 = 1;
    const MAX_BLOCK_DIM: [i32; 3] = [2, 3, 4];
    const MAX_GRID_DIM: [i32; 3] = [5, 6, 7];
    const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
    let info = driver()?.device(device)?;
    let within = |value: u64, attribute: i32| {
        info.attribute(attribute)
            .is_none_or(|limit| value <= u64::try_from(limit).unwrap_or(0))
    };
    let threads: u64 = block.iter().map(|d| u64::from(*d)).product();
    let fits = within(threads, MAX_THREADS_PER_BLOCK)
        && block
            .iter()
            .zip(MAX_BLOCK_DIM)
            .all(|(d, a)| within((*d).into(), a))
        && grid
            .iter()
            .zip(MAX_GRID_DIM)
            .all(|(d, a)| within((*d).into(), a))
        && within(shared_mem_bytes.into(), MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    if fits {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// What a `cuLaunchKernelEx` asks beyond an ordinary launch: a cluster
/// shape (all zero: none) and a cooperative launch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LaunchShape {
    cluster: [u32; 3],
    cooperative: bool,
}

impl LaunchShape {
    fn is_plain(self) -> bool {
        self.cluster.iter().all(|d| *d <= 1) && !self.cooperative
    }
}

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
    launch_shaped(
        f,
        grid,
        block,
        shared_mem_bytes,
        stream,
        kernel_params,
        extra,
        per_thread,
        LaunchShape::default(),
    )
}

#[allow(clippy::too_many_arguments)]
fn launch_shaped(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
    shape: LaunchShape,
) -> Result<(), u32> {
    driver()?;
    if f.is_null() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, stream) = resolve_stream(stream, per_thread)?;
    check_geometry(ctx.device, grid, block, shared_mem_bytes)?;
    let function = function_or_kernel(f, &ctx)?;
    same_context(&ctx, &function.context)?;
    // SAFETY: the API contract on kernelParams / extra (see `marshal`).
    let params = unsafe { marshal(&function.info, kernel_params.cast(), extra.cast()) }?;
    let launch = Launch {
        function: function.handle,
        grid,
        block,
        shared_mem_bytes,
        stream,
        params,
    };
    if shape.is_plain() {
        return ctx.send(&Command::LaunchKernel { launch });
    }
    ctx.send(&Command::LaunchKernelEx {
        launch,
        cluster: shape.cluster,
        cooperative: u32::from(shape.cooperative),
    })
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

/// `cuLaunchCooperativeKernel`: an ordinary launch whose blocks may all
/// synchronise with each other (the host's driver checks that they fit on
/// the device at once).
#[allow(clippy::too_many_arguments)]
fn launch_cooperative_on(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    per_thread: bool,
) -> Result<(), u32> {
    // The driver takes no `extra` form here.
    if kernel_params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    launch_shaped(
        f,
        grid,
        block,
        shared_mem_bytes,
        stream,
        kernel_params,
        std::ptr::null_mut(),
        per_thread,
        LaunchShape {
            cluster: [0; 3],
            cooperative: true,
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_cooperative_kernel(
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
) -> Result<(), u32> {
    launch_cooperative_on(
        f,
        [grid_x, grid_y, grid_z],
        [block_x, block_y, block_z],
        shared_mem_bytes,
        stream,
        kernel_params,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_cooperative_kernel_ptsz(
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
) -> Result<(), u32> {
    launch_cooperative_on(
        f,
        [grid_x, grid_y, grid_z],
        [block_x, block_y, block_z],
        shared_mem_bytes,
        stream,
        kernel_params,
        true,
    )
}

fn launch_ex(
    config: *const LaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> Result<(), u32> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUlaunchConfig.
    let config = unsafe { &*config };
    let mut shape = LaunchShape::default();
    for attribute in attributes(config)? {
        match attribute.id {
            ATTRIBUTE_CLUSTER_DIMENSION => shape.cluster.copy_from_slice(&attribute.value[..3]),
            ATTRIBUTE_COOPERATIVE => shape.cooperative = attribute.value[0] != 0,
            _ if attribute_is_optional(attribute) => {}
            _ => {
                log::warn!(
                    "rgpu: cuLaunchKernelEx: launch attribute {} ({:?}) is not supported",
                    attribute.id,
                    &attribute.value[..3]
                );
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
    }
    launch_shaped(
        f,
        config.grid,
        config.block,
        config.shared_mem_bytes,
        config.stream,
        kernel_params,
        extra,
        per_thread,
        shape,
    )
}

pub(crate) fn launch_kernel_ex(
    config: *const LaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), u32> {
    launch_ex(config, f, kernel_params, extra, false)
}

pub(crate) fn launch_kernel_ex_ptsz(
    config: *const LaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), u32> {
    launch_ex(config, f, kernel_params, extra, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(id: u32, values: &[u32]) -> LaunchAttribute {
        let mut value = [0u32; 16];
        value[..values.len()].copy_from_slice(values);
        LaunchAttribute { id, _pad: 0, value }
    }

    #[test]
    fn launch_attribute_layout_is_cuda_s() {
        assert_eq!(std::mem::size_of::<LaunchAttribute>(), 72);
        assert_eq!(std::mem::size_of::<LaunchConfig>(), 56);
    }

    #[test]
    fn only_attributes_that_change_nothing_are_left_out() {
        assert!(attribute_is_optional(&attribute(ATTRIBUTE_PRIORITY, &[3])));
        assert!(attribute_is_optional(&attribute(
            ATTRIBUTE_COOPERATIVE,
            &[0]
        )));
        assert!(!attribute_is_optional(&attribute(
            ATTRIBUTE_COOPERATIVE,
            &[1]
        )));
        assert!(attribute_is_optional(&attribute(
            ATTRIBUTE_CLUSTER_DIMENSION,
            &[1, 1, 1]
        )));
        assert!(!attribute_is_optional(&attribute(
            ATTRIBUTE_CLUSTER_DIMENSION,
            &[2, 1, 1]
        )));
        // Programmatic and completion events must fire: not supported.
        assert!(!attribute_is_optional(&attribute(7, &[])));
        assert!(!attribute_is_optional(&attribute(12, &[])));
    }
}

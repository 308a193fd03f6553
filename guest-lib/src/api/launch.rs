//! `cuLaunchKernel` and `cuLaunchKernelEx`: the parameters are marshalled
//! here into the layout the host returned with the function, and the launch
//! is queued without a round trip. A `CUkernel` is accepted where a
//! `CUfunction` is expected and runs in the context of the stream.

use std::cell::Cell;
use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use rgpu_proto::command::{launch_attribute, Launch, LaunchAttr, MAX_LAUNCH_ATTRIBUTES};
use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{CUdevice, CUevent, CUfunction, CUstream};
use crate::api::context::same_context;
use crate::api::library::function_or_kernel;
use crate::params::marshal_into;
use crate::state::{driver, resolve_stream, Event};

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
            if attribute.id == launch_attribute::CLUSTER_DIMENSION {
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

/// Largest attribute list accepted.
const MAX_ATTRIBUTES: c_uint = 64;

/// `attribute` as it travels to the host: the first 32 bytes of its value
/// union as four words, an event as this process's handle of it (checked
/// here: the host knows no guest pointers; the event goes to `events`, so
/// the launch can check its context). `None`: nothing to send (`IGNORE`).
/// An attribute the host does not take fails the launch now, saying which,
/// rather than later and silently.
fn wire_attribute(
    attribute: &LaunchAttribute,
    events: &mut Vec<Arc<Event>>,
) -> Result<Option<LaunchAttr>, u32> {
    let w = &attribute.value;
    let mut wire = LaunchAttr::from_union(attribute.id, w);
    match attribute.id {
        launch_attribute::IGNORE => return Ok(None),
        launch_attribute::PROGRAMMATIC_EVENT | launch_attribute::LAUNCH_COMPLETION_EVENT => {
            let event = crate::api::event::named(wire.value[0] as usize as CUevent)?;
            wire.value[0] = u64::from(event.handle);
            events.push(event);
        }
        launch_attribute::ACCESS_POLICY_WINDOW
        | launch_attribute::SYNCHRONIZATION_POLICY
        | launch_attribute::CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | launch_attribute::PROGRAMMATIC_STREAM_SERIALIZATION
        | launch_attribute::PRIORITY
        | launch_attribute::MEM_SYNC_DOMAIN_MAP
        | launch_attribute::MEM_SYNC_DOMAIN
        | launch_attribute::PREFERRED_CLUSTER_DIMENSION
        | launch_attribute::PREFERRED_SHARED_MEMORY_CARVEOUT => {}
        // A graph node's attribute: no launch takes it, and driver 580
        // answers so.
        launch_attribute::DEVICE_UPDATABLE_KERNEL_NODE => {
            log::debug!("rgpu: cuLaunchKernelEx: a device-updatable node attribute on a launch");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        other => {
            log::warn!(
                "rgpu: cuLaunchKernelEx: launch attribute {other} ({:?}) is not supported",
                &w[..4]
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    Ok(Some(wire))
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
    use rgpu_proto::capset::device_attribute::{
        MAX_BLOCK_DIM, MAX_GRID_DIM, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, MAX_THREADS_PER_BLOCK,
    };
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
/// shape (all zero: none), a cooperative launch, and its other attributes.
#[derive(Default)]
struct LaunchShape {
    cluster: [u32; 3],
    cooperative: bool,
    attributes: Vec<LaunchAttr>,
    /// Events the attributes name: they must be the launch context's.
    events: Vec<Arc<Event>>,
}

impl LaunchShape {
    fn is_plain(&self) -> bool {
        self.cluster.iter().all(|d| *d <= 1) && !self.cooperative && self.attributes.is_empty()
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
    for event in &shape.events {
        same_context(&ctx, &event.context)?;
    }
    check_geometry(ctx.device, grid, block, shared_mem_bytes)?;
    let function = function_or_kernel(f, &ctx)?;
    same_context(&ctx, &function.context)?;
    let mut params = PARAM_BUFFER.take();
    // SAFETY: the API contract on kernelParams / extra (see `marshal_into`).
    let marshalled = unsafe {
        marshal_into(
            &function.info,
            kernel_params.cast(),
            extra.cast(),
            &mut params,
        )
    };
    if let Err(code) = marshalled {
        PARAM_BUFFER.set(params);
        return Err(code);
    }
    let launch = Launch {
        function: function.handle,
        grid,
        block,
        shared_mem_bytes,
        stream,
        params,
    };
    let command = if shape.is_plain() {
        Command::LaunchKernel { launch }
    } else {
        Command::LaunchKernelEx {
            launch,
            cluster: shape.cluster,
            cooperative: u32::from(shape.cooperative),
            attributes: shape.attributes,
        }
    };
    let sent = ctx.send(&command);
    if let Command::LaunchKernel { launch } | Command::LaunchKernelEx { launch, .. } = command {
        if launch.params.capacity() <= KEPT_PARAM_BUFFER {
            PARAM_BUFFER.set(launch.params);
        }
    }
    sent
}

thread_local! {
    /// The parameter buffer of this thread's launches, kept for the next
    /// one: a launch marshals its parameters without allocating.
    static PARAM_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The largest parameter buffer a thread keeps between launches.
const KEPT_PARAM_BUFFER: usize = 4096;

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
            cooperative: true,
            ..LaunchShape::default()
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
            launch_attribute::CLUSTER_DIMENSION => {
                shape.cluster.copy_from_slice(&attribute.value[..3]);
            }
            launch_attribute::COOPERATIVE => shape.cooperative = attribute.value[0] != 0,
            _ => shape
                .attributes
                .extend(wire_attribute(attribute, &mut shape.events)?),
        }
    }
    if shape.attributes.len() > MAX_LAUNCH_ATTRIBUTES {
        return Err(CUDA_ERROR_INVALID_VALUE);
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
    fn attributes_travel_as_four_words_of_their_value() {
        let window = attribute(
            launch_attribute::ACCESS_POLICY_WINDOW,
            &[0x1000, 0x7f, 4096, 0, 0x3f00_0000, 1, 2],
        );
        assert_eq!(
            wire_attribute(&window, &mut Vec::new()),
            Ok(Some(LaunchAttr {
                id: launch_attribute::ACCESS_POLICY_WINDOW,
                value: [0x7f_0000_1000, 4096, 0x1_3f00_0000, 2],
            }))
        );
        let priority = attribute(launch_attribute::PRIORITY, &[3]);
        assert_eq!(
            wire_attribute(&priority, &mut Vec::new()).map(|a| a.map(|a| a.value[0])),
            Ok(Some(3))
        );
        assert_eq!(
            wire_attribute(&attribute(launch_attribute::IGNORE, &[9]), &mut Vec::new()),
            Ok(None)
        );
        // One the host does not take (a graph node's) fails now.
        assert_eq!(
            wire_attribute(&attribute(13, &[1]), &mut Vec::new()),
            Err(CUDA_ERROR_NOT_SUPPORTED)
        );
    }
}

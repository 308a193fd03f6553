//! The `cuda` executor: NVIDIA's driver through cudarc's raw bindings
//! (`cudarc::driver::sys`, CUDA 13.0, dynamic loading).
//!
//! cudarc resolves each entry point on first use and panics when no driver
//! library loads, so [`CudaExecutor::new`] first looks for the library itself
//! with cudarc's own candidate names and refuses rgpu's guest library (which
//! is also called `libcuda.so`). Entry points whose arguments are enums in
//! cudarc (device and function attributes, context limits, launch
//! configurations) are called through our own integer signatures: a guest's
//! number never becomes a Rust enum. Results are read as plain `u32` codes.
//!
//! Every context handle given out (modules, functions, streams, events) is a
//! number of this context's own tables, so a guest can only name objects its
//! own context created.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{null_mut, without_provenance_mut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys;
use log::{debug, info, trace, warn};
use rgpu_proto::capset::{DeviceInfo, ATTRIBUTE_SLOTS, ATTRIBUTE_UNSUPPORTED};
use rgpu_proto::command::{
    launch_attribute, ClusterQuery, IpcHandle, TensorMapKind, TensorMapSpec, IPC_HANDLE_BYTES,
    TENSOR_MAP_BYTES,
};
use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::{FunctionInfo, ParamSlot};
use rgpu_proto::MAX_KERNEL_PARAMS;

use crate::cpu_list::CpuList;
use crate::image::{classify, ImageKind};
use crate::launch_thread::{Launch, LaunchThread, LaunchThreadOptions};
use crate::nvml::HostNvml;
use crate::{
    ptx, ContextExecutor, Copy3D, CuResult, DeviceStatus, DriverNodes, ExecUpdate, Executor,
    ExecutorError, GraphNode, HostRun, KernelNodeAttribute, LaunchHint, LaunchOptions, MemoryOp,
    PitchedSide, StreamRef,
};

/// Exported by rgpu's guest library so the daemon can tell it apart from
/// NVIDIA's driver.
pub const GUEST_LIB_MARKER: &str = "rgpu_guest_lib_marker";
/// The library base names cudarc tries, in its order.
const DRIVER_LIBRARY_NAMES: [&str; 2] = ["cuda", "nvcuda"];
/// Highest `CUdevice_attribute` asked for (CUDA 13.0 defines fewer; the rest
/// answer an error and are marked unsupported).
const LAST_DEVICE_ATTRIBUTE: i32 = 191;
const CU_CTX_MAP_HOST: u32 = 0x08;
const CU_MEMHOSTREGISTER_PORTABLE: u32 = 0x01;
const CU_MEMHOSTREGISTER_DEVICEMAP: u32 = 0x02;
/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD_HANDLE: usize = 0x2;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD_HANDLE: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType_enum::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `_BUFFER_SIZE`, `_END`.
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, sys::CUdevice) -> u32;
type CtxGetLimitFn = unsafe extern "C" fn(*mut usize, c_int) -> u32;
type CtxSetLimitFn = unsafe extern "C" fn(c_int, usize) -> u32;
type FuncGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, sys::CUfunction) -> u32;
type FuncSetAttributeFn = unsafe extern "C" fn(sys::CUfunction, c_int, c_int) -> u32;
type OccupancyMaxActiveClustersFn =
    unsafe extern "C" fn(*mut c_int, sys::CUfunction, *const LaunchConfig) -> u32;
type StreamSetAttributeFn = unsafe extern "C" fn(sys::CUstream, c_int, *const [u32; 16]) -> u32;
type StreamGetAttributeFn = unsafe extern "C" fn(sys::CUstream, c_int, *mut [u32; 16]) -> u32;
type KernelNodeSetAttributeFn =
    unsafe extern "C" fn(sys::CUgraphNode, c_int, *const [u32; 16]) -> u32;
type KernelNodeGetAttributeFn =
    unsafe extern "C" fn(sys::CUgraphNode, c_int, *mut [u32; 16]) -> u32;
type LaunchKernelExFn = unsafe extern "C" fn(
    *const LaunchConfig,
    sys::CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;

/// `cuGraphExecUpdate_v2`, whose result info holds an enum the driver
/// writes: read here as an integer.
/// `cuTensorMapEncodeTiled`, enums as integers.
type TensorMapEncodeTiledFn = unsafe extern "C" fn(
    *mut TensorMap,
    u32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> u32;
/// `cuTensorMapEncodeIm2col`, enums as integers.
type TensorMapEncodeIm2colFn = unsafe extern "C" fn(
    *mut TensorMap,
    u32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const c_int,
    *const c_int,
    u32,
    u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> u32;
type TensorMapReplaceAddressFn = unsafe extern "C" fn(*mut TensorMap, *mut c_void) -> u32;

/// `CUtensorMap`: 128 opaque bytes, 64-byte aligned (as cuda.h declares
/// it; the driver may rely on the alignment).
#[repr(C, align(64))]
struct TensorMap([u8; TENSOR_MAP_BYTES]);

/// One `CUstreamBatchMemOpParams` (a 48-byte union): the operation, the
/// address, the value, the flags, an unused alias.
#[repr(C, align(8))]
struct BatchMemOp([u64; 6]);

impl BatchMemOp {
    fn new(op: &MemoryOp) -> Self {
        // CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1, WRITE_VALUE_32 = 2,
        // WAIT_VALUE_64 = 4, WRITE_VALUE_64 = 5.
        let operation = match (op.wait, op.width) {
            (true, 8) => 4,
            (true, _) => 1,
            (false, 8) => 5,
            (false, _) => 2,
        };
        let value = if op.width == 8 {
            op.value
        } else {
            op.value & 0xffff_ffff
        };
        BatchMemOp([operation, op.address, value, u64::from(op.flags), 0, 0])
    }
}

/// A memory-operation node's parameters: `op`, one operation of `ctx`
/// (borrowed by the pointer: `op` must outlive the call that reads them).
fn batch_mem_op_params(
    ctx: sys::CUcontext,
    op: &mut BatchMemOp,
) -> sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
    sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
        ctx,
        count: 1,
        paramArray: (op as *mut BatchMemOp).cast(),
        flags: 0,
    }
}

type GraphExecUpdateFn =
    unsafe extern "C" fn(sys::CUgraphExec, sys::CUgraph, *mut ExecUpdateResultInfo) -> u32;

/// `CUgraphExecUpdateResultInfo` with its `CUgraphExecUpdateResult` as
/// an integer.
#[repr(C)]
struct ExecUpdateResultInfo {
    result: c_int,
    error_node: sys::CUgraphNode,
    error_from_node: sys::CUgraphNode,
}

/// `CUlaunchAttribute`: an id, then a 64-byte value union at offset 8 (a
/// cluster dimension is its first three `u32`s).
#[repr(C)]
struct LaunchAttribute {
    id: u32,
    pad: u32,
    value: [u32; 16],
}

impl LaunchAttribute {
    /// Attribute `id` whose value union starts with `words` (the rest zero).
    fn new(id: u32, words: &[u32]) -> Self {
        Self {
            id,
            pad: 0,
            value: crate::value_union(words),
        }
    }
}

/// `CUlaunchConfig`, built here from plain integers rather than through
/// cudarc's bindgen unions.
#[repr(C)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: sys::CUstream,
    attrs: *const LaunchAttribute,
    num_attrs: u32,
}

/// The entry points called with guest integers where cudarc has enums.
#[derive(Clone, Copy)]
struct IntegerEntryPoints {
    device_get_attribute: DeviceGetAttributeFn,
    ctx_get_limit: CtxGetLimitFn,
    ctx_set_limit: CtxSetLimitFn,
    func_get_attribute: FuncGetAttributeFn,
    func_set_attribute: FuncSetAttributeFn,
    occupancy_max_active_clusters: OccupancyMaxActiveClustersFn,
    /// Same C signature as `cuOccupancyMaxActiveClusters`.
    occupancy_max_potential_cluster_size: OccupancyMaxActiveClustersFn,
    launch_kernel_ex: LaunchKernelExFn,
    graph_exec_update: GraphExecUpdateFn,
    stream_set_attribute: StreamSetAttributeFn,
    stream_get_attribute: StreamGetAttributeFn,
    kernel_node_set_attribute: KernelNodeSetAttributeFn,
    kernel_node_get_attribute: KernelNodeGetAttributeFn,
    tensor_map_encode_tiled: TensorMapEncodeTiledFn,
    tensor_map_encode_im2col: TensorMapEncodeIm2colFn,
    tensor_map_replace_address: TensorMapReplaceAddressFn,
}

impl IntegerEntryPoints {
    /// Only after [`find_driver_library`] succeeded (cudarc would panic).
    fn load(library: &str) -> Result<Self, ExecutorError> {
        Ok(Self {
            device_get_attribute: driver_symbol(library, "cuDeviceGetAttribute")?,
            ctx_get_limit: driver_symbol(library, "cuCtxGetLimit")?,
            ctx_set_limit: driver_symbol(library, "cuCtxSetLimit")?,
            func_get_attribute: driver_symbol(library, "cuFuncGetAttribute")?,
            func_set_attribute: driver_symbol(library, "cuFuncSetAttribute")?,
            occupancy_max_active_clusters: driver_symbol(library, "cuOccupancyMaxActiveClusters")?,
            occupancy_max_potential_cluster_size: driver_symbol(
                library,
                "cuOccupancyMaxPotentialClusterSize",
            )?,
            launch_kernel_ex: driver_symbol(library, "cuLaunchKernelEx")?,
            graph_exec_update: driver_symbol(library, "cuGraphExecUpdate_v2")?,
            stream_set_attribute: driver_symbol(library, "cuStreamSetAttribute")?,
            stream_get_attribute: driver_symbol(library, "cuStreamGetAttribute")?,
            kernel_node_set_attribute: driver_symbol(library, "cuGraphKernelNodeSetAttribute")?,
            kernel_node_get_attribute: driver_symbol(library, "cuGraphKernelNodeGetAttribute")?,
            tensor_map_encode_tiled: driver_symbol(library, "cuTensorMapEncodeTiled")?,
            tensor_map_encode_im2col: driver_symbol(library, "cuTensorMapEncodeIm2col")?,
            tensor_map_replace_address: driver_symbol(library, "cuTensorMapReplaceAddress")?,
        })
    }
}

fn driver_symbol<T: Copy>(library: &str, name: &'static str) -> Result<T, ExecutorError> {
    // SAFETY: called once a driver library is known to load, so culib() does
    // not panic; each `T` above is the entry point's C signature in cuda.h,
    // with enum arguments as `int` and the CUresult as `u32`.
    unsafe { sys::culib().get::<T>(name).map(|symbol| *symbol) }.map_err(|_| {
        ExecutorError::MissingSymbol {
            library: library.to_owned(),
            symbol: name,
        }
    })
}

/// Finds the library cudarc is about to load: the first of `candidates`
/// that loads. Refuses rgpu's own guest library.
pub fn find_driver_library(candidates: &[String]) -> Result<String, ExecutorError> {
    for name in candidates {
        // SAFETY: loading runs the library's initialisers; these are the
        // names cudarc loads next anyway, so nothing runs that would not.
        let Ok(library) = (unsafe { libloading::Library::new(name.as_str()) }) else {
            continue;
        };
        // SAFETY: only the marker's presence is checked; it is never used.
        let marked = unsafe { library.get::<*const c_void>(GUEST_LIB_MARKER) }.is_ok();
        if marked {
            return Err(ExecutorError::GuestLibrary { name: name.clone() });
        }
        return Ok(name.clone());
    }
    Err(ExecutorError::LibraryNotFound {
        tried: candidates.join(", "),
    })
}

/// A `CUstreamCaptureMode` from the guest's integer.
fn capture_mode(mode: u32) -> CuResult<sys::CUstreamCaptureMode> {
    use sys::CUstreamCaptureMode_enum as Mode;
    Ok(match mode {
        0 => Mode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => Mode::CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

fn check(call: &'static str, result: sys::CUresult) -> CuResult<()> {
    check_code(call, result as u32)
}

fn check_code(call: &'static str, code: u32) -> CuResult<()> {
    if code == CUDA_SUCCESS {
        trace!("{call}");
        Ok(())
    } else {
        debug!("{call} failed with CUDA error {code}");
        Err(code)
    }
}

/// Calls `launch` with the `extra` argument of a kernel launch that hands
/// the driver `params` as one buffer (null when there are none). The array
/// and the size it points to live on this frame until `launch` returns.
fn with_param_buffer<R>(params: &[u8], launch: impl FnOnce(*mut *mut c_void) -> R) -> R {
    let mut size = params.len();
    let mut extra: [*mut c_void; 5] = [
        without_provenance_mut(LAUNCH_PARAM_BUFFER_POINTER),
        params.as_ptr().cast_mut().cast(),
        without_provenance_mut(LAUNCH_PARAM_BUFFER_SIZE),
        (&mut size as *mut usize).cast(),
        null_mut(),
    ];
    let extra = if params.is_empty() {
        null_mut()
    } else {
        extra.as_mut_ptr()
    };
    launch(extra)
}

/// The graph a capture on `stream` records into and what its next node
/// will depend on; `CUDA_ERROR_ILLEGAL_STATE` when it is not capturing.
fn capture_info(stream: sys::CUstream) -> CuResult<(sys::CUgraph, Vec<sys::CUgraphNode>)> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    let mut graph: sys::CUgraph = null_mut();
    let mut dependencies: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: a live stream; valid out-pointers.
    check("cuStreamGetCaptureInfo_v3", unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            &mut dependencies,
            &mut edges,
            &mut count,
        )
    })?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let nodes = if dependencies.is_null() || count == 0 {
        Vec::new()
    } else {
        // SAFETY: the driver's array of `count` nodes, valid until the
        // stream's next capture call; copied at once.
        unsafe { std::slice::from_raw_parts(dependencies, count) }.to_vec()
    };
    Ok((graph, nodes))
}

/// A driver list of nodes: `list` asked for the count (NULL array), then
/// for the nodes.
fn list_nodes(
    mut list: impl FnMut(*mut sys::CUgraphNode, *mut usize) -> sys::CUresult,
) -> CuResult<Vec<sys::CUgraphNode>> {
    let mut count = 0usize;
    check("cuGraphGetNodes", list(null_mut(), &mut count))?;
    // The driver refuses an array for no nodes (a root's dependencies).
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut nodes = vec![null_mut(); count];
    let mut filled = count;
    check("cuGraphGetNodes", list(nodes.as_mut_ptr(), &mut filled))?;
    nodes.truncate(filled.min(count));
    Ok(nodes)
}

/// Makes `ctx` current on the calling thread (a launch thread's first act).
fn make_current(ctx: sys::CUcontext) -> CuResult<()> {
    // SAFETY: `ctx` is live until the launch thread calling this is joined.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `launch` with its parameter block `params`, handed to the driver on the
/// calling thread.
fn launch_with_params(launch: &Launch, params: &[u8]) -> CuResult<()> {
    with_param_buffer(params, |extra| {
        // SAFETY: live function and stream (the session keeps them until
        // the launch has been made); `extra` describes `params` (read, not
        // written, during the call) and ends with END.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                launch.function,
                launch.grid[0],
                launch.grid[1],
                launch.grid[2],
                launch.block[0],
                launch.block[1],
                launch.block[2],
                launch.shared_mem_bytes,
                launch.stream,
                null_mut(),
                extra,
            )
        })
    })
}

/// Calls `f` with the driver's parameters of kernel node `node` (a
/// `GraphNode::Kernel` whose function is `func`), its parameter buffer
/// handed over as `extra`; another kind of node is INVALID_VALUE.
fn with_kernel_node_params<R>(
    node: &GraphNode<'_>,
    func: sys::CUfunction,
    f: impl FnOnce(&sys::CUDA_KERNEL_NODE_PARAMS) -> CuResult<R>,
) -> CuResult<R> {
    let GraphNode::Kernel {
        grid,
        block,
        shared_mem_bytes,
        params,
        ..
    } = *node
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    with_param_buffer(params, |extra| {
        f(&sys::CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: block[0],
            blockDimY: block[1],
            blockDimZ: block[2],
            sharedMemBytes: shared_mem_bytes,
            kernelParams: null_mut(),
            extra,
            kern: null_mut(),
            ctx: null_mut(),
        })
    })
}

/// The driver's parameters of memset node `node` (a `GraphNode::Memset`;
/// another kind is INVALID_VALUE).
/// A memcpy node's `CUDA_MEMCPY3D`: device memory on both sides (page-locked
/// memory by its device address).
fn memcpy_node_params(copy: &Copy3D) -> CuResult<sys::CUDA_MEMCPY3D> {
    let device = sys::CUmemorytype_enum::CU_MEMORYTYPE_DEVICE;
    let size = |v: u64| usize::try_from(v).map_err(|_| CUDA_ERROR_INVALID_VALUE);
    // One row needs no pitch (and a long one would pass the
    // device's largest pitch).
    let one_row = copy.height <= 1 && copy.depth <= 1;
    let pitch = |side: &PitchedSide| match one_row {
        true => Ok(0),
        false => size(side.pitch),
    };
    let rows = |side: &PitchedSide| match copy.depth <= 1 {
        true => Ok(0),
        false => size(side.rows),
    };
    // Spelled out: its memory-type enums have no zero value, so
    // an all-zero CUDA_MEMCPY3D is not a valid Rust value.
    Ok(sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: std::ptr::null(),
        srcDevice: copy.src.address,
        srcArray: null_mut(),
        reserved0: null_mut(),
        srcPitch: pitch(&copy.src)?,
        srcHeight: rows(&copy.src)?,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: null_mut(),
        dstDevice: copy.dst.address,
        dstArray: null_mut(),
        reserved1: null_mut(),
        dstPitch: pitch(&copy.dst)?,
        dstHeight: rows(&copy.dst)?,
        WidthInBytes: size(copy.width)?,
        Height: size(copy.height)?,
        Depth: size(copy.depth)?,
    })
}

fn memset_node_params(node: &GraphNode<'_>) -> CuResult<sys::CUDA_MEMSET_NODE_PARAMS> {
    let GraphNode::Memset {
        dst,
        value,
        element_size,
        width,
        height,
        pitch,
    } = *node
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let size = |v: u64| usize::try_from(v).map_err(|_| CUDA_ERROR_INVALID_VALUE);
    Ok(sys::CUDA_MEMSET_NODE_PARAMS {
        dst,
        pitch: size(pitch)?,
        value,
        elementSize: element_size,
        width: size(width)?,
        height: size(height)?,
    })
}

/// The daemon-wide CUDA executor: one host GPU.
pub struct CudaExecutor {
    device: sys::CUdevice,
    /// The device's primary context, retained on first use and kept until
    /// the executor goes: guest memory is registered in it (portable, so
    /// every session's context can DMA from it) and registrations outlive
    /// sessions. Lazily, so that a standby daemon process holds no device
    /// memory before its connection arrives.
    primary: Mutex<Option<sys::CUcontext>>,
    /// A session runs in the primary context now. The first session of a
    /// process uses it (a worker process serves one guest process, which
    /// mostly has one context), so a worker holds one context's device
    /// memory, as the native process does; later ones get contexts of
    /// their own.
    primary_in_use: Arc<AtomicBool>,
    info: DeviceInfo,
    driver_version: i32,
    entry: IntegerEntryPoints,
    /// The host's NVML, where it loads: utilisation and the driver version.
    nvml: Option<HostNvml>,
    /// Contexts launch kernels on a thread of their own, which polls its
    /// queue this long before it sleeps ([`CudaExecutor::with_launch_thread`]).
    launch_thread: Option<std::time::Duration>,
    /// Launch threads log where their time went when they end.
    profile_launches: bool,
    /// The CPUs launch threads run on (`None`: the scheduler's choice).
    launch_cpus: Option<CpuList>,
}

// SAFETY: the primary context handle is only passed to the driver, which is
// thread-safe; it is never dereferenced here.
unsafe impl Send for CudaExecutor {}
// SAFETY: as above; registration calls push and pop the context on the
// calling thread only.
unsafe impl Sync for CudaExecutor {}

impl CudaExecutor {
    /// Whether each context launches kernels on a thread of its own, while
    /// its session reads the next command (docs/ARCHITECTURE.md §7, 7a),
    /// and how long that thread polls its queue before it sleeps (`None`:
    /// no launch thread).
    pub fn with_launch_thread(mut self, spin: Option<std::time::Duration>) -> Self {
        self.launch_thread = spin;
        self
    }

    /// Whether each launch thread logs, when it ends, how long the driver
    /// took and how long it waited for its session (`--profile-launches`).
    pub fn with_launch_profile(mut self, profile: bool) -> Self {
        self.profile_launches = profile;
        self
    }

    /// The CPUs each launch thread is confined to (`--launch-cpus`): the
    /// driver's launch rate depends on the CPU that calls it.
    pub fn with_launch_cpus(mut self, cpus: Option<CpuList>) -> Self {
        self.launch_cpus = cpus;
        self
    }

    /// The primary context, retained on first use.
    fn primary(&self) -> CuResult<sys::CUcontext> {
        let mut primary = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ctx) = *primary {
            return Ok(ctx);
        }
        let mut ctx: sys::CUcontext = null_mut();
        // SAFETY: valid out-pointer; released in `drop`.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, self.device)
        })?;
        *primary = Some(ctx);
        Ok(ctx)
    }

    /// Runs `f` with the primary context current on this thread.
    fn in_primary<T>(&self, f: impl FnOnce() -> T) -> CuResult<T> {
        let primary = self.primary()?;
        // SAFETY: the primary context is retained until `drop`.
        check("cuCtxPushCurrent_v2", unsafe {
            sys::cuCtxPushCurrent_v2(primary)
        })?;
        let result = f();
        let mut popped: sys::CUcontext = null_mut();
        // SAFETY: valid out-pointer; pops what was pushed above.
        let _ = check("cuCtxPopCurrent_v2", unsafe {
            sys::cuCtxPopCurrent_v2(&mut popped)
        });
        Ok(result)
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        let retained = self
            .primary
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        if retained {
            // SAFETY: retained by `primary`; released once.
            let _ = check("cuDevicePrimaryCtxRelease_v2", unsafe {
                sys::cuDevicePrimaryCtxRelease_v2(self.device)
            });
        }
    }
}

impl CudaExecutor {
    pub fn new(gpu_ordinal: u32) -> Result<CudaExecutor, ExecutorError> {
        let mut candidates: Vec<String> = Vec::new();
        for name in DRIVER_LIBRARY_NAMES
            .iter()
            .flat_map(|name| cudarc::get_lib_name_candidates(name))
        {
            // cudarc's list repeats some names; the first occurrence decides.
            if !candidates.contains(&name) {
                candidates.push(name);
            }
        }
        let library = find_driver_library(&candidates)?;
        debug!("cuda executor: driver library {library}");
        let entry = IntegerEntryPoints::load(&library)?;
        let call = |call: &'static str, result: sys::CUresult| {
            check(call, result).map_err(|code| ExecutorError::DriverCall { call, code })
        };

        // SAFETY: plain driver initialisation.
        check("cuInit", unsafe { sys::cuInit(0) }).map_err(ExecutorError::InitFailed)?;
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer.
        call("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        let count = u32::try_from(count).unwrap_or(0);
        if gpu_ordinal >= count {
            return Err(ExecutorError::NoSuchGpu {
                ordinal: gpu_ordinal,
                count,
            });
        }
        let ordinal = c_int::try_from(gpu_ordinal).map_err(|_| ExecutorError::NoSuchGpu {
            ordinal: gpu_ordinal,
            count,
        })?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer, the ordinal is in range.
        call("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, ordinal)
        })?;

        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds the 256 bytes the call may write.
        call("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device)
        })?;
        let name: Vec<u8> = name
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        let name = String::from_utf8_lossy(&name).into_owned();

        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: `uuid` is a valid out-pointer.
        call("cuDeviceGetUuid_v2", unsafe {
            sys::cuDeviceGetUuid_v2(&mut uuid, device)
        })?;
        let uuid = uuid.bytes.map(|b| b as u8);

        let mut total_mem = 0usize;
        // SAFETY: `total_mem` is a valid out-pointer.
        call("cuDeviceTotalMem_v2", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total_mem, device)
        })?;

        let mut attributes = vec![ATTRIBUTE_UNSUPPORTED; ATTRIBUTE_SLOTS];
        for attribute in 1..=LAST_DEVICE_ATTRIBUTE {
            let mut value: c_int = 0;
            // SAFETY: `value` is a valid out-pointer; an unknown attribute
            // number is answered with an error code.
            let code = unsafe { (entry.device_get_attribute)(&mut value, attribute, device) };
            if code == CUDA_SUCCESS {
                if let Some(slot) = attributes.get_mut(attribute as usize) {
                    *slot = value;
                }
            }
        }

        let mut driver_version: c_int = 0;
        // SAFETY: `driver_version` is a valid out-pointer.
        call("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut driver_version)
        })?;
        info!(
            "cuda executor: GPU {gpu_ordinal} \"{name}\", {} MiB, driver API {driver_version}",
            total_mem >> 20
        );
        let info = DeviceInfo {
            name,
            uuid,
            total_mem: total_mem as u64,
            host_ordinal: gpu_ordinal,
            attributes,
        };
        let nvml = HostNvml::open(&info.uuid_string());
        Ok(CudaExecutor {
            device,
            primary: Mutex::new(None),
            primary_in_use: Arc::new(AtomicBool::new(false)),
            info,
            driver_version,
            entry,
            nvml,
            launch_thread: None,
            profile_launches: false,
            launch_cpus: None,
        })
    }
}

impl Executor for CudaExecutor {
    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        vec![self.info.clone()]
    }

    fn create_context(&self, device: u32) -> CuResult<Box<dyn ContextExecutor>> {
        if device != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let (ctx, primary) = if !self.primary_in_use.swap(true, Ordering::AcqRel) {
            let ctx = match self.primary() {
                Ok(ctx) => ctx,
                Err(code) => {
                    self.primary_in_use.store(false, Ordering::Release);
                    return Err(code);
                }
            };
            // SAFETY: the primary context is retained until the executor
            // goes; it becomes current on this (the session's) thread.
            if let Err(code) = check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) }) {
                self.primary_in_use.store(false, Ordering::Release);
                return Err(code);
            }
            debug!("cuda: session in the primary context {ctx:p}");
            (ctx, Some(Arc::clone(&self.primary_in_use)))
        } else {
            let mut ctx: sys::CUcontext = null_mut();
            // SAFETY: `ctx` is a valid out-pointer; NULL creation parameters
            // ask for a plain context. It becomes current on this (the
            // worker) thread.
            check("cuCtxCreate_v4", unsafe {
                sys::cuCtxCreate_v4(&mut ctx, null_mut(), CU_CTX_MAP_HOST, self.device)
            })?;
            debug!("cuda: context {ctx:p} created");
            (ctx, None)
        };
        let launcher = match self.launch_thread {
            Some(spin) => match LaunchThread::start(
                ctx,
                make_current,
                launch_with_params,
                &LaunchThreadOptions {
                    spin,
                    profile: self.profile_launches,
                    cpus: self.launch_cpus.clone(),
                },
            ) {
                Ok(thread) => Some(thread),
                Err(e) => {
                    warn!("cuda: no launch thread ({e}): the session launches itself");
                    None
                }
            },
            None => None,
        };
        Ok(Box::new(CudaContext {
            ctx,
            primary,
            launcher,
            launch_here: false,
            entry: self.entry,
            next_handle: 1,
            allocations: HashSet::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            streams: HashSet::new(),
            events: HashMap::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
            graph_nodes: HashMap::new(),
            capture_named: HashSet::new(),
            device: self.device,
            physical: HashMap::new(),
            reservations: HashMap::new(),
            mappings: HashMap::new(),
            ipc_mappings: HashMap::new(),
        }))
    }

    fn register_host_memory(&self, run: HostRun) -> CuResult<()> {
        if run.len == 0 {
            return Ok(());
        }
        let code = self.in_primary(|| {
            // SAFETY: the caller guarantees `run` is mapped memory of
            // `run.len` bytes that stays mapped until it is unregistered.
            let result = unsafe {
                sys::cuMemHostRegister_v2(
                    run.ptr.cast(),
                    run.len,
                    CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
                )
            };
            result as u32
        })?;
        match code {
            CUDA_SUCCESS => {
                debug!("cuda: registered {} bytes at {:p}", run.len, run.ptr);
                Ok(())
            }
            code => {
                warn!(
                    "cuMemHostRegister of {} bytes at {:p} failed with CUDA error {code}: copies \
                     from there will be staged by the driver",
                    run.len, run.ptr
                );
                Err(code)
            }
        }
    }

    fn unregister_host_memory(&self, run: HostRun) {
        let _ = self.in_primary(|| {
            // SAFETY: registered by `register_host_memory`, still mapped.
            check("cuMemHostUnregister", unsafe {
                sys::cuMemHostUnregister(run.ptr.cast())
            })
        });
    }

    /// NVML's figure for this process: with a worker per guest process,
    /// exactly what that guest process holds.
    fn process_device_memory(&self) -> Option<u64> {
        self.nvml.as_ref()?.process_memory(std::process::id())
    }

    fn device_status(&self, device: u32) -> CuResult<DeviceStatus> {
        if device != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let utilization = self.nvml.as_ref().and_then(HostNvml::utilization);
        // NVML's view where the host has it: what NVIDIA's NVML would
        // report, and no context (hundreds of MiB of device memory, for a
        // guest process that only asked NVML).
        let (free, total) = match self.nvml.as_ref().and_then(HostNvml::memory) {
            Some(memory) => memory,
            None => {
                let (mut free, mut total) = (0usize, 0usize);
                self.in_primary(|| {
                    // SAFETY: valid out-pointers; the primary context is current.
                    check("cuMemGetInfo_v2", unsafe {
                        sys::cuMemGetInfo_v2(&mut free, &mut total)
                    })
                })??;
                (free as u64, total as u64)
            }
        };
        Ok(DeviceStatus {
            free,
            total,
            gpu_utilization: utilization.map(|(gpu, _)| gpu),
            memory_utilization: utilization.map(|(_, memory)| memory),
            driver_version: self
                .nvml
                .as_ref()
                .map(|n| n.driver_version().to_owned())
                .filter(|v| !v.is_empty())
                .or_else(crate::nvml::kernel_module_version)
                .unwrap_or_default(),
        })
    }
}

/// The number a driver object is named by ([`CudaContext`]'s streams,
/// events and functions): its address.
fn object_handle<T>(object: *mut T) -> u64 {
    object.expose_provenance() as u64
}

/// The driver object named `handle` by [`object_handle`]. Only the
/// session's tables hand out such numbers, for objects still alive.
fn driver_object<T>(handle: u64) -> *mut T {
    std::ptr::with_exposed_provenance_mut(handle as usize)
}

struct LoadedModule {
    module: sys::CUmodule,
    /// Function handles already given out, by name.
    functions: HashMap<String, u64>,
}

/// One session's CUDA context, current on the session's worker thread.
pub struct CudaContext {
    ctx: sys::CUcontext,
    /// Where launches go when the executor has launch threads.
    launcher: Option<LaunchThread>,
    /// Launches are made on the session's thread for now (a capture).
    launch_here: bool,
    /// Set when this session runs in the primary context, which outlives
    /// it: its objects are freed one by one, then the flag is cleared.
    primary: Option<Arc<AtomicBool>>,
    /// Device memory it allocated and has not freed.
    allocations: HashSet<sys::CUdeviceptr>,
    entry: IntegerEntryPoints,
    /// One counter for the handle kinds named by number: modules, graphs,
    /// executable graphs, nodes, physical allocations.
    next_handle: u64,
    modules: HashMap<u64, LoadedModule>,
    /// Streams, events and functions are named by the driver's own object
    /// (its address as a number), so a launch translates a guest handle
    /// once, in the session's table, and never here ([`object_handle`]).
    /// These tables only say what to free, and by which module.
    ///
    /// Function to the handle of its module.
    functions: HashMap<u64, u64>,
    streams: HashSet<u64>,
    /// Event to the number of guest handles naming it: the driver may
    /// answer two opens of one IPC event handle with the same event.
    events: HashMap<u64, u32>,
    graphs: HashMap<u64, sys::CUgraph>,
    graph_execs: HashMap<u64, sys::CUgraphExec>,
    /// Nodes of graphs built node by node, and driver nodes named when
    /// listed: (graph handle, node), until their graph is destroyed.
    graph_nodes: HashMap<u64, (u64, sys::CUgraphNode)>,
    /// Graphs of captures still going on, named when the session asked for
    /// them (`cuStreamGetCaptureInfo`): a failed capture destroys them.
    capture_named: HashSet<u64>,
    /// The device, for the virtual-memory calls' locations.
    device: sys::CUdevice,
    /// Virtual memory: physical allocations by handle, reserved ranges and
    /// mapped ranges (address -> size), released at the end.
    physical: HashMap<u64, sys::CUmemGenericAllocationHandle>,
    reservations: HashMap<sys::CUdeviceptr, usize>,
    mappings: HashMap<sys::CUdeviceptr, usize>,
    /// Memory of other processes opened through CUDA IPC, with how many
    /// times each is open (the driver counts opens of one handle by one
    /// context and answers the same pointer), closed at the end.
    ipc_mappings: HashMap<sys::CUdeviceptr, u32>,
}

impl CudaContext {
    /// This context's device as a memory location.
    fn device_location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.device,
        }
    }

    /// Pinned memory on this context's device, no shareable handle.
    fn pinned_device_memory(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType_enum(0),
            location: self.device_location(),
            win32HandleMetaData: null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    fn new_handle(&mut self) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        handle
    }

    /// The handle of driver graph `graph` (a capture's), named now if it
    /// has none.
    fn name_driver_graph(&mut self, graph: sys::CUgraph) -> u64 {
        if let Some((handle, _)) = self.graphs.iter().find(|(_, g)| **g == graph) {
            return *handle;
        }
        let handle = self.new_handle();
        self.graphs.insert(handle, graph);
        self.capture_named.insert(handle);
        handle
    }

    /// Driver nodes of graph `graph` (a handle) with their handles (named
    /// now where they have none) and types.
    fn name_driver_nodes(
        &mut self,
        graph: u64,
        nodes: &[sys::CUgraphNode],
    ) -> CuResult<Vec<(u64, u32)>> {
        let mut named = Vec::with_capacity(nodes.len());
        for &node in nodes {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node the driver just listed, a valid out-pointer.
            check("cuGraphNodeGetType", unsafe {
                sys::cuGraphNodeGetType(node, &mut kind)
            })?;
            let known = self
                .graph_nodes
                .iter()
                .find(|(_, (_, n))| *n == node)
                .map(|(handle, _)| *handle);
            let handle = match known {
                Some(handle) => handle,
                None => {
                    let handle = self.new_handle();
                    self.graph_nodes.insert(handle, (graph, node));
                    handle
                }
            };
            named.push((handle, kind as u32));
        }
        Ok(named)
    }

    fn stream(&self, stream: StreamRef) -> sys::CUstream {
        match stream {
            StreamRef::Legacy => null_mut(),
            StreamRef::PerThread => without_provenance_mut(STREAM_PER_THREAD_HANDLE),
            StreamRef::Created(handle) => {
                debug_assert!(self.streams.contains(&handle), "stream {handle:#x}");
                driver_object(handle)
            }
        }
    }

    /// `hint` as the driver's `CUlaunchAttribute` (its value union laid
    /// out as cuda.h has it), with this context's event objects.
    fn launch_attribute(&self, hint: &LaunchHint) -> CuResult<LaunchAttribute> {
        let (id, value) = hint.driver_words(|event| Ok(object_handle(self.event(event))))?;
        Ok(LaunchAttribute { id, pad: 0, value })
    }

    /// The driver's graph node `node`.
    fn graph_node(&self, node: u64) -> CuResult<sys::CUgraphNode> {
        self.graph_nodes
            .get(&node)
            .map(|(_, hnode)| *hnode)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// The driver's executable graph `exec` and graph node `node`.
    fn exec_and_node(
        &self,
        exec: u64,
        node: u64,
    ) -> CuResult<(sys::CUgraphExec, sys::CUgraphNode)> {
        let hexec = *self
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let (_, hnode) = *self
            .graph_nodes
            .get(&node)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok((hexec, hnode))
    }

    fn event(&self, event: u64) -> sys::CUevent {
        debug_assert!(self.events.contains_key(&event), "event {event:#x}");
        driver_object(event)
    }

    fn function(&self, function: u64) -> sys::CUfunction {
        debug_assert!(
            self.functions.contains_key(&function),
            "function {function:#x}"
        );
        driver_object(function)
    }

    fn stream_sync(stream: sys::CUstream) -> CuResult<()> {
        // SAFETY: `stream` is NULL, CU_STREAM_PER_THREAD or a live stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream)
        })
    }

    /// `(layout)` of a function, asked index by index until the driver says
    /// there are no more parameters.
    fn param_layout(function: sys::CUfunction) -> FunctionInfo {
        let mut params = Vec::new();
        for index in 0..MAX_KERNEL_PARAMS {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: `function` is live; both out-pointers are valid.
            let code =
                unsafe { sys::cuFuncGetParamInfo(function, index, &mut offset, &mut size) } as u32;
            if code != CUDA_SUCCESS {
                if index == 0 && code != CUDA_ERROR_INVALID_VALUE {
                    warn!("cuFuncGetParamInfo failed with CUDA error {code}: no parameter layout");
                }
                break;
            }
            match (u32::try_from(offset), u32::try_from(size)) {
                (Ok(offset), Ok(size)) => params.push(ParamSlot { offset, size }),
                _ => break,
            }
        }
        FunctionInfo { params }
    }
}

impl CudaContext {
    /// Memory of other processes this session opened is closed before its
    /// context ends (as many times as it was opened), once its work is
    /// done.
    fn close_ipc_mappings(&mut self) {
        if self.ipc_mappings.is_empty() {
            return;
        }
        // SAFETY: waits for this context's work, which may use the memory.
        let _ = check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
        for (ptr, opens) in self.ipc_mappings.drain() {
            for _ in 0..opens {
                // SAFETY: a pointer cuIpcOpenMemHandle gave this context,
                // closed once per open.
                let _ = check("cuIpcCloseMemHandle", unsafe {
                    sys::cuIpcCloseMemHandle(ptr)
                });
            }
        }
    }

    /// Virtual memory belongs to the device, not the context: unmapped,
    /// unreserved and released here whichever way the context ends.
    fn release_virtual_memory(&mut self) {
        if self.mappings.is_empty() && self.reservations.is_empty() && self.physical.is_empty() {
            return;
        }
        // SAFETY: waits for this context's work, which may use the ranges.
        let _ = check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
        for (address, size) in self.mappings.drain() {
            // SAFETY: a range this session mapped, unmapped once.
            let _ = check("cuMemUnmap", unsafe { sys::cuMemUnmap(address, size) });
        }
        for (address, size) in self.reservations.drain() {
            // SAFETY: a range this session reserved, freed once.
            let _ = check("cuMemAddressFree", unsafe {
                sys::cuMemAddressFree(address, size)
            });
        }
        for (_, handle) in self.physical.drain() {
            // SAFETY: an allocation this session created, released once.
            let _ = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) });
        }
    }
}

impl Drop for CudaContext {
    fn drop(&mut self) {
        // Queued launches reach the driver, and the thread ends, before
        // anything of the context goes.
        self.launcher = None;
        self.close_ipc_mappings();
        self.release_virtual_memory();
        let Some(primary) = self.primary.take() else {
            // Destroying the context frees its memory, modules, streams,
            // events.
            // SAFETY: the context is ours; nothing uses it after this.
            let _ = check("cuCtxDestroy_v2", unsafe { sys::cuCtxDestroy_v2(self.ctx) });
            debug!("cuda: context {:p} destroyed", self.ctx);
            return;
        };
        // The primary context stays (registrations live in it): free what
        // this session made, after its work is done. Failures (a poisoned
        // context) change nothing: the process's end frees everything.
        // Every call below frees an object this session created in this
        // context, current on this thread, once.
        // SAFETY: as above; no arguments.
        let _ = check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
        for ptr in self.allocations.drain() {
            // SAFETY: as above.
            let _ = check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) });
        }
        for event in self.events.drain().map(|(event, _)| event) {
            // SAFETY: as above.
            let _ = check("cuEventDestroy_v2", unsafe {
                sys::cuEventDestroy_v2(driver_object(event))
            });
        }
        for stream in self.streams.drain() {
            // SAFETY: as above.
            let _ = check("cuStreamDestroy_v2", unsafe {
                sys::cuStreamDestroy_v2(driver_object(stream))
            });
        }
        for (_, exec) in self.graph_execs.drain() {
            // SAFETY: as above.
            let _ = check("cuGraphExecDestroy", unsafe {
                sys::cuGraphExecDestroy(exec)
            });
        }
        for (_, graph) in self.graphs.drain() {
            // SAFETY: as above.
            let _ = check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph) });
        }
        self.functions.clear();
        for (_, loaded) in self.modules.drain() {
            // SAFETY: as above.
            let _ = check("cuModuleUnload", unsafe {
                sys::cuModuleUnload(loaded.module)
            });
        }
        // SAFETY: makes no context current on this thread.
        let _ = check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(null_mut())
        });
        primary.store(false, Ordering::Release);
        debug!("cuda: session in the primary context {:p} ended", self.ctx);
    }
}

impl ContextExecutor for CudaContext {
    fn synchronize(&mut self) -> CuResult<()> {
        // SAFETY: no arguments; acts on the current (this) context.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn get_limit(&mut self, limit: u32) -> CuResult<u64> {
        let limit = c_int::try_from(limit).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut value = 0usize;
        // SAFETY: valid out-pointer; unknown limits are answered with errors.
        check_code("cuCtxGetLimit", unsafe {
            (self.entry.ctx_get_limit)(&mut value, limit)
        })?;
        Ok(value as u64)
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> CuResult<()> {
        let limit = c_int::try_from(limit).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let value = usize::try_from(value).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: plain values; unknown limits are answered with errors.
        check_code("cuCtxSetLimit", unsafe {
            (self.entry.ctx_set_limit)(limit, value)
        })
    }

    fn mem_alloc(&mut self, size: u64) -> CuResult<u64> {
        let size = usize::try_from(size).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        check("cuMemAlloc_v2", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, size)
        })?;
        trace!("cuda: mem_alloc {size} -> {ptr:#x}");
        self.allocations.insert(ptr);
        Ok(ptr)
    }

    fn mem_free(&mut self, device_ptr: u64) -> CuResult<()> {
        // SAFETY: the driver checks the pointer against this context's
        // allocations; a foreign one is an error, not a crash.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(device_ptr) })?;
        self.allocations.remove(&device_ptr);
        Ok(())
    }

    fn mem_get_info(&mut self) -> CuResult<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn memcpy_htod(
        &mut self,
        stream: StreamRef,
        dst: u64,
        src: &[HostRun],
        wait_for_source: bool,
    ) -> CuResult<()> {
        let stream = self.stream(stream);
        let mut at = dst;
        for run in src.iter().filter(|r| r.len > 0) {
            // SAFETY: `run` is mapped guest memory (HostRun); the driver
            // checks the device range against this context's allocations.
            check("cuMemcpyHtoDAsync_v2", unsafe {
                sys::cuMemcpyHtoDAsync_v2(at, run.ptr.cast_const().cast(), run.len, stream)
            })?;
            at = at
                .checked_add(run.len as u64)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        }
        if wait_for_source {
            Self::stream_sync(stream)?;
        }
        Ok(())
    }

    fn memcpy_dtoh(
        &mut self,
        stream: StreamRef,
        dst: &[HostRun],
        src: u64,
        wait: bool,
    ) -> CuResult<()> {
        let stream = self.stream(stream);
        let mut at = src;
        for run in dst.iter().filter(|r| r.len > 0) {
            // SAFETY: as in memcpy_htod, with the roles swapped.
            check("cuMemcpyDtoHAsync_v2", unsafe {
                sys::cuMemcpyDtoHAsync_v2(run.ptr.cast(), at, run.len, stream)
            })?;
            at = at
                .checked_add(run.len as u64)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        }
        if wait {
            Self::stream_sync(stream)?;
        }
        Ok(())
    }

    fn memcpy_dtod(&mut self, stream: StreamRef, dst: u64, src: u64, size: u64) -> CuResult<()> {
        let stream = self.stream(stream);
        let size = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: device addresses are checked by the driver.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, size, stream)
        })
    }

    fn memset(
        &mut self,
        stream: StreamRef,
        dst: u64,
        value: u32,
        element_size: u32,
        count: u64,
    ) -> CuResult<()> {
        let stream = self.stream(stream);
        let count = usize::try_from(count).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        match element_size {
            // SAFETY: the driver checks the device address; plain integers.
            1 => check("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(dst, value as u8, count, stream)
            }),
            // SAFETY: as above.
            2 => check("cuMemsetD16Async", unsafe {
                sys::cuMemsetD16Async(dst, value as u16, count, stream)
            }),
            // SAFETY: as above.
            4 => check("cuMemsetD32Async", unsafe {
                sys::cuMemsetD32Async(dst, value, count, stream)
            }),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn module_load(&mut self, image: &[u8]) -> CuResult<u64> {
        let kind = classify(image).map_err(|e| {
            warn!("cuda: module image refused: {e}");
            CUDA_ERROR_INVALID_IMAGE
        })?;
        // The driver reads PTX up to a NUL and binaries by their headers
        // (checked above); binaries get 8-byte alignment, as nvcc gives them.
        let copy: Vec<u64>;
        let data: *const c_void = match kind {
            ImageKind::Ptx => {
                let text = ptx::text(image).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
                copy = nul_terminated_words(text.as_bytes());
                copy.as_ptr().cast()
            }
            ImageKind::Cubin | ImageKind::Fatbin if image.as_ptr().align_offset(8) == 0 => {
                image.as_ptr().cast()
            }
            ImageKind::Cubin | ImageKind::Fatbin => {
                copy = aligned_words(image);
                copy.as_ptr().cast()
            }
        };
        let mut module: sys::CUmodule = null_mut();
        // SAFETY: `data` points at a whole image checked by `classify`
        // (NUL-terminated text, or a binary whose headers fit), alive for
        // the call.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, data)
        })?;
        let handle = self.new_handle();
        self.modules.insert(
            handle,
            LoadedModule {
                module,
                functions: HashMap::new(),
            },
        );
        debug!(
            "cuda: module {handle} loaded ({kind:?}, {} bytes)",
            image.len()
        );
        Ok(handle)
    }

    fn module_unload(&mut self, module: u64) -> CuResult<()> {
        let loaded = self.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: a module this context loaded and has not unloaded.
        check("cuModuleUnload", unsafe {
            sys::cuModuleUnload(loaded.module)
        })?;
        self.modules.remove(&module);
        self.functions.retain(|_, m| *m != module);
        Ok(())
    }

    fn module_get_function(&mut self, module: u64, name: &str) -> CuResult<(u64, FunctionInfo)> {
        let loaded = self.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let cname = CString::new(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut function: sys::CUfunction = null_mut();
        // SAFETY: live module, NUL-terminated name, valid out-pointer.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut function, loaded.module, cname.as_ptr())
        })?;
        let info = Self::param_layout(function);
        if let Some(handle) = loaded.functions.get(name) {
            return Ok((*handle, info));
        }
        let handle = object_handle(function);
        self.functions.insert(handle, module);
        if let Some(loaded) = self.modules.get_mut(&module) {
            loaded.functions.insert(name.to_owned(), handle);
        }
        trace!(
            "cuda: function {name} -> {handle}, {} params",
            info.params.len()
        );
        Ok((handle, info))
    }

    fn module_get_global(&mut self, module: u64, name: &str) -> CuResult<(u64, u64)> {
        let loaded = self.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let cname = CString::new(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let (mut ptr, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: live module, NUL-terminated name, valid out-pointers.
        check("cuModuleGetGlobal_v2", unsafe {
            sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, loaded.module, cname.as_ptr())
        })?;
        Ok((ptr, size as u64))
    }

    fn func_get_attribute(&mut self, function: u64, attribute: i32) -> CuResult<i32> {
        let function = self.function(function);
        let mut value: c_int = 0;
        // SAFETY: live function, valid out-pointer; unknown attributes are
        // answered with an error code.
        check_code("cuFuncGetAttribute", unsafe {
            (self.entry.func_get_attribute)(&mut value, attribute, function)
        })?;
        Ok(value)
    }

    fn func_set_attribute(&mut self, function: u64, attribute: i32, value: i32) -> CuResult<()> {
        let function = self.function(function);
        // SAFETY: live function; unknown attributes and bad values are
        // answered with error codes.
        check_code("cuFuncSetAttribute", unsafe {
            (self.entry.func_set_attribute)(function, attribute, value)
        })
    }

    fn occupancy_max_active_blocks(
        &mut self,
        function: u64,
        block_size: i32,
        dynamic_smem_bytes: u64,
        flags: u32,
    ) -> CuResult<i32> {
        let function = self.function(function);
        let dynamic = usize::try_from(dynamic_smem_bytes).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut blocks: c_int = 0;
        check(
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
            // SAFETY: live function, valid out-pointer; plain integers.
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                    &mut blocks,
                    function,
                    block_size,
                    dynamic,
                    flags,
                )
            },
        )?;
        Ok(blocks)
    }

    fn occupancy_available_dynamic_smem(
        &mut self,
        function: u64,
        num_blocks: i32,
        block_size: i32,
    ) -> CuResult<u64> {
        let function = self.function(function);
        let mut bytes = 0usize;
        // SAFETY: live function, valid out-pointer; plain integers.
        check("cuOccupancyAvailableDynamicSMemPerBlock", unsafe {
            sys::cuOccupancyAvailableDynamicSMemPerBlock(
                &mut bytes, function, num_blocks, block_size,
            )
        })?;
        Ok(bytes as u64)
    }

    fn occupancy_max_potential_cluster_size(
        &mut self,
        function: u64,
        query: &ClusterQuery,
    ) -> CuResult<i32> {
        let function = self.function(function);
        let config = LaunchConfig {
            grid: query.grid,
            block: query.block,
            shared_mem_bytes: query.shared_mem_bytes,
            stream: null_mut(),
            attrs: std::ptr::null(),
            num_attrs: 0,
        };
        let mut size: c_int = 0;
        // SAFETY: live function, valid out-pointer; `config` lives across
        // the call and is only read.
        check_code("cuOccupancyMaxPotentialClusterSize", unsafe {
            (self.entry.occupancy_max_potential_cluster_size)(&mut size, function, &config)
        })?;
        Ok(size)
    }

    fn occupancy_max_active_clusters(
        &mut self,
        function: u64,
        query: &ClusterQuery,
    ) -> CuResult<i32> {
        let function = self.function(function);
        let attribute = LaunchAttribute::new(launch_attribute::CLUSTER_DIMENSION, &query.cluster);
        // No cluster shape given: the function's own (compile-time) one.
        let with_cluster = query.cluster != [0; 3];
        let config = LaunchConfig {
            grid: query.grid,
            block: query.block,
            shared_mem_bytes: query.shared_mem_bytes,
            stream: null_mut(),
            attrs: if with_cluster {
                &attribute
            } else {
                std::ptr::null()
            },
            num_attrs: u32::from(with_cluster),
        };
        let mut clusters: c_int = 0;
        // SAFETY: live function, valid out-pointer; `config` and the
        // attribute it points to live across the call and are only read.
        check_code("cuOccupancyMaxActiveClusters", unsafe {
            (self.entry.occupancy_max_active_clusters)(&mut clusters, function, &config)
        })?;
        Ok(clusters)
    }

    fn launch_kernel(
        &mut self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamRef,
        params: Vec<u8>,
    ) -> CuResult<()> {
        let function = self.function(function);
        // The per-thread stream is the calling thread's: only the session's
        // own thread may launch there.
        let per_thread = matches!(stream, StreamRef::PerThread);
        let stream = self.stream(stream);
        let launch = Launch {
            function,
            grid,
            block,
            shared_mem_bytes,
            stream,
        };
        match &mut self.launcher {
            Some(launcher) if !per_thread && !self.launch_here => {
                if launcher.launch_here_after_idle() {
                    return launch_with_params(&launch, &params);
                }
                match launcher.queue(launch, params) {
                    Ok(()) => Ok(()),
                    Err((launch, params)) => launch_with_params(&launch, &params),
                }
            }
            Some(launcher) => {
                launcher.fence();
                launch_with_params(&launch, &params)
            }
            None => launch_with_params(&launch, &params),
        }
    }

    fn fence(&mut self) {
        if let Some(launcher) = &mut self.launcher {
            launcher.fence();
        }
    }

    fn launches_queued(&self) -> bool {
        self.launcher
            .as_ref()
            .is_some_and(LaunchThread::may_have_queued)
    }

    fn take_launch_failure(&mut self) -> Option<u32> {
        self.launcher.as_ref().and_then(LaunchThread::take_failure)
    }

    fn launch_on_calling_thread(&mut self, on: bool) {
        self.launch_here = on;
    }

    fn launch_kernel_ex(
        &mut self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamRef,
        params: &[u8],
        options: &LaunchOptions,
    ) -> CuResult<()> {
        let function = self.function(function);
        let stream = self.stream(stream);
        let mut attributes = Vec::with_capacity(2 + options.hints.len());
        if options.cluster != [0; 3] {
            attributes.push(LaunchAttribute::new(
                launch_attribute::CLUSTER_DIMENSION,
                &options.cluster,
            ));
        }
        if options.cooperative {
            attributes.push(LaunchAttribute::new(launch_attribute::COOPERATIVE, &[1]));
        }
        for hint in &options.hints {
            attributes.push(self.launch_attribute(hint)?);
        }
        let config = LaunchConfig {
            grid,
            block,
            shared_mem_bytes,
            stream,
            attrs: attributes.as_ptr(),
            num_attrs: attributes.len() as u32,
        };
        with_param_buffer(params, |extra| {
            // SAFETY: live function and stream; `config`, the attributes it
            // points to and `extra` (which describes `params`, ending with
            // END) live across the call and are only read.
            check_code("cuLaunchKernelEx", unsafe {
                (self.entry.launch_kernel_ex)(&config, function, null_mut(), extra)
            })
        })
    }

    fn stream_create(&mut self, flags: u32, priority: i32) -> CuResult<u64> {
        let mut stream: sys::CUstream = null_mut();
        // SAFETY: valid out-pointer; bad flags are answered with an error.
        check("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(&mut stream, flags, priority)
        })?;
        let handle = object_handle(stream);
        self.streams.insert(handle);
        Ok(handle)
    }

    fn stream_destroy(&mut self, stream: u64) -> CuResult<()> {
        let s = self.stream(StreamRef::Created(stream));
        // SAFETY: a live stream of this context.
        check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(s) })?;
        self.streams.remove(&stream);
        Ok(())
    }

    fn stream_synchronize(&mut self, stream: StreamRef) -> CuResult<()> {
        Self::stream_sync(self.stream(stream))
    }

    fn stream_query(&mut self, stream: StreamRef) -> CuResult<()> {
        let stream = self.stream(stream);
        // Asked unfenced (the session's completion looks): a launch still
        // on the launch thread is work of the stream the driver has not
        // seen yet.
        if self
            .launcher
            .as_ref()
            .is_some_and(|l| l.has_queued_on(stream))
        {
            return Err(CUDA_ERROR_NOT_READY);
        }
        // SAFETY: NULL, per-thread or a live stream.
        check("cuStreamQuery", unsafe { sys::cuStreamQuery(stream) })
    }

    fn stream_wait_event(&mut self, stream: StreamRef, event: u64, flags: u32) -> CuResult<()> {
        let stream = self.stream(stream);
        let event = self.event(event);
        // SAFETY: live stream and event of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream, event, flags)
        })
    }

    fn mem_granularity(&mut self, option: u32) -> CuResult<u64> {
        use sys::CUmemAllocationGranularity_flags_enum as Option_;
        let option = match option {
            0 => Option_::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            1 => Option_::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let prop = self.pinned_device_memory();
        let mut granularity = 0usize;
        // SAFETY: valid out-pointer and property struct.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(&mut granularity, &prop, option)
        })?;
        Ok(granularity as u64)
    }

    fn mem_create(&mut self, size: u64) -> CuResult<u64> {
        let size = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // Any allocation may be exported later (the guest refuses an export
        // its allocation did not ask for, as the driver does).
        let prop = sys::CUmemAllocationProp {
            requestedHandleTypes: POSIX_FD_HANDLE,
            ..self.pinned_device_memory()
        };
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct; the driver checks
        // the size against the granularity.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let key = self.new_handle();
        self.physical.insert(key, handle);
        Ok(key)
    }

    fn mem_release(&mut self, handle: u64) -> CuResult<()> {
        let physical = *self.physical.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: a physical allocation of this context, released once (the
        // driver keeps it while mapped).
        check("cuMemRelease", unsafe { sys::cuMemRelease(physical) })?;
        self.physical.remove(&handle);
        Ok(())
    }

    fn mem_export_fd(&mut self, handle: u64) -> CuResult<OwnedFd> {
        let physical = *self.physical.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut fd: c_int = -1;
        // SAFETY: a live physical allocation of this context; the driver
        // writes one int (a new descriptor) for this handle type.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle((&raw mut fd).cast(), physical, POSIX_FD_HANDLE, 0)
        })?;
        if fd < 0 {
            return Err(CUDA_ERROR_UNKNOWN);
        }
        // SAFETY: the driver created this descriptor for us to own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_import_fd(&mut self, fd: BorrowedFd<'_>) -> CuResult<u64> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; for this handle type the driver takes
        // the descriptor's number as the pointer's value and does not keep
        // the descriptor.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                without_provenance_mut(fd.as_raw_fd() as usize),
                POSIX_FD_HANDLE,
            )
        })?;
        let key = self.new_handle();
        self.physical.insert(key, handle);
        Ok(key)
    }

    fn mem_address_reserve(&mut self, size: u64, alignment: u64, address: u64) -> CuResult<u64> {
        let size = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let alignment = usize::try_from(alignment).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut reserved: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; sizes and the hint are the driver's to
        // check.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut reserved, size, alignment, address, 0)
        })?;
        self.reservations.insert(reserved, size);
        Ok(reserved)
    }

    fn mem_address_free(&mut self, address: u64, size: u64) -> CuResult<()> {
        match self.reservations.get(&address) {
            Some(reserved) if *reserved as u64 == size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: a range this context reserved, freed once.
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(address, size as usize)
        })?;
        self.reservations.remove(&address);
        Ok(())
    }

    fn mem_map(&mut self, address: u64, size: u64, offset: u64, handle: u64) -> CuResult<()> {
        let physical = *self.physical.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let size = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let offset = usize::try_from(offset).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: a live physical allocation of this context; the driver
        // checks that the range lies in a reservation and is unmapped.
        check("cuMemMap", unsafe {
            sys::cuMemMap(address, size, offset, physical, 0)
        })?;
        self.mappings.insert(address, size);
        Ok(())
    }

    fn mem_unmap(&mut self, address: u64, size: u64) -> CuResult<()> {
        match self.mappings.get(&address) {
            Some(mapped) if *mapped as u64 == size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: a range this context mapped, unmapped once.
        check("cuMemUnmap", unsafe {
            sys::cuMemUnmap(address, size as usize)
        })?;
        self.mappings.remove(&address);
        Ok(())
    }

    fn mem_set_access(&mut self, address: u64, size: u64, flags: u32) -> CuResult<()> {
        use sys::CUmemAccess_flags_enum as Access;
        let flags = match flags {
            1 => Access::CU_MEM_ACCESS_FLAGS_PROT_READ,
            3 => Access::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let size = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let desc = sys::CUmemAccessDesc {
            location: self.device_location(),
            flags,
        };
        // SAFETY: one valid access descriptor; the driver checks the range.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(address, size, &desc, 1)
        })
    }

    fn stream_begin_capture(&mut self, stream: StreamRef, mode: u32) -> CuResult<()> {
        let mode = capture_mode(mode)?;
        let stream = self.stream(stream);
        // SAFETY: a live stream of this context and a valid mode.
        check("cuStreamBeginCapture_v2", unsafe {
            sys::cuStreamBeginCapture_v2(stream, mode)
        })
    }

    fn stream_begin_capture_to_graph(
        &mut self,
        stream: StreamRef,
        graph: u64,
        dependencies: &[u64],
        mode: u32,
    ) -> CuResult<()> {
        let mode = capture_mode(mode)?;
        let stream = self.stream(stream);
        let graph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let deps = dependencies
            .iter()
            .map(|d| self.graph_nodes.get(d).map(|(_, node)| *node))
            .collect::<Option<Vec<_>>>()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: a live stream and graph of this context, `deps.len()`
        // live nodes of it, no edge data (plain dependencies), a valid mode.
        check("cuStreamBeginCaptureToGraph", unsafe {
            sys::cuStreamBeginCaptureToGraph(
                stream,
                graph,
                deps.as_ptr(),
                std::ptr::null(),
                deps.len(),
                mode,
            )
        })
    }

    fn stream_memory_op(&mut self, stream: StreamRef, op: MemoryOp) -> CuResult<()> {
        let stream = self.stream(stream);
        let MemoryOp {
            address,
            value,
            flags,
            ..
        } = op;
        // SAFETY: a live stream of this context; the session checked that
        // `address` holds `width` bytes of this process's memory; a wait
        // waits on the GPU, not in this thread.
        check("cuStreamWrite/WaitValue", unsafe {
            match (op.wait, op.width) {
                (false, 8) => sys::cuStreamWriteValue64_v2(stream, address, value, flags),
                (false, _) => sys::cuStreamWriteValue32_v2(stream, address, value as u32, flags),
                (true, 8) => sys::cuStreamWaitValue64_v2(stream, address, value, flags),
                (true, _) => sys::cuStreamWaitValue32_v2(stream, address, value as u32, flags),
            }
        })
    }

    fn stream_end_capture(&mut self, stream: StreamRef) -> CuResult<u64> {
        let stream = self.stream(stream);
        // A graph named while capturing: a failed capture takes it along.
        let capturing = capture_info(stream).ok().map(|(graph, _)| graph);
        let mut graph: sys::CUgraph = null_mut();
        // SAFETY: a live stream, a valid out-pointer.
        let ended = check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(stream, &mut graph)
        });
        if let Err(code) = ended {
            let named = self
                .graphs
                .iter()
                .find(|(handle, g)| Some(**g) == capturing && self.capture_named.contains(handle))
                .map(|(handle, _)| *handle);
            if let Some(handle) = named {
                self.graphs.remove(&handle);
                self.graph_nodes.retain(|_, (of, _)| *of != handle);
                self.capture_named.remove(&handle);
            }
            return Err(code);
        }
        // A capture into an existing graph (or one named while capturing)
        // ends in that graph.
        if let Some((handle, _)) = self.graphs.iter().find(|(_, g)| **g == graph) {
            let handle = *handle;
            self.capture_named.remove(&handle);
            return Ok(handle);
        }
        let handle = self.new_handle();
        self.graphs.insert(handle, graph);
        Ok(handle)
    }

    fn stream_capture_graph(&mut self, stream: StreamRef) -> CuResult<u64> {
        let stream = self.stream(stream);
        let (graph, _) = capture_info(stream)?;
        Ok(self.name_driver_graph(graph))
    }

    fn stream_update_capture_dependencies(
        &mut self,
        stream: StreamRef,
        nodes: &[u64],
        flags: u32,
    ) -> CuResult<()> {
        let stream = self.stream(stream);
        let mut driver_nodes = nodes
            .iter()
            .map(|n| self.graph_nodes.get(n).map(|(_, node)| *node))
            .collect::<Option<Vec<_>>>()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: a live stream; `driver_nodes` holds live nodes of this
        // context and is only read; NULL edge data asks for plain edges;
        // the driver checks `flags`.
        check("cuStreamUpdateCaptureDependencies_v2", unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream,
                driver_nodes.as_mut_ptr(),
                std::ptr::null(),
                driver_nodes.len(),
                flags,
            )
        })
    }

    fn graph_driver_nodes(&mut self, which: DriverNodes) -> CuResult<Vec<(u64, u32)>> {
        let (graph, nodes) = match which {
            DriverNodes::Graph { graph, roots } => {
                let hgraph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                let nodes = list_nodes(|nodes, count| {
                    // SAFETY: a live graph of this context; `nodes` has room
                    // for `*count` nodes (or is NULL to ask the count).
                    unsafe {
                        if roots {
                            sys::cuGraphGetRootNodes(hgraph, nodes, count)
                        } else {
                            sys::cuGraphGetNodes(hgraph, nodes, count)
                        }
                    }
                })?;
                (graph, nodes)
            }
            DriverNodes::CaptureDependencies(stream) => {
                let stream = self.stream(stream);
                let (hgraph, nodes) = capture_info(stream)?;
                (self.name_driver_graph(hgraph), nodes)
            }
            DriverNodes::Edges { node, dependents } => {
                let (graph, hnode) = *self
                    .graph_nodes
                    .get(&node)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let nodes = list_nodes(|nodes, count| {
                    // SAFETY: a live node of this context; `nodes` has room
                    // for `*count` nodes (or is NULL to ask the count); NULL
                    // edge data is not asked for.
                    unsafe {
                        if dependents {
                            sys::cuGraphNodeGetDependentNodes_v2(hnode, nodes, null_mut(), count)
                        } else {
                            sys::cuGraphNodeGetDependencies_v2(hnode, nodes, null_mut(), count)
                        }
                    }
                })?;
                (graph, nodes)
            }
        };
        self.name_driver_nodes(graph, &nodes)
    }

    fn graph_instantiate(&mut self, graph: u64, flags: u64) -> CuResult<u64> {
        let graph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let mut exec: sys::CUgraphExec = null_mut();
        // SAFETY: a live graph of this context, a valid out-pointer; bad
        // flags are answered with an error.
        check("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags)
        })?;
        let handle = self.new_handle();
        self.graph_execs.insert(handle, exec);
        Ok(handle)
    }

    fn graph_launch(&mut self, exec: u64, stream: StreamRef) -> CuResult<()> {
        let exec = *self
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let stream = self.stream(stream);
        // SAFETY: a live executable graph and stream of this context.
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(exec, stream) })
    }

    fn graph_exec_destroy(&mut self, exec: u64) -> CuResult<()> {
        let handle = *self
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: a live executable graph of this context, destroyed once.
        check("cuGraphExecDestroy", unsafe {
            sys::cuGraphExecDestroy(handle)
        })?;
        self.graph_execs.remove(&exec);
        Ok(())
    }

    fn graph_destroy(&mut self, graph: u64) -> CuResult<()> {
        let handle = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: a live graph of this context, destroyed once.
        check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(handle) })?;
        self.graphs.remove(&graph);
        self.graph_nodes.retain(|_, (of, _)| *of != graph);
        self.capture_named.remove(&graph);
        Ok(())
    }

    fn graph_create(&mut self) -> CuResult<u64> {
        let mut graph: sys::CUgraph = null_mut();
        // SAFETY: a valid out-pointer; flags 0.
        check("cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut graph, 0)
        })?;
        let handle = self.new_handle();
        self.graphs.insert(handle, graph);
        Ok(handle)
    }

    fn graph_edges(&mut self, graph: u64, from: &[u64], to: &[u64], add: bool) -> CuResult<()> {
        let hgraph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let nodes = |of: &[u64]| {
            of.iter()
                .map(|d| match self.graph_nodes.get(d) {
                    Some((g, n)) if *g == graph => Ok(*n),
                    _ => Err(CUDA_ERROR_INVALID_VALUE),
                })
                .collect::<CuResult<Vec<sys::CUgraphNode>>>()
        };
        let (from, to) = (nodes(from)?, nodes(to)?);
        if from.len() != to.len() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if add {
            // SAFETY: a live graph of this context and as many live nodes
            // of it at `from` and `to`; no edge data (plain edges).
            check("cuGraphAddDependencies_v2", unsafe {
                sys::cuGraphAddDependencies_v2(
                    hgraph,
                    from.as_ptr(),
                    to.as_ptr(),
                    std::ptr::null(),
                    from.len(),
                )
            })
        } else {
            // SAFETY: as above.
            check("cuGraphRemoveDependencies_v2", unsafe {
                sys::cuGraphRemoveDependencies_v2(
                    hgraph,
                    from.as_ptr(),
                    to.as_ptr(),
                    std::ptr::null(),
                    from.len(),
                )
            })
        }
    }

    fn graph_destroy_node(&mut self, node: u64) -> CuResult<()> {
        let (_, hnode) = *self
            .graph_nodes
            .get(&node)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: a live node of a graph of this context, destroyed once.
        check("cuGraphDestroyNode", unsafe {
            sys::cuGraphDestroyNode(hnode)
        })?;
        self.graph_nodes.remove(&node);
        Ok(())
    }

    fn graph_add_node(
        &mut self,
        graph: u64,
        dependencies: &[u64],
        node: &GraphNode<'_>,
    ) -> CuResult<u64> {
        let hgraph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let deps = dependencies
            .iter()
            .map(|d| match self.graph_nodes.get(d) {
                Some((of, n)) if *of == graph => Ok(*n),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            })
            .collect::<CuResult<Vec<sys::CUgraphNode>>>()?;
        let mut added: sys::CUgraphNode = null_mut();
        let (out, d, n) = (
            &mut added as *mut sys::CUgraphNode,
            deps.as_ptr(),
            deps.len(),
        );
        match *node {
            GraphNode::Empty => {
                // SAFETY: (this arm and those below) a live graph of this
                // context, `n` live nodes of it at `d`, a valid
                // out-pointer; the parameters are read during the call
                // only (the driver copies them).
                check("cuGraphAddEmptyNode", unsafe {
                    sys::cuGraphAddEmptyNode(out, hgraph, d, n)
                })?
            }
            GraphNode::Kernel { function, .. } => {
                let func = self.function(function);
                with_kernel_node_params(node, func, |p| {
                    // SAFETY: as above; `extra` describes the parameter
                    // buffer and ends with END; the function is live in
                    // this context.
                    check("cuGraphAddKernelNode_v2", unsafe {
                        sys::cuGraphAddKernelNode_v2(out, hgraph, d, n, p)
                    })
                })?
            }
            GraphNode::Memset { .. } => {
                let p = memset_node_params(node)?;
                // SAFETY: as above; the driver checks the device range.
                check("cuGraphAddMemsetNode", unsafe {
                    sys::cuGraphAddMemsetNode(out, hgraph, d, n, &p, self.ctx)
                })?
            }
            GraphNode::Copy(copy) => {
                let p = memcpy_node_params(&copy)?;
                // SAFETY: as above; device to device only (page-locked
                // memory by its device address).
                check("cuGraphAddMemcpyNode", unsafe {
                    sys::cuGraphAddMemcpyNode(out, hgraph, d, n, &p, self.ctx)
                })?
            }
            GraphNode::EventRecord(event) => {
                let event = self.event(event);
                // SAFETY: as above; a live event of this context.
                check("cuGraphAddEventRecordNode", unsafe {
                    sys::cuGraphAddEventRecordNode(out, hgraph, d, n, event)
                })?
            }
            GraphNode::EventWait(event) => {
                let event = self.event(event);
                // SAFETY: as above.
                check("cuGraphAddEventWaitNode", unsafe {
                    sys::cuGraphAddEventWaitNode(out, hgraph, d, n, event)
                })?
            }
            GraphNode::Child(child) => {
                let child = *self.graphs.get(&child).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                // SAFETY: as above; a live graph of this context (cloned
                // into the node).
                check("cuGraphAddChildGraphNode", unsafe {
                    sys::cuGraphAddChildGraphNode(out, hgraph, d, n, child)
                })?
            }
            GraphNode::MemFree(dptr) => {
                // SAFETY: as above; the driver checks that `dptr` is a
                // graph allocation not freed in this graph yet.
                check("cuGraphAddMemFreeNode", unsafe {
                    sys::cuGraphAddMemFreeNode(out, hgraph, d, n, dptr)
                })?
            }
            GraphNode::MemOp(ref op) => {
                let mut op = BatchMemOp::new(op);
                let p = batch_mem_op_params(self.ctx, &mut op);
                // SAFETY: as above; one operation laid out as
                // CUstreamBatchMemOpParams, read during the call only; the
                // session checked the word is this process's memory.
                check("cuGraphAddBatchMemOpNode", unsafe {
                    sys::cuGraphAddBatchMemOpNode(out, hgraph, d, n, &p)
                })?
            }
        }
        let handle = self.new_handle();
        self.graph_nodes.insert(handle, (graph, added));
        Ok(handle)
    }

    fn graph_clone(&mut self, graph: u64, nodes: &[u64]) -> CuResult<(u64, Vec<u64>)> {
        let original = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let originals = nodes
            .iter()
            .map(|n| match self.graph_nodes.get(n) {
                Some((of, node)) if *of == graph => Ok(*node),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            })
            .collect::<CuResult<Vec<sys::CUgraphNode>>>()?;
        let mut clone: sys::CUgraph = null_mut();
        // SAFETY: a live graph of this context, a valid out-pointer.
        check("cuGraphClone", unsafe {
            sys::cuGraphClone(&mut clone, original)
        })?;
        let mut found = Vec::with_capacity(originals.len());
        for node in originals {
            let mut copy: sys::CUgraphNode = null_mut();
            // SAFETY: a live node of the original, the clone just made.
            let looked = check("cuGraphNodeFindInClone", unsafe {
                sys::cuGraphNodeFindInClone(&mut copy, node, clone)
            });
            if let Err(code) = looked {
                // SAFETY: the clone is ours, destroyed once.
                let _ = unsafe { sys::cuGraphDestroy(clone) };
                return Err(code);
            }
            found.push(copy);
        }
        let handle = self.new_handle();
        self.graphs.insert(handle, clone);
        let handles = found
            .into_iter()
            .map(|node| {
                let h = self.new_handle();
                self.graph_nodes.insert(h, (handle, node));
                h
            })
            .collect();
        Ok((handle, handles))
    }

    fn graph_node_set_params(&mut self, node: u64, params: &GraphNode<'_>) -> CuResult<()> {
        let (_, hnode) = *self
            .graph_nodes
            .get(&node)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match *params {
            GraphNode::Kernel { function, .. } => {
                let func = self.function(function);
                with_kernel_node_params(params, func, |p| {
                    // SAFETY: a live node of this context (the driver
                    // refuses one of another kind); the parameters are
                    // copied during the call.
                    check("cuGraphKernelNodeSetParams_v2", unsafe {
                        sys::cuGraphKernelNodeSetParams_v2(hnode, p)
                    })
                })
            }
            GraphNode::Memset { .. } => {
                let p = memset_node_params(params)?;
                // SAFETY: as above.
                check("cuGraphMemsetNodeSetParams", unsafe {
                    sys::cuGraphMemsetNodeSetParams(hnode, &p)
                })
            }
            GraphNode::Copy(copy) => {
                let p = memcpy_node_params(&copy)?;
                // SAFETY: as above.
                check("cuGraphMemcpyNodeSetParams", unsafe {
                    sys::cuGraphMemcpyNodeSetParams(hnode, &p)
                })
            }
            GraphNode::EventRecord(event) => {
                let event = self.event(event);
                // SAFETY: a live node and event of this context (the
                // driver refuses a node of another kind).
                check("cuGraphEventRecordNodeSetEvent", unsafe {
                    sys::cuGraphEventRecordNodeSetEvent(hnode, event)
                })
            }
            GraphNode::EventWait(event) => {
                let event = self.event(event);
                // SAFETY: as above.
                check("cuGraphEventWaitNodeSetEvent", unsafe {
                    sys::cuGraphEventWaitNodeSetEvent(hnode, event)
                })
            }
            GraphNode::MemOp(ref op) => {
                let mut op = BatchMemOp::new(op);
                let p = batch_mem_op_params(self.ctx, &mut op);
                // SAFETY: as above; one operation laid out as
                // CUstreamBatchMemOpParams, read during the call only; the
                // session checked the word is this process's memory.
                check("cuGraphBatchMemOpNodeSetParams", unsafe {
                    sys::cuGraphBatchMemOpNodeSetParams(hnode, &p)
                })
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn graph_exec_node_set_params(
        &mut self,
        exec: u64,
        node: u64,
        params: &GraphNode<'_>,
    ) -> CuResult<()> {
        let (hexec, hnode) = self.exec_and_node(exec, node)?;
        match *params {
            GraphNode::Kernel { function, .. } => {
                let func = self.function(function);
                with_kernel_node_params(params, func, |p| {
                    // SAFETY: a live executable graph and node of this
                    // context (the driver refuses a node of another graph
                    // or kind); the parameters are copied during the call.
                    check("cuGraphExecKernelNodeSetParams_v2", unsafe {
                        sys::cuGraphExecKernelNodeSetParams_v2(hexec, hnode, p)
                    })
                })
            }
            GraphNode::Memset { .. } => {
                let p = memset_node_params(params)?;
                // SAFETY: as above.
                check("cuGraphExecMemsetNodeSetParams", unsafe {
                    sys::cuGraphExecMemsetNodeSetParams(hexec, hnode, &p, self.ctx)
                })
            }
            GraphNode::Copy(copy) => {
                let p = memcpy_node_params(&copy)?;
                // SAFETY: as above.
                check("cuGraphExecMemcpyNodeSetParams", unsafe {
                    sys::cuGraphExecMemcpyNodeSetParams(hexec, hnode, &p, self.ctx)
                })
            }
            GraphNode::EventRecord(event) => {
                let event = self.event(event);
                // SAFETY: as above; a live event of this context.
                check("cuGraphExecEventRecordNodeSetEvent", unsafe {
                    sys::cuGraphExecEventRecordNodeSetEvent(hexec, hnode, event)
                })
            }
            GraphNode::EventWait(event) => {
                let event = self.event(event);
                // SAFETY: as above.
                check("cuGraphExecEventWaitNodeSetEvent", unsafe {
                    sys::cuGraphExecEventWaitNodeSetEvent(hexec, hnode, event)
                })
            }
            GraphNode::MemOp(ref op) => {
                let mut op = BatchMemOp::new(op);
                let p = batch_mem_op_params(self.ctx, &mut op);
                // SAFETY: as above.
                check("cuGraphExecBatchMemOpNodeSetParams", unsafe {
                    sys::cuGraphExecBatchMemOpNodeSetParams(hexec, hnode, &p)
                })
            }
            GraphNode::Child(graph) => {
                let child = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // SAFETY: a live executable graph, node and graph of this
                // context; the driver checks the child's topology and
                // copies its parameters during the call.
                check("cuGraphExecChildGraphNodeSetParams", unsafe {
                    sys::cuGraphExecChildGraphNodeSetParams(hexec, hnode, child)
                })
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn stream_set_attribute(&mut self, stream: StreamRef, hint: &LaunchHint) -> CuResult<()> {
        let stream = self.stream(stream);
        let LaunchAttribute { id, value, .. } = self.launch_attribute(hint)?;
        // SAFETY: a live stream of this context (or a default one); the
        // value union is read during the call only.
        check_code("cuStreamSetAttribute", unsafe {
            (self.entry.stream_set_attribute)(stream, id as c_int, &value)
        })
    }

    fn stream_get_attribute(&mut self, stream: StreamRef, id: u32) -> CuResult<[u32; 16]> {
        let stream = self.stream(stream);
        let mut value = [0u32; 16];
        // SAFETY: as above; the union is written during the call.
        check_code("cuStreamGetAttribute", unsafe {
            (self.entry.stream_get_attribute)(stream, id as c_int, &mut value)
        })?;
        Ok(value)
    }

    fn stream_copy_attributes(&mut self, dst: StreamRef, src: StreamRef) -> CuResult<()> {
        let (dst, src) = (self.stream(dst), self.stream(src));
        // SAFETY: two live streams of this context (or default ones).
        check("cuStreamCopyAttributes", unsafe {
            sys::cuStreamCopyAttributes(dst, src)
        })
    }

    fn graph_kernel_node_set_attribute(
        &mut self,
        node: u64,
        attribute: &KernelNodeAttribute,
    ) -> CuResult<()> {
        let hnode = self.graph_node(node)?;
        let (id, value) = attribute.driver_words()?;
        // SAFETY: a live node of this context (the driver refuses one of
        // another kind); the value union is read during the call only.
        check_code("cuGraphKernelNodeSetAttribute", unsafe {
            (self.entry.kernel_node_set_attribute)(hnode, id as c_int, &value)
        })
    }

    fn graph_kernel_node_get_attribute(&mut self, node: u64, id: u32) -> CuResult<[u32; 16]> {
        let hnode = self.graph_node(node)?;
        let mut value = [0u32; 16];
        // SAFETY: as above; the union is written during the call.
        check_code("cuGraphKernelNodeGetAttribute", unsafe {
            (self.entry.kernel_node_get_attribute)(hnode, id as c_int, &mut value)
        })?;
        Ok(value)
    }

    fn graph_kernel_node_copy_attributes(&mut self, dst: u64, src: u64) -> CuResult<()> {
        let (hdst, hsrc) = (self.graph_node(dst)?, self.graph_node(src)?);
        // SAFETY: two live nodes of this context (the driver refuses nodes
        // of another kind).
        check("cuGraphKernelNodeCopyAttributes", unsafe {
            sys::cuGraphKernelNodeCopyAttributes(hdst, hsrc)
        })
    }

    fn graph_exec_node_set_enabled(&mut self, exec: u64, node: u64, enabled: bool) -> CuResult<()> {
        let (hexec, hnode) = self.exec_and_node(exec, node)?;
        // SAFETY: a live executable graph and node of this context (the
        // driver refuses a node of another graph or kind).
        check("cuGraphNodeSetEnabled", unsafe {
            sys::cuGraphNodeSetEnabled(hexec, hnode, u32::from(enabled))
        })
    }

    fn graph_exec_node_enabled(&mut self, exec: u64, node: u64) -> CuResult<bool> {
        let (hexec, hnode) = self.exec_and_node(exec, node)?;
        let mut enabled = 0;
        // SAFETY: as above; `enabled` is written during the call.
        check("cuGraphNodeGetEnabled", unsafe {
            sys::cuGraphNodeGetEnabled(hexec, hnode, &mut enabled)
        })?;
        Ok(enabled != 0)
    }

    fn graph_exec_update(&mut self, exec: u64, graph: u64) -> CuResult<ExecUpdate> {
        let hexec = *self
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let hgraph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let mut info = ExecUpdateResultInfo {
            result: 0,
            error_node: null_mut(),
            error_from_node: null_mut(),
        };
        // SAFETY: a live executable graph and graph of this context, a
        // valid out-pointer of the result info's layout.
        let code = unsafe { (self.entry.graph_exec_update)(hexec, hgraph, &mut info) };
        // A failed update is an answer (with its reason), not an error.
        if code != CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE {
            check_code("cuGraphExecUpdate_v2", code)?;
        }
        // The failing node as this context's handle (none for a node the
        // driver made, of a captured graph).
        let error_node = self
            .graph_nodes
            .iter()
            .find(|(_, (of, n))| {
                *of == graph && !info.error_node.is_null() && *n == info.error_node
            })
            .map(|(handle, _)| *handle);
        Ok(ExecUpdate {
            result: code,
            update_result: u32::try_from(info.result).unwrap_or(u32::MAX),
            error_node,
        })
    }

    fn graph_add_mem_alloc_node(
        &mut self,
        graph: u64,
        dependencies: &[u64],
        size: u64,
    ) -> CuResult<(u64, u64)> {
        let hgraph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let deps = dependencies
            .iter()
            .map(|d| match self.graph_nodes.get(d) {
                Some((of, n)) if *of == graph => Ok(*n),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            })
            .collect::<CuResult<Vec<sys::CUgraphNode>>>()?;
        // SAFETY: plain data, all-zero valid (NULL pointers, no access
        // descriptors, zero sizes and reserved bytes).
        let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        p.poolProps.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        p.poolProps.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = self.device;
        p.bytesize = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let mut added: sys::CUgraphNode = null_mut();
        // SAFETY: a live graph of this context, `deps` live nodes of it, a
        // valid out-pointer and parameters (the driver writes `dptr`).
        check("cuGraphAddMemAllocNode", unsafe {
            sys::cuGraphAddMemAllocNode(&mut added, hgraph, deps.as_ptr(), deps.len(), &mut p)
        })?;
        let handle = self.new_handle();
        self.graph_nodes.insert(handle, (graph, added));
        Ok((handle, p.dptr))
    }

    fn graph_mem_trim(&mut self) -> CuResult<()> {
        // SAFETY: this context's device.
        check("cuDeviceGraphMemTrim", unsafe {
            sys::cuDeviceGraphMemTrim(self.device)
        })
    }

    fn graph_upload(&mut self, exec: u64, stream: StreamRef) -> CuResult<()> {
        let hexec = *self
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let stream = self.stream(stream);
        // SAFETY: a live executable graph and stream of this context.
        check("cuGraphUpload", unsafe {
            sys::cuGraphUpload(hexec, stream)
        })
    }

    fn host_device_pointer(&mut self, host: HostRun) -> CuResult<u64> {
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` lies in memory registered with this process's
        // driver (the session checked it); a valid out-pointer.
        check("cuMemHostGetDevicePointer_v2", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host.ptr.cast(), 0)
        })?;
        Ok(device)
    }

    fn tensor_map_encode(&mut self, spec: &TensorMapSpec) -> CuResult<[u8; TENSOR_MAP_BYTES]> {
        let mut map = TensorMap([0; TENSOR_MAP_BYTES]);
        let address = without_provenance_mut::<c_void>(spec.global_address as usize);
        let code = match spec.kind {
            // SAFETY: a valid out-descriptor; every array holds
            // MAX_TENSOR_RANK (or rank - 1, rank - 2) entries, as many as
            // the driver reads for a rank the decoder bounded; the
            // address is only encoded, never dereferenced here.
            TensorMapKind::Tiled => unsafe {
                (self.entry.tensor_map_encode_tiled)(
                    &mut map,
                    spec.data_type,
                    spec.rank,
                    address,
                    spec.global_dim.as_ptr(),
                    spec.global_strides.as_ptr(),
                    spec.box_dim.as_ptr(),
                    spec.element_strides.as_ptr(),
                    spec.interleave,
                    spec.swizzle,
                    spec.l2_promotion,
                    spec.oob_fill,
                )
            },
            // SAFETY: as above.
            TensorMapKind::Im2col => unsafe {
                (self.entry.tensor_map_encode_im2col)(
                    &mut map,
                    spec.data_type,
                    spec.rank,
                    address,
                    spec.global_dim.as_ptr(),
                    spec.global_strides.as_ptr(),
                    spec.lower_corner.as_ptr(),
                    spec.upper_corner.as_ptr(),
                    spec.channels_per_pixel,
                    spec.pixels_per_column,
                    spec.element_strides.as_ptr(),
                    spec.interleave,
                    spec.swizzle,
                    spec.l2_promotion,
                    spec.oob_fill,
                )
            },
        };
        check_code("cuTensorMapEncode", code)?;
        Ok(map.0)
    }

    fn tensor_map_replace_address(
        &mut self,
        map: &[u8; TENSOR_MAP_BYTES],
        address: u64,
    ) -> CuResult<[u8; TENSOR_MAP_BYTES]> {
        let mut map = TensorMap(*map);
        // SAFETY: a valid, aligned descriptor; the address is only encoded.
        check_code("cuTensorMapReplaceAddress", unsafe {
            (self.entry.tensor_map_replace_address)(
                &mut map,
                without_provenance_mut::<c_void>(address as usize),
            )
        })?;
        Ok(map.0)
    }

    fn graph_node_count(&mut self, graph: u64, roots: bool) -> CuResult<u64> {
        let hgraph = *self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        type Count = unsafe fn(sys::CUgraph, *mut sys::CUgraphNode, *mut usize) -> sys::CUresult;
        let (call, nodes_of): (&str, Count) = if roots {
            ("cuGraphGetRootNodes", sys::cuGraphGetRootNodes)
        } else {
            ("cuGraphGetNodes", sys::cuGraphGetNodes)
        };
        let mut count = 0usize;
        // SAFETY: a live graph of this context; a NULL array asks only for
        // the count, written to a valid out-pointer.
        check(call, unsafe { nodes_of(hgraph, null_mut(), &mut count) })?;
        Ok(count as u64)
    }

    fn ipc_get_mem_handle(&mut self, device_ptr: u64) -> CuResult<IpcHandle> {
        let mut handle = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: valid out-pointer; the driver checks the pointer (the
        // session checked it is memory of this process).
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut handle, device_ptr)
        })?;
        Ok(handle.reserved.map(|b| b as u8))
    }

    fn ipc_open_mem_handle(&mut self, handle: &IpcHandle, flags: u32) -> CuResult<(u64, u64)> {
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the handle is passed by value and the
        // driver checks it and the flags (the session let only handles the
        // tenant's processes exported through).
        check("cuIpcOpenMemHandle_v2", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags)
        })?;
        *self.ipc_mappings.entry(ptr).or_insert(0) += 1;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; `ptr` was just mapped.
        let range = check("cuMemGetAddressRange_v2", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
        });
        match range {
            Ok(()) if base == ptr && size > 0 => Ok((ptr, size as u64)),
            _ => {
                warn!(
                    "cuda: an IPC mapping at {ptr:#x} has no address range ({base:#x}+{size:#x})"
                );
                let _ = self.ipc_close_mem_handle(ptr);
                Err(CUDA_ERROR_UNKNOWN)
            }
        }
    }

    fn ipc_close_mem_handle(&mut self, device_ptr: u64) -> CuResult<()> {
        let Some(opens) = self.ipc_mappings.get_mut(&device_ptr) else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: a pointer cuIpcOpenMemHandle gave this context and that
        // is still open.
        check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(device_ptr)
        })?;
        *opens = opens.saturating_sub(1);
        if *opens == 0 {
            self.ipc_mappings.remove(&device_ptr);
        }
        Ok(())
    }

    fn ipc_get_event_handle(&mut self, event: u64) -> CuResult<IpcHandle> {
        let event = self.event(event);
        let mut handle = sys::CUipcEventHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: a live event of this context, valid out-pointer; the
        // driver refuses an event without the interprocess flags.
        check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(&mut handle, event)
        })?;
        Ok(handle.reserved.map(|b| b as u8))
    }

    fn ipc_open_event_handle(&mut self, handle: &IpcHandle) -> CuResult<u64> {
        let handle = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as c_char),
        };
        let mut event: sys::CUevent = null_mut();
        // SAFETY: valid out-pointer; the handle is passed by value and
        // checked by the driver (and before it by the session).
        check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut event, handle)
        })?;
        let handle = object_handle(event);
        *self.events.entry(handle).or_insert(0) += 1;
        Ok(handle)
    }

    fn event_create(&mut self, flags: u32) -> CuResult<u64> {
        let mut event: sys::CUevent = null_mut();
        // SAFETY: valid out-pointer; bad flags are answered with an error.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut event, flags)
        })?;
        let handle = object_handle(event);
        self.events.insert(handle, 1);
        Ok(handle)
    }

    fn event_destroy(&mut self, event: u64) -> CuResult<()> {
        let e = self.event(event);
        if let Some(holders) = self.events.get_mut(&event).filter(|h| **h > 1) {
            // Another guest handle still names it.
            *holders -= 1;
            return Ok(());
        }
        // SAFETY: a live event of this context.
        check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(e) })?;
        self.events.remove(&event);
        Ok(())
    }

    fn event_record(&mut self, event: u64, stream: StreamRef) -> CuResult<()> {
        let event = self.event(event);
        let stream = self.stream(stream);
        // SAFETY: live event and stream.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event, stream)
        })
    }

    fn event_synchronize(&mut self, event: u64) -> CuResult<()> {
        let event = self.event(event);
        // SAFETY: a live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event)
        })
    }

    fn event_query(&mut self, event: u64) -> CuResult<()> {
        let event = self.event(event);
        // SAFETY: a live event.
        check("cuEventQuery", unsafe { sys::cuEventQuery(event) })
    }

    fn event_elapsed_time(&mut self, start: u64, end: u64) -> CuResult<f32> {
        let (start, end) = (self.event(start), self.event(end));
        let mut ms = 0f32;
        // SAFETY: live events, valid out-pointer.
        check("cuEventElapsedTime_v2", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start, end)
        })?;
        Ok(ms)
    }
}

/// `bytes` and a NUL, in 8-byte-aligned storage.
fn nul_terminated_words(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len() / 8 + 1];
    copy_into_words(&mut words, bytes);
    words
}

/// `bytes` in 8-byte-aligned storage (zero-padded to a whole word).
fn aligned_words(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    copy_into_words(&mut words, bytes);
    words
}

fn copy_into_words(words: &mut [u64], bytes: &[u8]) {
    for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut raw = [0u8; 8];
        raw.get_mut(..chunk.len())
            .unwrap_or_default()
            .copy_from_slice(chunk);
        *word = u64::from_ne_bytes(raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn launch_attributes_fill_the_value_union_from_its_start() {
        assert_eq!(std::mem::size_of::<LaunchAttribute>(), 72);
        let cluster = LaunchAttribute::new(launch_attribute::CLUSTER_DIMENSION, &[2, 1, 1]);
        assert_eq!(cluster.id, launch_attribute::CLUSTER_DIMENSION);
        assert_eq!(cluster.value[..4], [2, 1, 1, 0]);
        assert!(cluster.value[3..].iter().all(|w| *w == 0));
        let window = LaunchHint::AccessPolicyWindow {
            base: 0x1234_5678_9abc_def0,
            bytes: 16,
            hit_ratio: 0.5,
            hit_property: 1,
            miss_property: 2,
        };
        assert_eq!(
            window
                .driver_words(Ok)
                .map(|(id, value)| (id, value[..8].to_vec())),
            Ok((
                launch_attribute::ACCESS_POLICY_WINDOW,
                vec![0x9abc_def0, 0x1234_5678, 16, 0, 0.5f32.to_bits(), 1, 2, 0]
            ))
        );
    }
    use std::process::Command;

    #[test]
    fn new_returns_an_error_without_nvidia_driver() {
        // Without NVIDIA's driver this must be an error, not cudarc's panic.
        // (Cargo puts the target dir on the library path, where guest-lib's
        // own libcuda.so may be: that must be refused too, and so must a
        // library without the driver's entry points.)
        match CudaExecutor::new(0) {
            Ok(executor) => assert_eq!(executor.kind(), "cuda"),
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        ExecutorError::LibraryNotFound { .. }
                            | ExecutorError::GuestLibrary { .. }
                            | ExecutorError::MissingSymbol { .. }
                            | ExecutorError::InitFailed(_)
                            | ExecutorError::NoSuchGpu { .. }
                    ),
                    "{e}"
                );
                eprintln!("as expected here: {e}");
            }
        }
    }

    #[test]
    fn missing_library_is_reported_with_the_names_tried() {
        let names = vec![
            "librgpu-no-such-driver.so".to_owned(),
            "libalso-none.so.1".to_owned(),
        ];
        let err = find_driver_library(&names).unwrap_err();
        assert!(matches!(err, ExecutorError::LibraryNotFound { .. }));
        let message = err.to_string();
        assert!(message.contains("libalso-none.so.1"), "{message}");
        assert!(message.contains("--executor sim"), "{message}");
    }

    /// Builds a shared library from C source; `None` where no C compiler is.
    fn build_library(dir: &Path, name: &str, source: &str) -> Option<String> {
        let c = dir.join(format!("{name}.c"));
        let so = dir.join(format!("{name}.so"));
        std::fs::write(&c, source).ok()?;
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&c)
            .status()
            .ok()?;
        status.success().then(|| so.to_string_lossy().into_owned())
    }

    #[test]
    fn guest_library_is_refused_and_a_plain_one_accepted() {
        let dir = std::env::temp_dir().join(format!("rgpu-executor-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let guest = build_library(
            &dir,
            "guest",
            "int rgpu_guest_lib_marker(void) { return 1; }\n",
        );
        let driver = build_library(
            &dir,
            "driver",
            "int cuInit(unsigned f) { return (int)f; }\n",
        );
        if let (Some(guest), Some(driver)) = (guest, driver) {
            let err = find_driver_library(std::slice::from_ref(&guest)).unwrap_err();
            assert!(matches!(err, ExecutorError::GuestLibrary { .. }), "{err}");
            assert!(err
                .to_string()
                .contains("guest-lib off the daemon's library path"));
            // The first loadable candidate decides, as in cudarc.
            let names = vec!["libnone-here.so".to_owned(), driver.clone(), guest];
            assert_eq!(find_driver_library(&names).unwrap(), driver);
        } else {
            eprintln!("no C compiler: probe of built libraries skipped");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn images_are_copied_into_aligned_nul_terminated_words() {
        let words = nul_terminated_words(b"12345678");
        assert_eq!(words.len(), 2);
        assert_eq!(words[1], 0);
        let words = nul_terminated_words(b".version 9.0");
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[..13], b".version 9.0\0");
        let words = aligned_words(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(words.len(), 2);
        assert_eq!(words[1].to_ne_bytes()[0], 9);
    }
}

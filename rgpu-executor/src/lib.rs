//! rgpu-executor: what actually runs a session's CUDA work (ARCHITECTURE.md §5).
//!
//! - [`cuda`]: NVIDIA's driver through cudarc (dynamic loading), the real thing;
//! - [`sim`]: host memory and a few named reference kernels, a test fixture
//!   for machines without a GPU.
//!
//! [`ptx`] reads kernel layouts and module variables from PTX text (the sim
//! executor's only source of them); [`image`] classifies module images and
//! checks their headers against their length before a driver reads them;
//! [`nvml`] loads the host's NVML for the live values NVML guests ask for;
//! [`cpu_list`] reads the CPU lists that launch threads are pinned to.
//!
//! An [`Executor`] is shared by the whole daemon. A [`ContextExecutor`] is one
//! session's device context; it is created, used and dropped on that
//! session's worker thread only (CUDA contexts are bound per thread), so it
//! need not be `Send`. Dropping it frees every device resource it holds.
//!
//! CUDA results travel as plain `u32` codes (`rgpu_proto::cuda_result`).

pub mod cpu_list;
pub mod cuda;
pub mod image;
mod launch_thread;
pub mod nvml;
#[cfg(feature = "sim")]
mod occupancy;
pub mod ptx;
#[cfg(feature = "sim")]
pub mod sim;

use rgpu_proto::capset::DeviceInfo;
use rgpu_proto::command::{
    launch_attribute, ClusterQuery, IpcHandle, TensorMapSpec, TENSOR_MAP_BYTES,
};
pub use rgpu_proto::command::{Copy3D, PitchedSide};
use rgpu_proto::cuda_result::CUDA_ERROR_NOT_SUPPORTED;
use rgpu_proto::reply::FunctionInfo;
use thiserror::Error;

/// Why an executor could not start. The messages are shown to the person
/// starting the daemon, so they say what to do.
#[derive(Debug, Error)]
pub enum ExecutorError {
    #[error(
        "libcuda.so not found (tried {tried}): the cuda executor needs NVIDIA's driver \
         (use --executor sim on a machine without a GPU)"
    )]
    LibraryNotFound { tried: String },
    #[error(
        "the libcuda.so found on the library path ({name}) is rgpu's own guest library \
         (it exports rgpu_guest_lib_marker); keep guest-lib off the daemon's library path"
    )]
    GuestLibrary { name: String },
    #[error("cuInit failed with CUDA error {0}")]
    InitFailed(u32),
    #[error("GPU ordinal {ordinal} not found ({count} GPUs)")]
    NoSuchGpu { ordinal: u32, count: u32 },
    #[error(
        "the driver library {library} lacks {symbol}: not NVIDIA's driver, or one older \
         than CUDA 13.0 (driver 580)"
    )]
    MissingSymbol {
        library: String,
        symbol: &'static str,
    },
    #[error("{call} failed with CUDA error {code}")]
    DriverCall { call: &'static str, code: u32 },
}

/// A CUDA driver result code (`CUDA_SUCCESS` is never an error value).
pub type CuResult<T> = Result<T, u32>;

/// A contiguous piece of guest memory, mapped in the daemon. The session
/// checked that it lies inside a blob and inside guest memory; it stays
/// mapped while the connection lives.
#[derive(Debug, Clone, Copy)]
pub struct HostRun {
    pub ptr: *mut u8,
    pub len: usize,
}

/// A stream as the executor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRef {
    /// The legacy default stream (NULL / `CU_STREAM_LEGACY`).
    Legacy,
    /// The per-thread default stream (`CU_STREAM_PER_THREAD`).
    PerThread,
    /// A stream this context created ([`ContextExecutor::stream_create`]).
    Created(u64),
}

/// A node of a graph built node by node, as the session checked it: the
/// function, events and child graph are this executor's handles; the
/// memory a memset or copy names lies in the process's own device ranges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GraphNode<'a> {
    Empty,
    Kernel {
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        /// The parameter buffer, laid out as for a launch.
        params: &'a [u8],
    },
    /// `height` rows `pitch` bytes apart, `width` elements each.
    Memset {
        dst: u64,
        value: u32,
        element_size: u32,
        width: u64,
        height: u64,
        pitch: u64,
    },
    /// A copy between device memory (page-locked memory included).
    Copy(Copy3D),
    EventRecord(u64),
    EventWait(u64),
    /// A copy of this graph as it is now.
    Child(u64),
    /// Frees `dptr`, an allocation of a memory-allocation node.
    MemFree(u64),
    /// A stream memory operation as a node.
    MemOp(MemoryOp),
}

/// A stream memory operation: a write of the low `width` (4 or 8, checked
/// by the caller) bytes of `value` at `address`, or with `wait` a wait
/// until the word there meets `flags`' condition against `value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOp {
    pub wait: bool,
    pub address: u64,
    pub value: u64,
    pub width: u32,
    pub flags: u32,
}

/// Which nodes [`ContextExecutor::graph_driver_nodes`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverNodes {
    /// Every node of graph `graph` (`cuGraphGetNodes`), or only those that
    /// depend on none (`cuGraphGetRootNodes`).
    Graph { graph: u64, roots: bool },
    /// What the next node captured on a stream will depend on
    /// (`cuStreamGetCaptureInfo`'s dependencies).
    CaptureDependencies(StreamRef),
    /// The nodes node `node` depends on, or with `dependents` those that
    /// depend on it.
    Edges { node: u64, dependents: bool },
}

/// `CUgraphExecUpdateResult` values the executors answer themselves.
pub mod exec_update {
    pub const SUCCESS: u32 = 0;
    pub const TOPOLOGY_CHANGED: u32 = 2;
    pub const NODE_TYPE_CHANGED: u32 = 3;
}

/// What `cuGraphExecUpdate_v2` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecUpdate {
    /// `CUDA_SUCCESS`, or `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE` with the
    /// executable graph unchanged.
    pub result: u32,
    /// The `CUgraphExecUpdateResult`.
    pub update_result: u32,
    /// The node of the new graph that failed the update, if one did.
    pub error_node: Option<u64>,
}

/// Live state of one device, as NVML reports it ([`Executor::device_status`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceStatus {
    /// Free and total device memory in bytes, every user of the GPU counted.
    pub free: u64,
    pub total: u64,
    /// Percent of time the GPU ran a kernel / accessed memory over the last
    /// sample period; `None` where the host cannot tell.
    pub gpu_utilization: Option<u32>,
    pub memory_utilization: Option<u32>,
    /// The NVIDIA driver's version string ("580.95.05"); empty if unknown.
    pub driver_version: String,
}

/// A `cuLaunchKernelEx` attribute besides the cluster shape and the
/// cooperative flag, as the session checked it: events are this executor's
/// handles, an access window lies in the process's own device memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LaunchHint {
    AccessPolicyWindow {
        base: u64,
        bytes: u64,
        hit_ratio: f32,
        hit_property: u32,
        miss_property: u32,
    },
    SynchronizationPolicy(u32),
    ClusterSchedulingPolicy(u32),
    ProgrammaticStreamSerialization(bool),
    ProgrammaticEvent {
        event: u64,
        flags: u32,
        trigger_at_block_start: bool,
    },
    Priority(i32),
    MemSyncDomainMap {
        default: u8,
        remote: u8,
    },
    MemSyncDomain(u32),
    PreferredClusterDimension([u32; 3]),
    LaunchCompletionEvent {
        event: u64,
        flags: u32,
    },
    PreferredSharedMemoryCarveout(u32),
}

/// A `CUlaunchAttributeValue` union as 16 words, its first `words` given.
pub(crate) fn value_union(words: &[u32]) -> [u32; 16] {
    let mut value = [0u32; 16];
    for (slot, word) in value.iter_mut().zip(words) {
        *slot = *word;
    }
    value
}

/// The two halves of a 64-bit value (a pointer, a size) as the value
/// union holds them.
fn halves(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

impl LaunchHint {
    /// The driver's attribute id and value union (laid out as cuda.h has
    /// it), `event` giving the driver's handle of an executor event.
    pub fn driver_words(&self, event: impl Fn(u64) -> CuResult<u64>) -> CuResult<(u32, [u32; 16])> {
        use launch_attribute as id;
        Ok(match *self {
            LaunchHint::AccessPolicyWindow {
                base,
                bytes,
                hit_ratio,
                hit_property,
                miss_property,
            } => {
                let [base_low, base_high] = halves(base);
                let [bytes_low, bytes_high] = halves(bytes);
                (
                    id::ACCESS_POLICY_WINDOW,
                    value_union(&[
                        base_low,
                        base_high,
                        bytes_low,
                        bytes_high,
                        hit_ratio.to_bits(),
                        hit_property,
                        miss_property,
                    ]),
                )
            }
            LaunchHint::SynchronizationPolicy(policy) => {
                (id::SYNCHRONIZATION_POLICY, value_union(&[policy]))
            }
            LaunchHint::ClusterSchedulingPolicy(policy) => (
                id::CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                value_union(&[policy]),
            ),
            LaunchHint::ProgrammaticStreamSerialization(allowed) => (
                id::PROGRAMMATIC_STREAM_SERIALIZATION,
                value_union(&[u32::from(allowed)]),
            ),
            LaunchHint::ProgrammaticEvent {
                event: held,
                flags,
                trigger_at_block_start,
            } => {
                let [low, high] = halves(event(held)?);
                (
                    id::PROGRAMMATIC_EVENT,
                    value_union(&[low, high, flags, u32::from(trigger_at_block_start)]),
                )
            }
            LaunchHint::Priority(priority) => (id::PRIORITY, value_union(&[priority as u32])),
            LaunchHint::MemSyncDomainMap { default, remote } => (
                id::MEM_SYNC_DOMAIN_MAP,
                value_union(&[u32::from(default) | u32::from(remote) << 8]),
            ),
            LaunchHint::MemSyncDomain(domain) => (id::MEM_SYNC_DOMAIN, value_union(&[domain])),
            LaunchHint::PreferredClusterDimension(dims) => {
                (id::PREFERRED_CLUSTER_DIMENSION, value_union(&dims))
            }
            LaunchHint::LaunchCompletionEvent { event: held, flags } => {
                let [low, high] = halves(event(held)?);
                (
                    id::LAUNCH_COMPLETION_EVENT,
                    value_union(&[low, high, flags]),
                )
            }
            LaunchHint::PreferredSharedMemoryCarveout(carveout) => (
                id::PREFERRED_SHARED_MEMORY_CARVEOUT,
                value_union(&[carveout]),
            ),
        })
    }
}

/// An attribute of a graph's kernel node (`cuGraphKernelNodeSetAttribute`).
#[derive(Debug, Clone, PartialEq)]
pub enum KernelNodeAttribute {
    ClusterDimension([u32; 3]),
    Cooperative(bool),
    /// One that launches take too (no events: a node's launch records
    /// none).
    Hint(LaunchHint),
}

impl KernelNodeAttribute {
    /// The driver's attribute id and value union.
    pub fn driver_words(&self) -> CuResult<(u32, [u32; 16])> {
        match self {
            KernelNodeAttribute::ClusterDimension(dims) => {
                Ok((launch_attribute::CLUSTER_DIMENSION, value_union(dims)))
            }
            KernelNodeAttribute::Cooperative(on) => Ok((
                launch_attribute::COOPERATIVE,
                value_union(&[u32::from(*on)]),
            )),
            KernelNodeAttribute::Hint(hint) => {
                hint.driver_words(|_| Err(rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE))
            }
        }
    }
}

/// What a `cuLaunchKernelEx` asks beyond an ordinary launch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LaunchOptions {
    /// Thread-block cluster shape; all zero: none.
    pub cluster: [u32; 3],
    pub cooperative: bool,
    pub hints: Vec<LaunchHint>,
}

impl LaunchOptions {
    /// Nothing an ordinary launch does not do.
    pub fn is_plain(&self) -> bool {
        self.cluster.iter().all(|d| *d <= 1) && !self.cooperative && self.hints.is_empty()
    }
}

/// The daemon-wide executor.
pub trait Executor: Send + Sync {
    /// "cuda" or "sim".
    fn kind(&self) -> &'static str;
    /// `cuDriverGetVersion` of the host driver.
    fn driver_version(&self) -> i32;
    /// The GPUs offered to guests, in guest ordinal order.
    fn devices(&self) -> Vec<DeviceInfo>;
    /// Creates a device context for guest device `device`. Called on the
    /// session's worker thread, which then owns it.
    fn create_context(&self, device: u32) -> CuResult<Box<dyn ContextExecutor>>;
    /// Makes guest memory DMA-able for every context of this executor
    /// (page-locked, device-mapped, portable) until it is unregistered, so
    /// copies from and to it run at full speed with no staging on the host.
    /// Registrations must not overlap. Best effort: a failure costs speed.
    fn register_host_memory(&self, run: HostRun) -> CuResult<()>;
    fn unregister_host_memory(&self, run: HostRun);
    /// Live state of guest device `device`, without any session's context
    /// (NVML asks before CUDA is used, and must not cost a context).
    fn device_status(&self, _device: u32) -> CuResult<DeviceStatus> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Device memory this process holds as the driver reports it: its
    /// allocations, module globals and every context's own overhead;
    /// `None` where nothing reports it.
    fn process_device_memory(&self) -> Option<u64> {
        None
    }
}

/// One session's device context. Handles (`u64`) are the executor's own; the
/// session maps the guest's handles onto them and never passes one that this
/// context did not return or that names an object already destroyed (a
/// stream, an event, a function of an unloaded module). That table is the
/// only translation of a handle: the cuda executor names streams, events
/// and functions by the driver's objects themselves and does not look them
/// up again (its debug builds assert they are live). The sim executor still
/// answers an unknown handle with an error, for tests of the session.
pub trait ContextExecutor {
    fn synchronize(&mut self) -> CuResult<()>;
    fn get_limit(&mut self, limit: u32) -> CuResult<u64>;
    fn set_limit(&mut self, limit: u32, value: u64) -> CuResult<()>;

    fn mem_alloc(&mut self, size: u64) -> CuResult<u64>;
    fn mem_free(&mut self, device_ptr: u64) -> CuResult<()>;
    /// `(free, total)` bytes.
    fn mem_get_info(&mut self) -> CuResult<(u64, u64)>;

    /// Copies `src` (in order, concatenated) to device memory at `dst`.
    /// `wait_for_source`: return only once the source has been read (it is
    /// reused by the guest as soon as the command is consumed).
    fn memcpy_htod(
        &mut self,
        stream: StreamRef,
        dst: u64,
        src: &[HostRun],
        wait_for_source: bool,
    ) -> CuResult<()>;
    /// Copies device memory at `src` into `dst` (in order). `wait`: return
    /// only once the data is in `dst`.
    fn memcpy_dtoh(
        &mut self,
        stream: StreamRef,
        dst: &[HostRun],
        src: u64,
        wait: bool,
    ) -> CuResult<()>;
    fn memcpy_dtod(&mut self, stream: StreamRef, dst: u64, src: u64, size: u64) -> CuResult<()>;
    /// `count` elements of `element_size` (1, 2 or 4) bytes set to `value`.
    fn memset(
        &mut self,
        stream: StreamRef,
        dst: u64,
        value: u32,
        element_size: u32,
        count: u64,
    ) -> CuResult<()>;

    /// Returns once every launch this context queued on a thread of its
    /// own has reached the driver: what comes next is ordered after them.
    fn fence(&mut self) {}

    /// Whether launches this context queued on a thread of its own may
    /// still be short of the driver, what [`ContextExecutor::fence`] would
    /// wait for: `false` is exact, `true` may be stale (cheap to ask: no
    /// look at the thread's progress).
    fn launches_queued(&self) -> bool {
        false
    }

    /// The first error a queued launch met since the last call.
    fn take_launch_failure(&mut self) -> Option<u32> {
        None
    }

    /// Whether launches are made on the calling thread (during a stream
    /// capture) rather than queued.
    fn launch_on_calling_thread(&mut self, _on: bool) {}

    /// Loads PTX, a cubin or a fatbin.
    fn module_load(&mut self, image: &[u8]) -> CuResult<u64>;
    fn module_unload(&mut self, module: u64) -> CuResult<()>;
    /// The function and its parameter layout.
    fn module_get_function(&mut self, module: u64, name: &str) -> CuResult<(u64, FunctionInfo)>;
    /// `(device pointer, size)` of a global.
    fn module_get_global(&mut self, module: u64, name: &str) -> CuResult<(u64, u64)>;
    fn func_get_attribute(&mut self, function: u64, attribute: i32) -> CuResult<i32>;
    /// `cuFuncSetAttribute` (`attribute` is a `CUfunction_attribute` number).
    fn func_set_attribute(&mut self, _function: u64, _attribute: i32, _value: i32) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
    fn occupancy_max_active_blocks(
        &mut self,
        _function: u64,
        _block_size: i32,
        _dynamic_smem_bytes: u64,
        _flags: u32,
    ) -> CuResult<i32> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuOccupancyAvailableDynamicSMemPerBlock`: bytes.
    fn occupancy_available_dynamic_smem(
        &mut self,
        _function: u64,
        _num_blocks: i32,
        _block_size: i32,
    ) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuOccupancyMaxActiveClusters` of `function` (the executor's handle;
    /// `query.function` is the guest's and is ignored).
    fn occupancy_max_active_clusters(
        &mut self,
        _function: u64,
        _query: &ClusterQuery,
    ) -> CuResult<i32> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuOccupancyMaxPotentialClusterSize` for the launch `query`
    /// describes (its cluster shape is not used).
    fn occupancy_max_potential_cluster_size(
        &mut self,
        _function: u64,
        _query: &ClusterQuery,
    ) -> CuResult<i32> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `params` is the parameter buffer laid out as the function's
    /// [`FunctionInfo`] says.
    #[allow(clippy::too_many_arguments)]
    fn launch_kernel(
        &mut self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamRef,
        params: Vec<u8>,
    ) -> CuResult<()>;

    /// A launch with `options` (clusters, cooperative, attributes).
    /// Executors without them refuse it unless it asks for none.
    #[allow(clippy::too_many_arguments)]
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
        if options.is_plain() {
            return self.launch_kernel(
                function,
                grid,
                block,
                shared_mem_bytes,
                stream,
                params.to_vec(),
            );
        }
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn stream_create(&mut self, flags: u32, priority: i32) -> CuResult<u64>;
    fn stream_destroy(&mut self, stream: u64) -> CuResult<()>;
    fn stream_synchronize(&mut self, stream: StreamRef) -> CuResult<()>;
    /// `Ok(())` when idle, `Err(CUDA_ERROR_NOT_READY)` when busy. May be
    /// asked without a [`ContextExecutor::fence`] first: launches still
    /// queued on the stream make it busy.
    fn stream_query(&mut self, stream: StreamRef) -> CuResult<()>;
    fn stream_wait_event(&mut self, stream: StreamRef, event: u64, flags: u32) -> CuResult<()>;

    fn event_create(&mut self, flags: u32) -> CuResult<u64>;
    fn event_destroy(&mut self, event: u64) -> CuResult<()>;
    fn event_record(&mut self, event: u64, stream: StreamRef) -> CuResult<()>;
    fn event_synchronize(&mut self, event: u64) -> CuResult<()>;
    fn event_query(&mut self, event: u64) -> CuResult<()>;
    /// Milliseconds between two recorded events.
    fn event_elapsed_time(&mut self, start: u64, end: u64) -> CuResult<f32>;

    /// The granularity of pinned device memory (`option`: 0 minimum, 1
    /// recommended).
    fn mem_granularity(&mut self, _option: u32) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `size` bytes of physical device memory: its handle.
    fn mem_create(&mut self, _size: u64) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn mem_release(&mut self, _handle: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Physical allocation `handle` as a POSIX file descriptor another
    /// process may import (`cuMemExportToShareableHandle`).
    fn mem_export_fd(&mut self, _handle: u64) -> CuResult<std::os::fd::OwnedFd> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// What another process exported as `fd`, as a physical allocation of
    /// this context (`cuMemImportFromShareableHandle`): its handle.
    fn mem_import_fd(&mut self, _fd: std::os::fd::BorrowedFd<'_>) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// A range of device addresses, mapped to nothing yet.
    fn mem_address_reserve(&mut self, _size: u64, _alignment: u64, _address: u64) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn mem_address_free(&mut self, _address: u64, _size: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn mem_map(&mut self, _address: u64, _size: u64, _offset: u64, _handle: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn mem_unmap(&mut self, _address: u64, _size: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Access of this context's device to a mapped range (1 read, 3
    /// read-write).
    fn mem_set_access(&mut self, _address: u64, _size: u64, _flags: u32) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    /// `stream` records what it is given into a graph instead of running
    /// it (`mode`: `CUstreamCaptureMode`).
    fn stream_begin_capture(&mut self, _stream: StreamRef, _mode: u32) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `stream` records what it is given into `graph`, after its nodes
    /// `dependencies`, until `stream_end_capture` (which answers `graph`).
    fn stream_begin_capture_to_graph(
        &mut self,
        _stream: StreamRef,
        _graph: u64,
        _dependencies: &[u64],
        _mode: u32,
    ) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamWriteValue32/64` or `cuStreamWaitValue32/64`.
    fn stream_memory_op(&mut self, _stream: StreamRef, _op: MemoryOp) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamSetAttribute`: one of the hints a stream takes (an access
    /// policy window, a synchronization policy, a priority, memory sync
    /// domains).
    fn stream_set_attribute(&mut self, _stream: StreamRef, _hint: &LaunchHint) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamGetAttribute`: the value union of attribute `id`.
    fn stream_get_attribute(&mut self, _stream: StreamRef, _id: u32) -> CuResult<[u32; 16]> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamCopyAttributes`: `dst` takes `src`'s.
    fn stream_copy_attributes(&mut self, _dst: StreamRef, _src: StreamRef) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Ends a capture: the graph recorded.
    fn stream_end_capture(&mut self, _stream: StreamRef) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// The graph `stream`'s capture records into (`cuStreamGetCaptureInfo`'s
    /// graph), as a graph handle; its capture ends in that same graph.
    fn stream_capture_graph(&mut self, _stream: StreamRef) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuStreamUpdateCaptureDependencies`: what the next node captured on
    /// `stream` depends on, `nodes` added (`flags` 0) or set instead (1).
    fn stream_update_capture_dependencies(
        &mut self,
        _stream: StreamRef,
        _nodes: &[u64],
        _flags: u32,
    ) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Nodes as the driver lists them (those the driver made by capture
    /// too), each as a node handle (the same for the same node every time)
    /// and its `CUgraphNodeType`.
    fn graph_driver_nodes(&mut self, _which: DriverNodes) -> CuResult<Vec<(u64, u32)>> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn graph_instantiate(&mut self, _graph: u64, _flags: u64) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn graph_launch(&mut self, _exec: u64, _stream: StreamRef) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn graph_exec_destroy(&mut self, _exec: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn graph_destroy(&mut self, _graph: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// An empty graph.
    fn graph_create(&mut self) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Adds `node` to `graph` after `dependencies` (nodes of `graph`): the
    /// new node's handle.
    fn graph_add_node(
        &mut self,
        _graph: u64,
        _dependencies: &[u64],
        _node: &GraphNode<'_>,
    ) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// A copy of `graph`, and the copies of its nodes `nodes`, in order.
    fn graph_clone(&mut self, _graph: u64, _nodes: &[u64]) -> CuResult<(u64, Vec<u64>)> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Adds (`add`) or removes the edges `from[i]` -> `to[i]` between nodes
    /// of `graph` (as many of each).
    fn graph_edges(&mut self, _graph: u64, _from: &[u64], _to: &[u64], _add: bool) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Node `node` leaves its graph, with its edges.
    fn graph_destroy_node(&mut self, _node: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// New parameters of kernel, memset, memcpy, event or memory-operation
    /// node `node`
    /// (`params` of the same kind; another kind is
    /// `CUDA_ERROR_INVALID_VALUE`). Executable graphs made before keep the
    /// old ones.
    fn graph_node_set_params(&mut self, _node: u64, _params: &GraphNode<'_>) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// As [`Self::graph_node_set_params`], in executable graph `exec` only
    /// (`node` is a node of the graph it was instantiated from); a child
    /// graph node takes the parameters of another graph of its topology.
    fn graph_exec_node_set_params(
        &mut self,
        _exec: u64,
        _node: u64,
        _params: &GraphNode<'_>,
    ) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphNodeSetEnabled`: kernel, memset or memcpy node `node` runs
    /// in `exec`'s launches, or is skipped.
    fn graph_exec_node_set_enabled(
        &mut self,
        _exec: u64,
        _node: u64,
        _enabled: bool,
    ) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphNodeGetEnabled`.
    fn graph_exec_node_enabled(&mut self, _exec: u64, _node: u64) -> CuResult<bool> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphKernelNodeSetAttribute` of kernel node `node`.
    fn graph_kernel_node_set_attribute(
        &mut self,
        _node: u64,
        _attribute: &KernelNodeAttribute,
    ) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphKernelNodeGetAttribute`: the value union of attribute `id`
    /// of kernel node `node`.
    fn graph_kernel_node_get_attribute(&mut self, _node: u64, _id: u32) -> CuResult<[u32; 16]> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphKernelNodeCopyAttributes`: `dst` takes `src`'s attributes.
    fn graph_kernel_node_copy_attributes(&mut self, _dst: u64, _src: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphExecUpdate_v2`: `exec` takes the parameters of `graph`'s
    /// nodes, when `graph` has the topology of the graph `exec` was made
    /// from (nodes paired in the order they were added).
    fn graph_exec_update(&mut self, _exec: u64, _graph: u64) -> CuResult<ExecUpdate> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Adds a memory-allocation node of `size` bytes of this context's
    /// device to `graph` after `dependencies`: the node and the
    /// allocation's device address (fixed for the node's life; the memory
    /// is there from the node's execution to its free).
    fn graph_add_mem_alloc_node(
        &mut self,
        _graph: u64,
        _dependencies: &[u64],
        _size: u64,
    ) -> CuResult<(u64, u64)> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// Gives the device memory that graphs' allocations no longer use back
    /// (`cuDeviceGraphMemTrim`).
    fn graph_mem_trim(&mut self) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuGraphUpload`: prepares `exec` for a launch on `stream`.
    fn graph_upload(&mut self, _exec: u64, _stream: StreamRef) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// The device address of registered host memory at `host`
    /// (`cuMemHostGetDevicePointer`).
    fn host_device_pointer(&mut self, _host: HostRun) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// How many nodes `graph` holds (`cuGraphGetNodes` with no array), or
    /// with `roots` how many of them depend on none (`cuGraphGetRootNodes`).
    fn graph_node_count(&mut self, _graph: u64, _roots: bool) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuTensorMapEncodeTiled` / `cuTensorMapEncodeIm2col`: the
    /// descriptor's bytes.
    fn tensor_map_encode(&mut self, _spec: &TensorMapSpec) -> CuResult<[u8; TENSOR_MAP_BYTES]> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuTensorMapReplaceAddress`: `map` with its global address replaced.
    fn tensor_map_replace_address(
        &mut self,
        _map: &[u8; TENSOR_MAP_BYTES],
        _address: u64,
    ) -> CuResult<[u8; TENSOR_MAP_BYTES]> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    /// `cuIpcGetMemHandle` of device memory of this process (the session
    /// checked that it lies in one of its allocations).
    fn ipc_get_mem_handle(&mut self, _device_ptr: u64) -> CuResult<IpcHandle> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuIpcOpenMemHandle_v2` of a handle another process exported (the
    /// session checked it against the tenant's registry): the pointer and
    /// the size of the mapping. Opening a handle this context has open
    /// already answers the same pointer (the driver counts the opens).
    fn ipc_open_mem_handle(&mut self, _handle: &IpcHandle, _flags: u32) -> CuResult<(u64, u64)> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuIpcCloseMemHandle` of a pointer [`Self::ipc_open_mem_handle`]
    /// answered (once per open).
    fn ipc_close_mem_handle(&mut self, _device_ptr: u64) -> CuResult<()> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuIpcGetEventHandle` of an event of this context (created with
    /// `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`).
    fn ipc_get_event_handle(&mut self, _event: u64) -> CuResult<IpcHandle> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuIpcOpenEventHandle`: an event of this context's tables, destroyed
    /// with [`Self::event_destroy`] as any other.
    fn ipc_open_event_handle(&mut self, _handle: &IpcHandle) -> CuResult<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}

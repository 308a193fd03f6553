//! The `sim` executor: a TEST FIXTURE for machines without a GPU.
//!
//! It lets the transport, the sessions and the guest library be tested end
//! to end where there is no GPU: "device memory" is host memory behind fake
//! device addresses, streams run synchronously in order, and the only
//! kernels it can launch are the reference kernels, recognised by entry name
//! (tests/programs/reference_kernels.ptx describes them): `rgpu_vector_add`,
//! `rgpu_scale`, `rgpu_fill_index`, `rgpu_count_mismatches`, `rgpu_empty`,
//! `rgpu_printf` (its text is written to this process's stdout at the next
//! synchronisation, as NVIDIA's driver prints device printf output).
//! It takes PTX text only. Nothing is "done" until it runs on a GPU with the
//! `cuda` executor.
//!
//! Like NVIDIA's driver with unified addressing, a copy or memset reaches
//! host memory registered for DMA through its host address taken as a
//! device pointer, and every allocation of every context of the executor:
//! the fixture is as permissive as the driver, so tests show what the
//! sessions' own pointer checks keep guests from. CUDA IPC handles open
//! between contexts of one executor only (one worker process); tests of
//! the sessions observe the contexts through [`SimObserver`].

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::{debug, trace, warn};
use rgpu_proto::capset::{DeviceInfo, ATTRIBUTE_SLOTS, ATTRIBUTE_UNSUPPORTED};
use rgpu_proto::command::{
    ClusterQuery, IpcHandle, TensorMapKind, TensorMapSpec, IPC_HANDLE_BYTES, TENSOR_MAP_BYTES,
};
use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::FunctionInfo;

use crate::image::{classify, ImageKind};
use crate::occupancy::{self, KernelResources};
use crate::{
    exec_update, ptx, ContextExecutor, Copy3D, CuResult, DeviceStatus, DriverNodes, ExecUpdate,
    Executor, GraphNode, HostRun, KernelNodeAttribute, LaunchHint, LaunchOptions, MemoryOp,
    PitchedSide, StreamRef,
};

/// What `rgpu_spin` with a duration past the clock's range waits: forever,
/// for any test.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

pub const SIM_DEVICE_NAME: &str = "rgpu-sim (test fixture, no GPU)";
pub const SIM_TOTAL_MEM: u64 = 16 << 30;
pub const SIM_DRIVER_VERSION: i32 = 13000;
/// Deterministic, so tests and guests can recognise the fixture.
pub const SIM_UUID: [u8; 16] = *b"rgpu-sim-fixture";
/// What the fixture's NVML reports: the driver the GPU suite ran on, and
/// fixed utilisation percentages.
pub const SIM_DRIVER_VERSION_STRING: &str = "580.159";
pub const SIM_GPU_UTILIZATION: u32 = 37;
pub const SIM_MEMORY_UTILIZATION: u32 = 12;
/// Where the fake device addresses start (looks like a real GPU VA).
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// `cuMemAlloc` alignment.
const ALLOC_ALIGN: u64 = 256;
const H200_ATTRIBUTES: &str = include_str!("../data/h200-attributes.tsv");

/// `CUDA_ERROR_UNSUPPORTED_LIMIT` (cuda.h), not named by rgpu-proto.
const CUDA_ERROR_UNSUPPORTED_LIMIT: u32 = 215;

/// For tests of the daemon's process isolation only: with
/// `RGPU_SIM_FAULT_POISONS_PROCESS=1`, launching a kernel named `rgpu_fault`
/// makes every later context creation, registration, allocation, copy,
/// launch and synchronisation of this process fail with
/// CUDA_ERROR_ILLEGAL_ADDRESS, as NVIDIA's driver does after a kernel fault.
static POISONED: AtomicBool = AtomicBool::new(false);

fn check_poisoned() -> CuResult<()> {
    if POISONED.load(Ordering::SeqCst) {
        return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    Ok(())
}
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
const LIMIT_PRINTF_FIFO_SIZE: u32 = 1;
/// What the reference kernels report (`CU_FUNC_ATTRIBUTE_*` numbers).
const FUNC_ATTRIBUTE_NUM_REGS: i32 = 4;
const FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;
const SIM_KERNEL_REGISTERS: i32 = 16;
const SIM_KERNEL_MAX_DYNAMIC_SHARED: i32 = 49152;
/// `CU_OCCUPANCY_DEFAULT | CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`.
const OCCUPANCY_FLAGS: u32 = 0x1;
const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_INTERPROCESS`: an event whose IPC handle may be taken (with
/// timing disabled).
const CU_EVENT_INTERPROCESS: u32 = 0x4;
/// How the fixture's IPC handles start: a memory handle's, an event's.
pub const SIM_IPC_MEM_MAGIC: &[u8; 16] = b"rgpu-sim-ipc-mem";
/// How long a wait of the sim's `stream_memory_op` polls before giving up.
const SIM_WAIT_VALUE_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);
/// The first word of the sim's tensor maps ("rgputmap").
const SIM_TENSOR_MAP_MAGIC: u64 = u64::from_le_bytes(*b"rgputmap");
pub const SIM_IPC_EVENT_MAGIC: &[u8; 16] = b"rgpu-sim-ipc-evt";

/// An IPC handle of the fixture: `magic`, this process's id, the
/// executor's id, `object` (a device pointer or an event handle) and 32
/// unpredictable bytes, so that every handle is distinct and none can be
/// guessed. The fixture opens only those of its own executor (each
/// worker's device memory is private host memory of its own process); the
/// session records and checks them as real ones.
fn sim_ipc_handle(magic: &[u8; 16], executor_id: u32, object: u64) -> IpcHandle {
    use std::hash::{BuildHasher, Hasher};
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let mut handle = [0u8; IPC_HANDLE_BYTES];
    handle[..16].copy_from_slice(magic);
    handle[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    handle[20..24].copy_from_slice(&executor_id.to_le_bytes());
    handle[24..32].copy_from_slice(&object.to_le_bytes());
    for chunk in handle[32..].chunks_mut(8) {
        // RandomState is seeded from the OS's randomness per instance.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(DRAWN.fetch_add(1, Ordering::Relaxed));
        hasher.write_u64(object);
        chunk.copy_from_slice(&hasher.finish().to_le_bytes());
    }
    handle
}

/// The object of a `magic` handle of executor `executor_id` of this
/// process; `None` for any other handle.
fn sim_ipc_object(magic: &[u8; 16], executor_id: u32, handle: &IpcHandle) -> Option<u64> {
    let mut ours = [0u8; 24];
    ours[..16].copy_from_slice(magic);
    ours[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    ours[20..24].copy_from_slice(&executor_id.to_le_bytes());
    let object = handle.get(24..32)?.try_into().ok()?;
    (handle.get(..24)? == ours.as_slice()).then(|| u64::from_le_bytes(object))
}
/// Launch geometry limits of the H200 (device attributes 2-7).
const MAX_THREADS_PER_BLOCK: u64 = 1024;
const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// `(limit, default, settable)`, defaults as an H200 reports them.
const LIMITS: [(u32, u64, bool); 10] = [
    (0, 1024, true),    // STACK_SIZE
    (1, 1 << 20, true), // PRINTF_FIFO_SIZE
    (2, 8 << 20, true), // MALLOC_HEAP_SIZE
    (3, 2, true),       // DEV_RUNTIME_SYNC_DEPTH
    (4, 2048, true),    // DEV_RUNTIME_PENDING_LAUNCH_COUNT
    (5, 64, true),      // MAX_L2_FETCH_GRANULARITY
    (6, 0, true),       // PERSISTING_L2_CACHE_SIZE
    (7, 0, false),      // SHMEM_SIZE (CIG contexts only)
    (8, 0, false),      // CIG_ENABLED
    (9, 1, true),       // CIG_SHMEM_FALLBACK_ENABLED
];

/// What every context of one executor reaches besides its own
/// allocations, shared by them all: host memory registered for DMA, and the
/// device memory of every context (one address space, as with the driver's
/// unified addressing). Every access to a block's bytes holds it locked, so
/// two contexts (two worker threads) never touch the same bytes at once.
#[derive(Default)]
struct Reachable {
    /// Registered host memory: host address -> length.
    host: BTreeMap<usize, usize>,
    /// Device memory: device address -> (host address, size). A context
    /// removes its entries, with this locked, before it frees their blocks.
    device: BTreeMap<u64, (usize, u64)>,
}

type SharedReachable = Arc<Mutex<Reachable>>;

fn lock_reachable(reachable: &Mutex<Reachable>) -> MutexGuard<'_, Reachable> {
    reachable.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reachable {
    /// The host address of `[ptr, ptr + len)` if one registered run holds it.
    fn host_range(&self, ptr: u64, len: u64) -> Option<*mut u8> {
        let start = usize::try_from(ptr).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        let (base, run_len) = self.host.range(..=start).next_back()?;
        (end <= base.checked_add(*run_len)?).then_some(start as *mut u8)
    }

    /// The allocation holding device address `ptr`: `(base, (host address,
    /// size))`.
    fn allocation(&self, ptr: u64) -> Option<(u64, (usize, u64))> {
        let (base, (host, size)) = self.device.range(..=ptr).next_back()?;
        (ptr - base < *size).then_some((*base, (*host, *size)))
    }

    /// The host address of `[ptr, ptr + len)` if one allocation of any
    /// context holds it.
    fn device_range(&self, ptr: u64, len: u64) -> Option<*mut u8> {
        let (base, (host, size)) = self.allocation(ptr)?;
        let offset = ptr - base;
        (offset.checked_add(len)? <= size).then_some(host.checked_add(offset as usize)? as *mut u8)
    }
}

/// What tests of the sessions observe of an executor from outside its
/// worker threads ([`SimExecutor::observer`]), and the context creation
/// failure they make it answer.
#[derive(Debug, Clone, Default)]
pub struct SimObserver(Arc<Observed>);

#[derive(Debug, Default)]
struct Observed {
    contexts_created: AtomicUsize,
    live_contexts: AtomicUsize,
    launches: AtomicUsize,
    synchronizations: AtomicUsize,
    /// How many held-back launches each fence that ran some ran.
    deferred_batches: std::sync::Mutex<Vec<usize>>,
    ipc_opens: AtomicUsize,
    /// The CUDA error the next context creations fail with; 0: none.
    fail_create: AtomicU32,
}

impl SimObserver {
    /// Contexts ever created.
    pub fn contexts_created(&self) -> usize {
        self.0.contexts_created.load(Ordering::SeqCst)
    }

    /// Contexts not dropped yet.
    pub fn live_contexts(&self) -> usize {
        self.0.live_contexts.load(Ordering::SeqCst)
    }

    /// Kernels run (graph replays included).
    pub fn launches(&self) -> usize {
        self.0.launches.load(Ordering::SeqCst)
    }

    /// `cuCtxSynchronize` calls the sessions made.
    pub fn synchronizations(&self) -> usize {
        self.0.synchronizations.load(Ordering::SeqCst)
    }

    /// How many launches held back (`deferring_launches`) each fence that
    /// found some ran, in order.
    pub fn deferred_batches(&self) -> Vec<usize> {
        self.0
            .deferred_batches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// IPC opens of memory not closed yet (a context's end closes its own).
    pub fn ipc_opens(&self) -> usize {
        self.0.ipc_opens.load(Ordering::SeqCst)
    }

    /// Makes the next context creations fail with `code` (`None`: succeed
    /// again).
    pub fn fail_context_creation(&self, code: Option<u32>) {
        self.0
            .fail_create
            .store(code.unwrap_or(0), Ordering::SeqCst);
    }
}

/// Device memory each context takes for itself (a real driver's is about
/// 500 MiB on the H200): `RGPU_SIM_CONTEXT_OVERHEAD` bytes, 0 by default,
/// so that tests of the memory limit can see it counted.
fn context_overhead() -> u64 {
    std::env::var("RGPU_SIM_CONTEXT_OVERHEAD")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The daemon-wide simulator.
pub struct SimExecutor {
    device: DeviceInfo,
    /// Bytes allocated by all contexts: one device's memory is shared.
    used: Arc<AtomicU64>,
    /// The next device address, shared by all contexts: as with the
    /// driver's unified addressing, no two allocations of a process share
    /// an address, whichever contexts made them.
    next_address: Arc<AtomicU64>,
    reachable: SharedReachable,
    observer: SimObserver,
    /// This executor among the process's, in its IPC handles.
    id: u32,
    /// Contexts hold launches back until a fence (`RGPU_SIM_DEFER_LAUNCHES`
    /// or [`SimExecutor::deferring_launches`]).
    defer_launches: bool,
}

impl SimExecutor {
    pub fn new() -> SimExecutor {
        warn!(
            "sim executor: a TEST FIXTURE without a GPU (host memory, reference kernels only); \
             use --executor cuda for real work"
        );
        SimExecutor {
            device: DeviceInfo {
                name: SIM_DEVICE_NAME.to_owned(),
                uuid: SIM_UUID,
                total_mem: SIM_TOTAL_MEM,
                host_ordinal: 0,
                attributes: parse_attributes(H200_ATTRIBUTES),
            },
            used: Arc::new(AtomicU64::new(0)),
            next_address: Arc::new(AtomicU64::new(BASE_ADDRESS)),
            reachable: SharedReachable::default(),
            observer: SimObserver::default(),
            id: NEXT_EXECUTOR_ID.fetch_add(1, Ordering::Relaxed),
            defer_launches: std::env::var_os("RGPU_SIM_DEFER_LAUNCHES").is_some_and(|v| v == "1"),
        }
    }

    /// Contexts hold launches back until a fence, as the cuda executor's
    /// launch thread may (`RGPU_SIM_DEFER_LAUNCHES=1` for a whole process).
    pub fn deferring_launches(mut self) -> SimExecutor {
        self.defer_launches = true;
        self
    }

    /// What tests observe of this executor's contexts.
    pub fn observer(&self) -> SimObserver {
        self.observer.clone()
    }
}

static NEXT_EXECUTOR_ID: AtomicU32 = AtomicU32::new(0);

impl Default for SimExecutor {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads "attr<TAB>value" / "attr<TAB>error N" lines into attribute slots;
/// anything unreadable stays [`ATTRIBUTE_UNSUPPORTED`].
fn parse_attributes(tsv: &str) -> Vec<i32> {
    let mut attributes = vec![ATTRIBUTE_UNSUPPORTED; ATTRIBUTE_SLOTS];
    for line in tsv.lines() {
        let mut fields = line.split('\t');
        let (Some(attr), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        let (Ok(attr), Ok(value)) = (attr.trim().parse::<usize>(), value.trim().parse::<i32>())
        else {
            continue;
        };
        if let Some(slot) = attributes.get_mut(attr) {
            *slot = value;
        }
    }
    attributes
}

impl Executor for SimExecutor {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn driver_version(&self) -> i32 {
        SIM_DRIVER_VERSION
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        vec![self.device.clone()]
    }

    fn create_context(&self, device: u32) -> CuResult<Box<dyn ContextExecutor>> {
        check_poisoned()?;
        if device != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let observed = &self.observer.0;
        match observed.fail_create.load(Ordering::SeqCst) {
            0 => {}
            code => return Err(code),
        }
        let context = SimContext::new(
            self.used.clone(),
            self.next_address.clone(),
            self.reachable.clone(),
            self.observer.clone(),
            self.id,
            self.defer_launches,
        );
        observed.contexts_created.fetch_add(1, Ordering::SeqCst);
        observed.live_contexts.fetch_add(1, Ordering::SeqCst);
        debug!(
            "sim: context created ({} bytes of overhead)",
            context.charged
        );
        Ok(Box::new(context))
    }

    /// Copies are CPU copies here, so registration only makes the memory
    /// reachable through its host address, as the driver does.
    fn register_host_memory(&self, run: HostRun) -> CuResult<()> {
        check_poisoned()?;
        lock_reachable(&self.reachable)
            .host
            .insert(run.ptr as usize, run.len);
        Ok(())
    }

    /// Waits for copies that reach the run (they hold the registry).
    fn unregister_host_memory(&self, run: HostRun) {
        let registered = &mut lock_reachable(&self.reachable).host;
        if registered.get(&(run.ptr as usize)) == Some(&run.len) {
            registered.remove(&(run.ptr as usize));
        }
    }

    /// Everything this executor's contexts charged: allocations, module
    /// variables and each context's overhead.
    fn process_device_memory(&self) -> Option<u64> {
        Some(self.used.load(Ordering::SeqCst))
    }

    fn device_status(&self, device: u32) -> CuResult<DeviceStatus> {
        if device != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let used = self.used.load(Ordering::SeqCst).min(SIM_TOTAL_MEM);
        Ok(DeviceStatus {
            free: SIM_TOTAL_MEM - used,
            total: SIM_TOTAL_MEM,
            gpu_utilization: Some(SIM_GPU_UTILIZATION),
            memory_utilization: Some(SIM_MEMORY_UTILIZATION),
            driver_version: SIM_DRIVER_VERSION_STRING.to_owned(),
        })
    }
}

/// Zeroed host memory standing for one device allocation. Allocated through
/// `alloc_zeroed` (calloc), so untouched pages cost nothing, and fallibly,
/// so an impossible size is an out-of-memory error rather than an abort.
struct HostBlock {
    ptr: NonNull<u8>,
    backing: Backing,
}

enum Backing {
    Heap(Layout),
    /// A memfd's pages, mapped shared: what a physical allocation is, so
    /// that another process may import it (`mem_export_fd`).
    Shared {
        len: usize,
        fd: OwnedFd,
    },
}

impl HostBlock {
    fn zeroed(len: u64) -> Option<Self> {
        let layout = Layout::from_size_align(usize::try_from(len).ok()?.max(1), 16).ok()?;
        // SAFETY: the layout's size is non-zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(Self {
            ptr: NonNull::new(ptr)?,
            backing: Backing::Heap(layout),
        })
    }

    /// `len` zeroed bytes of a new memfd.
    fn shared(len: u64) -> Option<Self> {
        // SAFETY: a NUL-terminated name and known flags.
        let raw = unsafe { libc::memfd_create(c"rgpu-sim-physical".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return None;
        }
        // SAFETY: just created, ours to own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a descriptor of ours; a new memfd grows with zeros.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), i64::try_from(len).ok()?) } != 0 {
            return None;
        }
        Self::map_shared(fd, len)
    }

    /// Maps `len` bytes of memfd `fd` (another process's export).
    fn map_shared(fd: OwnedFd, len: u64) -> Option<Self> {
        let len = usize::try_from(len).ok().filter(|l| *l > 0)?;
        // SAFETY: a fresh shared mapping of a descriptor we own, placed by
        // the kernel.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            ptr: NonNull::new(ptr.cast())?,
            backing: Backing::Shared { len, fd },
        })
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: allocated in `zeroed` with this very layout.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) },
            // SAFETY: mapped in `map_shared` with this length; nothing
            // refers to it once the block goes.
            Backing::Shared { len, .. } => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), *len);
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// `cuMemAlloc`: the guest may free it.
    User,
    /// A module's variable, freed with the module.
    Module(u64),
    /// A mapping of a physical allocation (`mem_map`), removed by
    /// `mem_unmap`.
    Mapping,
    /// A graph's memory-allocation node: there from the node's creation
    /// until no graph or executable graph holds the node.
    Graph,
}

struct Allocation {
    /// Shared by every mapping of one physical allocation (a context is
    /// one thread's).
    block: Rc<HostBlock>,
    /// Where this allocation starts in `block`.
    offset: u64,
    /// What was asked for (the block may be larger for empty variables).
    size: u64,
    /// Bytes counted against the device's memory.
    charged: u64,
    owner: Owner,
}

/// The reference kernels, by entry name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReferenceKernel {
    VectorAdd,
    Scale,
    FillIndex,
    CountMismatches,
    Empty,
    Printf,
    /// Keeps the context busy for its parameter's nanoseconds: the launch
    /// returns at once, and every synchronisation waits it out.
    Spin,
}

impl ReferenceKernel {
    fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "rgpu_vector_add" => Self::VectorAdd,
            "rgpu_scale" => Self::Scale,
            "rgpu_fill_index" => Self::FillIndex,
            "rgpu_count_mismatches" => Self::CountMismatches,
            "rgpu_empty" => Self::Empty,
            "rgpu_printf" => Self::Printf,
            "rgpu_spin" => Self::Spin,
            _ => return None,
        })
    }

    /// Parameter sizes the PTX must declare.
    fn param_sizes(self) -> &'static [u32] {
        match self {
            Self::VectorAdd => &[8, 8, 8, 4],
            Self::Scale => &[8, 4, 4],
            Self::FillIndex => &[8, 4, 4],
            Self::CountMismatches => &[8, 4, 4, 8],
            Self::Empty => &[],
            Self::Printf => &[4],
            Self::Spin => &[8],
        }
    }
}

struct SimModule {
    /// Entry name to layout.
    entries: HashMap<String, FunctionInfo>,
    /// Variable name to `(device address, size)`.
    variables: HashMap<String, (u64, u64)>,
    /// Function handles already handed out, so a name maps to one handle.
    functions: HashMap<String, u64>,
}

struct SimFunction {
    module: u64,
    name: String,
    info: FunctionInfo,
    kernel: Option<ReferenceKernel>,
    /// Values set with `func_set_attribute`.
    attributes: HashMap<i32, i32>,
}

struct SimEvent {
    flags: u32,
    recorded: Option<Instant>,
    /// When the work queued before the record is done (spinning work).
    done_at: Option<Instant>,
}

/// The granularity of the sim's virtual-memory allocations (the H200's).
const VMM_GRANULARITY: u64 = 2 << 20;

/// One session's simulated context.
pub struct SimContext {
    used: Arc<AtomicU64>,
    /// Bytes this context charged to `used`, returned on drop.
    charged: u64,
    allocations: BTreeMap<u64, Allocation>,
    next_address: Arc<AtomicU64>,
    reachable: SharedReachable,
    observer: SimObserver,
    /// The executor's id, in IPC handles.
    executor_id: u32,
    /// Memory of other contexts opened through IPC, with how often.
    ipc_opens: HashMap<u64, u32>,
    /// One counter for every kind of handle, so a handle of one kind is
    /// never valid as another.
    next_handle: u64,
    modules: HashMap<u64, SimModule>,
    functions: HashMap<u64, SimFunction>,
    streams: HashSet<u64>,
    events: HashMap<u64, SimEvent>,
    limits: HashMap<u32, u64>,
    /// Kernel names already reported as unimplemented.
    warned: HashSet<String>,
    /// Device printf output not yet printed: the driver prints it at the
    /// next synchronisation.
    printf_buffer: Vec<u8>,
    /// Work launched by `rgpu_spin` runs until then.
    busy_until: Option<Instant>,
    /// Virtual memory: physical allocations by handle (block, size,
    /// charged), and reserved ranges (address -> size).
    physical: HashMap<u64, (Rc<HostBlock>, u64)>,
    /// Physical allocations imported from another process: its device
    /// memory, not this one's.
    imported: HashSet<u64>,
    reservations: BTreeMap<u64, u64>,
    /// Streams being captured (by [`stream_key`]): each records into a
    /// graph as it goes, as the driver does.
    capturing: HashMap<u64, SimCapture>,
    /// Captures a query invalidated (by [`stream_key`]).
    invalidated_captures: HashSet<u64>,
    /// Graphs: their nodes in the order they were added (a node depends
    /// only on nodes added before it, so this order is a valid one to run
    /// them in).
    graphs: HashMap<u64, Vec<SimNode>>,
    /// Executable graphs: a copy of their graph's nodes when instantiated
    /// (the handles stay those of that graph's nodes).
    graph_execs: HashMap<u64, Vec<SimNode>>,
    /// Executable graphs: the memory-allocation nodes whose memory each
    /// holds (its graph's, and those of graphs it was updated from).
    exec_allocations: HashMap<u64, Vec<SimNode>>,
    /// Graphs with memory nodes -> the one executable graph that has their
    /// allocations (instantiated or updated from them), as the driver
    /// allows one at a time.
    allocations_owner: HashMap<u64, u64>,
    /// Kernel nodes' attributes as set: kept, not acted on.
    node_attributes: AttributeStore,
    /// Streams' attributes as set, likewise (by `stream_key`).
    stream_attributes: AttributeStore,
    /// Memory-allocation nodes' memory: how many graphs and executable
    /// graphs hold each node (by address).
    graph_allocations: HashMap<u64, u32>,
    /// `RGPU_SIM_DEFER_LAUNCHES=1`: launches wait here until the session
    /// fences, as the cuda executor's launch thread may make them late,
    /// so that a session that forgets to fence reads stale results.
    deferred: Option<Vec<DeferredLaunch>>,
    /// The first error a deferred launch met, until the session asks.
    deferred_failure: Option<u32>,
    /// Launches run at once for now (a capture).
    launch_here: bool,
}

/// A launch `RGPU_SIM_DEFER_LAUNCHES` holds back.
struct DeferredLaunch {
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: StreamRef,
    params: Vec<u8>,
}

/// A node of a graph: its handle, the handles of the nodes it depends on
/// and what it does.
#[derive(Debug, Clone)]
struct SimNode {
    handle: u64,
    dependencies: Vec<u64>,
    op: GraphOp,
    /// Skipped in an executable graph's launches (`cuGraphNodeSetEnabled`).
    disabled: bool,
}

/// A capture going on: the graph it records into and what its next node
/// will depend on.
struct SimCapture {
    graph: u64,
    dependencies: Vec<u64>,
    /// Into a graph that existed before (`cuStreamBeginCaptureToGraph`),
    /// which a failed capture leaves.
    into_existing: bool,
}

/// `CUgraphNodeType` of a node doing `op`.
fn node_type(op: &GraphOp) -> u32 {
    match op {
        GraphOp::Launch { .. } => 0,
        GraphOp::Copy(_) => 1,
        GraphOp::Memset { .. } => 2,
        GraphOp::Child(_) => 4,
        GraphOp::Empty => 5,
        GraphOp::EventWait(_) => 6,
        GraphOp::EventRecord(_) => 7,
        GraphOp::MemAlloc(_) => 10,
        GraphOp::MemFree(_) => 11,
        GraphOp::MemOp(_) => 12,
    }
}

/// The nodes' operations in an order that runs every node after its
/// dependencies (the order they were added, where edges allow: edges added
/// after the fact may point backwards).
fn in_dependency_order(nodes: &[SimNode]) -> Vec<GraphOp> {
    let held: HashSet<u64> = nodes.iter().map(|n| n.handle).collect();
    let mut done: HashSet<u64> = HashSet::new();
    let mut ops = Vec::with_capacity(nodes.len());
    // A disabled node is as an empty one: its dependents still wait.
    let op = |node: &SimNode| {
        if node.disabled {
            GraphOp::Empty
        } else {
            node.op.clone()
        }
    };
    while ops.len() < nodes.len() {
        let before = ops.len();
        for node in nodes {
            if !done.contains(&node.handle)
                && node
                    .dependencies
                    .iter()
                    .all(|d| done.contains(d) || !held.contains(d))
            {
                done.insert(node.handle);
                ops.push(op(node));
            }
        }
        if ops.len() == before {
            // A cycle (refused when edges are added): what is left, as added.
            ops.extend(nodes.iter().filter(|n| !done.contains(&n.handle)).map(op));
        }
    }
    ops
}

/// Whether `node` depends on `on`, directly or through others, in `nodes`.
fn depends_on(nodes: &[SimNode], node: u64, on: u64) -> bool {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut todo = vec![node];
    while let Some(n) = todo.pop() {
        if n == on {
            return true;
        }
        if seen.insert(n) {
            if let Some(held) = nodes.iter().find(|x| x.handle == n) {
                todo.extend(&held.dependencies);
            }
        }
    }
    false
}

/// Where each node's dependencies sit among `nodes` (the shape an
/// executable graph update compares); `None` for a dependency that is none
/// of them.
fn topology(nodes: &[SimNode]) -> Vec<Option<Vec<usize>>> {
    nodes
        .iter()
        .map(|node| {
            let mut at = node
                .dependencies
                .iter()
                .map(|d| nodes.iter().position(|n| n.handle == *d))
                .collect::<Option<Vec<usize>>>()?;
            at.sort_unstable();
            Some(at)
        })
        .collect()
}

/// What a captured stream recorded, replayed by a graph launch.
#[derive(Debug, Clone)]
enum GraphOp {
    Launch {
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: Vec<u8>,
    },
    /// `rows` rows `pitch` bytes apart, `count` elements each.
    Memset {
        dst: u64,
        value: u32,
        element_size: u32,
        count: u64,
        rows: u64,
        pitch: u64,
    },
    Copy(Copy3D),
    Empty,
    EventRecord(u64),
    EventWait(u64),
    /// A child graph, as it was when the node was added.
    Child(Vec<GraphOp>),
    /// A memory-allocation or memory-free node of this address (the
    /// memory is there all along: replaying them does nothing).
    MemAlloc(u64),
    MemFree(u64),
    /// A stream memory operation (captured `cuStreamWrite/WaitValue`, or
    /// a memory-operation node).
    MemOp(MemoryOp),
}

impl GraphOp {
    fn is_memory_node(&self) -> bool {
        matches!(self, GraphOp::MemAlloc(_) | GraphOp::MemFree(_))
    }
}

/// A stream's key among the captures.
fn stream_key(stream: StreamRef) -> u64 {
    match stream {
        StreamRef::Legacy => 0,
        StreamRef::PerThread => u64::MAX,
        StreamRef::Created(handle) => handle,
    }
}

/// Attributes as set on streams or kernel nodes (by a key of the object):
/// the driver's value unions, by attribute id; one never set reads zero.
#[derive(Debug, Default)]
struct AttributeStore(HashMap<u64, BTreeMap<u32, [u32; 16]>>);

impl AttributeStore {
    fn set(&mut self, object: u64, (id, value): (u32, [u32; 16])) {
        self.0.entry(object).or_default().insert(id, value);
    }

    fn get(&self, object: u64, id: u32) -> [u32; 16] {
        self.0
            .get(&object)
            .and_then(|held| held.get(&id))
            .copied()
            .unwrap_or_default()
    }

    /// `dst` takes `src`'s attributes.
    fn copy(&mut self, dst: u64, src: u64) {
        let copied = self.0.get(&src).cloned().unwrap_or_default();
        self.0.insert(dst, copied);
    }
}

/// A kernel or memset node's new parameters: `new` must be of the kind
/// `held` is (the driver refuses another kind with INVALID_VALUE).
fn replace_params(held: &mut GraphOp, new: GraphOp) -> CuResult<()> {
    if same_kind(held, &new) {
        *held = new;
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Whether `new` may take `held`'s place: an operation of the same kind
/// (a child graph of the same shape, operation by operation).
fn same_kind(held: &GraphOp, new: &GraphOp) -> bool {
    match (held, new) {
        (GraphOp::Launch { .. }, GraphOp::Launch { .. })
        | (GraphOp::Memset { .. }, GraphOp::Memset { .. })
        | (GraphOp::Copy(_), GraphOp::Copy(_))
        | (GraphOp::EventRecord(_), GraphOp::EventRecord(_))
        | (GraphOp::EventWait(_), GraphOp::EventWait(_))
        | (GraphOp::MemOp(_), GraphOp::MemOp(_))
        | (GraphOp::Empty, GraphOp::Empty) => true,
        (GraphOp::Child(held), GraphOp::Child(new)) => {
            held.len() == new.len() && held.iter().zip(new).all(|(h, n)| same_kind(h, n))
        }
        _ => false,
    }
}

impl SimContext {
    fn new(
        used: Arc<AtomicU64>,
        next_address: Arc<AtomicU64>,
        reachable: SharedReachable,
        observer: SimObserver,
        executor_id: u32,
        defer_launches: bool,
    ) -> Self {
        let overhead = context_overhead();
        used.fetch_add(overhead, Ordering::SeqCst);
        Self {
            used,
            charged: overhead,
            allocations: BTreeMap::new(),
            next_address,
            reachable,
            observer,
            executor_id,
            ipc_opens: HashMap::new(),
            next_handle: 1,
            modules: HashMap::new(),
            functions: HashMap::new(),
            streams: HashSet::new(),
            events: HashMap::new(),
            limits: LIMITS.iter().map(|(l, v, _)| (*l, *v)).collect(),
            warned: HashSet::new(),
            printf_buffer: Vec::new(),
            busy_until: None,
            physical: HashMap::new(),
            imported: HashSet::new(),
            reservations: BTreeMap::new(),
            capturing: HashMap::new(),
            invalidated_captures: HashSet::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
            exec_allocations: HashMap::new(),
            allocations_owner: HashMap::new(),
            node_attributes: AttributeStore::default(),
            stream_attributes: AttributeStore::default(),
            graph_allocations: HashMap::new(),
            deferred: defer_launches.then(Vec::new),
            deferred_failure: None,
            launch_here: false,
        }
    }

    /// A launch made now: the driver's `cuLaunchKernel` as the sim has it.
    fn launch_kernel_now(
        &mut self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamRef,
        params: &[u8],
    ) -> CuResult<()> {
        let f = self
            .functions
            .get(&function)
            .ok_or_else(|| unknown_handle("function", function))?;
        self.check_stream(stream)?;
        let threads = launch_threads(grid, block)?;
        if self.capturing.contains_key(&stream_key(stream)) {
            self.record(
                stream,
                GraphOp::Launch {
                    function,
                    grid,
                    block,
                    shared_mem_bytes,
                    params: params.to_vec(),
                },
            );
            return Ok(());
        }
        check_poisoned()?;
        if f.name == "rgpu_fault" {
            if std::env::var_os("RGPU_SIM_FAULT_POISONS_PROCESS").is_some_and(|v| v == "1") {
                warn!("sim: rgpu_fault launched: this process's executor is poisoned (test mode)");
                POISONED.store(true, Ordering::SeqCst);
            }
            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
        }
        let Some(kernel) = f.kernel else {
            if self.warned.insert(f.name.clone()) {
                warn!("sim executor has no implementation of kernel {}", f.name);
                // The application hears it too: with the device output it
                // gets at its next synchronisation, as a driver's printf.
                let note = format!(
                    "rgpu sim executor: kernel {} did not run: this test fixture runs only \
                     its reference kernels (the launch fails with CUDA_ERROR_NOT_SUPPORTED); \
                     run the daemon with --executor cuda on a GPU host\n",
                    f.name
                );
                self.printf_buffer.extend_from_slice(note.as_bytes());
            }
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        };
        let sizes: Vec<u32> = f.info.params.iter().map(|p| p.size).collect();
        if sizes != kernel.param_sizes() {
            warn!(
                "sim: kernel {} declares parameter sizes {sizes:?}, expected {:?}",
                f.name,
                kernel.param_sizes()
            );
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let args = f
            .info
            .params
            .iter()
            .map(|p| param_value(params, p.offset, p.size))
            .collect::<CuResult<Vec<u64>>>()?;
        trace!(
            "sim: launch {} grid {grid:?} block {block:?} args {args:x?}",
            f.name
        );
        self.run_kernel(kernel, &args, threads)?;
        self.observer.0.launches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Runs the launches held back, in order (`RGPU_SIM_DEFER_LAUNCHES`).
    fn run_deferred(&mut self) {
        let Some(pending) = self.deferred.as_mut().map(std::mem::take) else {
            return;
        };
        if !pending.is_empty() {
            self.observer
                .0
                .deferred_batches
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(pending.len());
        }
        for l in pending {
            let result = self.launch_kernel_now(
                l.function,
                l.grid,
                l.block,
                l.shared_mem_bytes,
                l.stream,
                &l.params,
            );
            if let Err(code) = result {
                self.deferred_failure.get_or_insert(code);
            }
        }
    }

    /// Waits until the spinning work is done (as a GPU's synchronisation).
    fn wait_idle(&mut self) {
        if let Some(until) = self.busy_until.take() {
            let left = until.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
        }
    }

    /// NOT_READY while spinning work runs.
    fn idle(&self) -> CuResult<()> {
        match self.busy_until {
            Some(until) if Instant::now() < until => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    fn new_handle(&mut self) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        handle
    }

    /// What the occupancy model needs of a function: its attributes.
    fn kernel_resources(&mut self, function: u64) -> CuResult<KernelResources> {
        let registers = self.func_get_attribute(function, FUNC_ATTRIBUTE_NUM_REGS)?;
        let static_shared = self.func_get_attribute(function, 1)?;
        let max_dynamic =
            self.func_get_attribute(function, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
        Ok(KernelResources {
            registers,
            static_shared: u64::try_from(static_shared).unwrap_or(0),
            max_dynamic_shared: u64::try_from(max_dynamic).unwrap_or(0),
        })
    }

    fn allocate(&mut self, size: u64, owner: Owner) -> CuResult<u64> {
        let charged = size
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(charged).filter(|n| *n <= SIM_TOTAL_MEM)
            })
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        let Some(block) = HostBlock::zeroed(size) else {
            self.used.fetch_sub(charged, Ordering::SeqCst);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        // Addresses are never reused, so a stale pointer never reaches a
        // newer allocation; a process would have to allocate exabytes in
        // its life to run out.
        let step = charged.max(ALLOC_ALIGN);
        let Ok(address) =
            self.next_address
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |next| {
                    next.checked_add(step)
                })
        else {
            self.used.fetch_sub(charged, Ordering::SeqCst);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.charged += charged;
        self.insert_allocation(
            address,
            Allocation {
                block: Rc::new(block),
                offset: 0,
                size,
                charged,
                owner,
            },
        );
        Ok(address)
    }

    /// Adds an allocation, which every context reaches from now on.
    fn insert_allocation(&mut self, address: u64, allocation: Allocation) {
        // Fits in usize: the block holds at least `offset + size` bytes.
        let host = allocation.block.ptr.as_ptr() as usize + allocation.offset as usize;
        lock_reachable(&self.reachable)
            .device
            .insert(address, (host, allocation.size));
        self.allocations.insert(address, allocation);
    }

    /// Removes an allocation: out of every context's reach first, so that
    /// its block may go.
    fn remove_allocation(&mut self, address: u64) -> Option<Allocation> {
        lock_reachable(&self.reachable).device.remove(&address);
        self.allocations.remove(&address)
    }

    fn release(&mut self, address: u64) {
        if let Some(allocation) = self.remove_allocation(address) {
            self.used.fetch_sub(allocation.charged, Ordering::SeqCst);
            self.charged -= allocation.charged;
        }
    }

    /// The host address of `[ptr, ptr + len)`, which must lie inside one
    /// allocation; `error` otherwise.
    fn host_range(&self, ptr: u64, len: u64, error: u32) -> CuResult<*mut u8> {
        let (base, allocation) = self.allocations.range(..=ptr).next_back().ok_or(error)?;
        let offset = ptr - base;
        match offset.checked_add(len) {
            Some(end) if end <= allocation.size => {}
            _ => return Err(error),
        }
        // Fits in usize: the block holds at least `offset + size` bytes.
        let offset = (allocation.offset + offset) as usize;
        // SAFETY: offset + len <= allocation offset + size <= the block's
        // length.
        Ok(unsafe { allocation.block.ptr.as_ptr().add(offset) })
    }

    /// The host address of `[ptr, ptr + len)` for a copy or memset: inside
    /// one allocation of this context, or else inside one run of registered
    /// host memory or one allocation of another context (which stay there
    /// while `reachable`, the locked registry, is held).
    fn reach(&self, reachable: &Reachable, ptr: u64, len: u64) -> CuResult<*mut u8> {
        self.host_range(ptr, len, CUDA_ERROR_INVALID_VALUE)
            .or_else(|error| {
                reachable
                    .host_range(ptr, len)
                    .or_else(|| reachable.device_range(ptr, len))
                    .ok_or(error)
            })
    }

    fn read(&self, ptr: u64, len: u64, error: u32) -> CuResult<Vec<u8>> {
        let src = self.host_range(ptr, len, error)?;
        let len = usize::try_from(len).map_err(|_| error)?;
        let mut out = vec![0u8; len];
        // Another context may reach the block: not while this is held.
        let reachable = lock_reachable(&self.reachable);
        // SAFETY: host_range checked `len` bytes at `src` inside a block;
        // `out` is a fresh vector of that length.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
        drop(reachable);
        Ok(out)
    }

    fn write(&mut self, ptr: u64, data: &[u8], error: u32) -> CuResult<()> {
        let dst = self.host_range(ptr, data.len() as u64, error)?;
        // As in `read`.
        let reachable = lock_reachable(&self.reachable);
        // SAFETY: host_range checked `data.len()` bytes at `dst` inside a
        // block, which `data` (a separate buffer) cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        drop(reachable);
        Ok(())
    }

    fn check_stream(&self, stream: StreamRef) -> CuResult<()> {
        match stream {
            StreamRef::Created(handle) if !self.streams.contains(&handle) => {
                Err(unknown_handle("stream", handle))
            }
            _ => Ok(()),
        }
    }

    fn event(&self, event: u64) -> CuResult<&SimEvent> {
        self.events
            .get(&event)
            .ok_or_else(|| unknown_handle("event", event))
    }

    fn check_function(&self, function: u64) -> CuResult<()> {
        match self.functions.contains_key(&function) {
            true => Ok(()),
            false => Err(unknown_handle("function", function)),
        }
    }

    /// Runs a graph's operations on `stream`, in order (one queue: what a
    /// node depends on ran before it).
    fn replay(&mut self, ops: &[GraphOp], stream: StreamRef) -> CuResult<()> {
        for op in ops {
            match op {
                GraphOp::Launch {
                    function,
                    grid,
                    block,
                    shared_mem_bytes,
                    params,
                } => self.launch_kernel_now(
                    *function,
                    *grid,
                    *block,
                    *shared_mem_bytes,
                    stream,
                    params,
                )?,
                GraphOp::Memset {
                    dst,
                    value,
                    element_size,
                    count,
                    rows,
                    pitch,
                } => {
                    for row in 0..*rows {
                        let at = row
                            .checked_mul(*pitch)
                            .and_then(|offset| dst.checked_add(offset))
                            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                        self.memset(stream, at, *value, *element_size, *count)?;
                    }
                }
                GraphOp::Copy(copy) => {
                    for slice in 0..copy.depth {
                        for row in 0..copy.height {
                            let at = |side: &PitchedSide| {
                                side.row_start(row, slice).ok_or(CUDA_ERROR_INVALID_VALUE)
                            };
                            self.memcpy_dtod(stream, at(&copy.dst)?, at(&copy.src)?, copy.width)?;
                        }
                    }
                }
                GraphOp::Empty => {}
                GraphOp::EventRecord(event) => self.event_record(*event, stream)?,
                GraphOp::EventWait(event) => self.stream_wait_event(stream, *event, 0)?,
                GraphOp::Child(ops) => self.replay(ops, stream)?,
                GraphOp::MemAlloc(_) | GraphOp::MemFree(_) => {}
                GraphOp::MemOp(op) => self.stream_memory_op(stream, *op)?,
            }
        }
        Ok(())
    }

    /// The `width`-byte word at `address` (reachable memory), read or
    /// written volatilely.
    fn value_at(&self, address: u64, width: u32, write: Option<u64>) -> CuResult<u64> {
        let reachable = lock_reachable(&self.reachable);
        let at = self.reach(&reachable, address, width.into())?;
        // SAFETY: `reach` checked `width` bytes at `at` inside a live block
        // or registered memory, kept while `reachable` is held; the guest
        // may touch the same word, so every access is volatile.
        unsafe {
            if width == 8 {
                let word = at.cast::<u64>();
                if let Some(value) = write {
                    word.write_volatile(value);
                }
                Ok(word.read_volatile())
            } else {
                let word = at.cast::<u32>();
                if let Some(value) = write {
                    word.write_volatile(value as u32);
                }
                Ok(word.read_volatile().into())
            }
        }
    }

    /// What a node of a built graph does, checked as the driver checks it
    /// when the node is added.
    /// Kernel node `node` of one of the context's graphs.
    fn kernel_node(&self, node: u64) -> CuResult<()> {
        match self
            .graphs
            .values()
            .flat_map(|nodes| nodes.iter())
            .find(|n| n.handle == node)
        {
            Some(SimNode {
                op: GraphOp::Launch { .. },
                ..
            }) => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Node `node` of executable graph `exec` (the handle of its graph's
    /// node).
    fn exec_node_any(&mut self, exec: u64, node: u64) -> CuResult<&mut SimNode> {
        self.graph_execs
            .get_mut(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .iter_mut()
            .find(|n| n.handle == node)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Node `node` of executable graph `exec`: a kernel, memset or memcpy
    /// node (the kinds the driver enables and disables).
    fn exec_node(&mut self, exec: u64, node: u64) -> CuResult<&mut SimNode> {
        let held = self.exec_node_any(exec, node)?;
        match held.op {
            GraphOp::Launch { .. } | GraphOp::Memset { .. } | GraphOp::Copy(_) => Ok(held),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn graph_op(&self, node: &GraphNode<'_>) -> CuResult<GraphOp> {
        Ok(match *node {
            GraphNode::Empty => GraphOp::Empty,
            GraphNode::Kernel {
                function,
                grid,
                block,
                shared_mem_bytes,
                params,
            } => {
                self.check_function(function)?;
                launch_threads(grid, block)?;
                GraphOp::Launch {
                    function,
                    grid,
                    block,
                    shared_mem_bytes,
                    params: params.to_vec(),
                }
            }
            GraphNode::Memset {
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                if !matches!(element_size, 1 | 2 | 4)
                    || !dst.is_multiple_of(u64::from(element_size))
                    || width == 0
                    || height == 0
                {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                GraphOp::Memset {
                    dst,
                    value,
                    element_size,
                    count: width,
                    rows: height,
                    pitch,
                }
            }
            GraphNode::Copy(copy) => {
                // As the driver: every byte of both sides reachable.
                for side in [&copy.dst, &copy.src] {
                    let span = copy.span(side).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                    let reachable = lock_reachable(&self.reachable);
                    self.reach(&reachable, side.address, span)?;
                }
                GraphOp::Copy(copy)
            }
            GraphNode::EventRecord(event) => {
                self.event(event)?;
                GraphOp::EventRecord(event)
            }
            GraphNode::EventWait(event) => {
                self.event(event)?;
                GraphOp::EventWait(event)
            }
            GraphNode::Child(child) => {
                let nodes = self.graphs.get(&child).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                // As the driver: no memory nodes in a child graph.
                if nodes.iter().any(|n| n.op.is_memory_node()) {
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                GraphOp::Child(in_dependency_order(nodes))
            }
            GraphNode::MemFree(dptr) => {
                if !self.graph_allocations.contains_key(&dptr) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                GraphOp::MemFree(dptr)
            }
            GraphNode::MemOp(op) => {
                // The word must be reachable, as the driver checks it.
                self.value_at(op.address, op.width, None)?;
                GraphOp::MemOp(op)
            }
        })
    }

    /// One more (or one fewer) holder of the memory-allocation nodes among
    /// `nodes`; memory no graph or executable graph holds is freed.
    /// Begins a capture of `stream`: into a new graph, or with `into` into
    /// an existing graph after the given nodes.
    fn begin_capture(
        &mut self,
        stream: StreamRef,
        mode: u32,
        into: Option<(u64, Vec<u64>)>,
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        if mode > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let key = stream_key(stream);
        if self.capturing.contains_key(&key) {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        let into_existing = into.is_some();
        let (graph, dependencies) = match into {
            Some(into) => into,
            None => {
                let graph = self.new_handle();
                self.graphs.insert(graph, Vec::new());
                (graph, Vec::new())
            }
        };
        self.capturing.insert(
            key,
            SimCapture {
                graph,
                dependencies,
                into_existing,
            },
        );
        Ok(())
    }

    /// `op`, made on capturing `stream`: a node of the capture's graph after
    /// the capture's dependencies, and the one the next node depends on.
    fn record(&mut self, stream: StreamRef, op: GraphOp) {
        let handle = self.new_handle();
        let Some(capture) = self.capturing.get_mut(&stream_key(stream)) else {
            return;
        };
        let dependencies = std::mem::replace(&mut capture.dependencies, vec![handle]);
        if let Some(nodes) = self.graphs.get_mut(&capture.graph) {
            nodes.push(SimNode {
                handle,
                dependencies,
                op,
                disabled: false,
            });
        }
    }

    fn hold_allocations(&mut self, nodes: &[SimNode], more: bool) {
        for node in nodes {
            let GraphOp::MemAlloc(dptr) = node.op else {
                continue;
            };
            let Some(holders) = self.graph_allocations.get_mut(&dptr) else {
                continue;
            };
            if more {
                *holders += 1;
            } else {
                *holders -= 1;
                if *holders == 0 {
                    self.graph_allocations.remove(&dptr);
                    self.release(dptr);
                }
            }
        }
    }

    fn run_kernel(&mut self, kernel: ReferenceKernel, args: &[u64], threads: u64) -> CuResult<()> {
        // Parameter sizes were checked against the kernel, so `args` holds
        // one value per parameter.
        let arg = |i: usize| args.get(i).copied().ok_or(CUDA_ERROR_INVALID_VALUE);
        let bad = CUDA_ERROR_ILLEGAL_ADDRESS;
        match kernel {
            ReferenceKernel::Empty => Ok(()),
            ReferenceKernel::Spin => {
                // In order, as on one queue of a GPU: it starts when the
                // spinning work before it is done.
                let now = Instant::now();
                let start = self.busy_until.map_or(now, |b| b.max(now));
                let until = start
                    .checked_add(Duration::from_nanos(arg(0)?))
                    .unwrap_or(now + FOREVER);
                self.busy_until = Some(until);
                Ok(())
            }
            ReferenceKernel::Printf => {
                // Every thread prints; what overflows the FIFO is lost, as
                // on a GPU.
                let fifo = self
                    .limits
                    .get(&LIMIT_PRINTF_FIFO_SIZE)
                    .copied()
                    .unwrap_or(0);
                let line = format!("rgpu_printf {}\n", arg(0)? as u32);
                for _ in 0..threads {
                    if (self.printf_buffer.len() + line.len()) as u64 > fifo {
                        break;
                    }
                    self.printf_buffer.extend_from_slice(line.as_bytes());
                }
                Ok(())
            }
            ReferenceKernel::VectorAdd => {
                let count = arg(3)?.min(threads);
                let a = self.read(arg(0)?, count * 4, bad)?;
                let b = self.read(arg(1)?, count * 4, bad)?;
                let c: Vec<u8> = a
                    .chunks_exact(4)
                    .zip(b.chunks_exact(4))
                    .flat_map(|(x, y)| (f32_at(x) + f32_at(y)).to_le_bytes())
                    .collect();
                self.write(arg(2)?, &c, bad)
            }
            ReferenceKernel::Scale => {
                let factor = f32::from_bits(arg(1)? as u32);
                let count = arg(2)?.min(threads);
                let x = self.read(arg(0)?, count * 4, bad)?;
                let scaled: Vec<u8> = x
                    .chunks_exact(4)
                    .flat_map(|v| (f32_at(v) * factor).to_le_bytes())
                    .collect();
                self.write(arg(0)?, &scaled, bad)
            }
            ReferenceKernel::FillIndex => {
                let base = arg(1)? as u32;
                let count = arg(2)?.min(threads);
                let out: Vec<u8> = (0..count)
                    .flat_map(|i| base.wrapping_add(i as u32).to_le_bytes())
                    .collect();
                self.write(arg(0)?, &out, bad)
            }
            ReferenceKernel::CountMismatches => {
                let base = arg(1)? as u32;
                let count = arg(2)?.min(threads);
                let data = self.read(arg(0)?, count * 4, bad)?;
                let mismatches = data
                    .chunks_exact(4)
                    .zip(0u32..)
                    .filter(|(v, i)| u32_at(v) != base.wrapping_add(*i))
                    .count() as u32;
                let counter = arg(3)?;
                let before = u32_at(&self.read(counter, 4, bad)?);
                self.write(counter, &before.wrapping_add(mismatches).to_le_bytes(), bad)
            }
        }
    }
}

fn u32_at(bytes: &[u8]) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(bytes.get(..4).unwrap_or(&[0; 4]));
    u32::from_le_bytes(raw)
}

fn f32_at(bytes: &[u8]) -> f32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(bytes.get(..4).unwrap_or(&[0; 4]));
    f32::from_le_bytes(raw)
}

/// Reads a parameter of `size` (1 to 8) bytes at `offset` as an integer.
fn param_value(params: &[u8], offset: u32, size: u32) -> CuResult<u64> {
    let start = offset as usize;
    let bytes = params
        .get(start..start + size as usize)
        .filter(|b| b.len() <= 8)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut raw = [0u8; 8];
    raw.get_mut(..bytes.len())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .copy_from_slice(bytes);
    Ok(u64::from_le_bytes(raw))
}

/// The answer to a stream, event or function handle this context does not
/// hold. The session's tables are the only check the cuda executor has
/// (it takes these handles as driver objects), so in debug builds a
/// handle that got past them is a session bug and stops the test.
/// (This crate's own tests pass unknown handles on purpose.)
fn unknown_handle(kind: &str, handle: u64) -> u32 {
    #[cfg(all(debug_assertions, not(test)))]
    panic!("the session passed an unknown {kind} handle {handle:#x}");
    #[cfg(not(all(debug_assertions, not(test))))]
    {
        let _ = (kind, handle);
        CUDA_ERROR_INVALID_HANDLE
    }
}

/// Total threads of a launch, after CUDA's geometry checks.
fn launch_threads(grid: [u32; 3], block: [u32; 3]) -> CuResult<u64> {
    let dims_ok =
        |dims: [u32; 3], max: [u32; 3]| dims.iter().zip(max).all(|(d, m)| (1..=m).contains(d));
    if !dims_ok(grid, MAX_GRID) || !dims_ok(block, MAX_BLOCK) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let per_block: u64 = block.iter().map(|d| u64::from(*d)).product();
    if per_block > MAX_THREADS_PER_BLOCK {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // At most 2^31 * 2^32 blocks times 2^10 threads: saturate, don't wrap.
    Ok(grid
        .iter()
        .fold(per_block, |n, d| n.saturating_mul(u64::from(*d))))
}

impl SimContext {
    /// Prints the device printf output on stdout, as the driver does when a
    /// call synchronises with the device.
    fn print_device_output(&mut self) {
        if self.printf_buffer.is_empty() {
            return;
        }
        let output = std::mem::take(&mut self.printf_buffer);
        write_device_output(&output);
    }
}

/// Device output goes to the process's stdout, where the daemon's worker
/// collects it for the guest (console).
#[cfg(not(test))]
fn write_device_output(output: &[u8]) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(output).and_then(|()| stdout.flush()) {
        debug!("sim: cannot print device printf output: {e}");
    }
}

/// Unit tests: into the test harness's capture (shown if one fails).
#[cfg(test)]
fn write_device_output(output: &[u8]) {
    print!("{}", String::from_utf8_lossy(output));
}

impl Drop for SimContext {
    fn drop(&mut self) {
        self.run_deferred();
        // Destroying a context prints what its kernels left.
        self.print_device_output();
        // Out of the other contexts' reach before the blocks go (with the
        // fields, after this).
        let mut reachable = lock_reachable(&self.reachable);
        for address in self.allocations.keys() {
            reachable.device.remove(address);
        }
        drop(reachable);
        let observed = &self.observer.0;
        observed.live_contexts.fetch_sub(1, Ordering::SeqCst);
        let opens: u32 = self.ipc_opens.values().sum();
        observed
            .ipc_opens
            .fetch_sub(opens as usize, Ordering::SeqCst);
        self.used.fetch_sub(self.charged, Ordering::SeqCst);
        debug!(
            "sim: context destroyed ({} allocations, {} bytes freed)",
            self.allocations.len(),
            self.charged
        );
    }
}

impl ContextExecutor for SimContext {
    fn synchronize(&mut self) -> CuResult<()> {
        self.observer
            .0
            .synchronizations
            .fetch_add(1, Ordering::SeqCst);
        check_poisoned()?;
        self.wait_idle();
        self.print_device_output();
        Ok(())
    }

    fn get_limit(&mut self, limit: u32) -> CuResult<u64> {
        self.limits
            .get(&limit)
            .copied()
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> CuResult<()> {
        match LIMITS.iter().find(|(l, _, _)| *l == limit) {
            None => Err(CUDA_ERROR_UNSUPPORTED_LIMIT),
            Some((_, _, false)) => Err(CUDA_ERROR_INVALID_VALUE),
            Some(_) => {
                self.limits.insert(limit, value);
                Ok(())
            }
        }
    }

    fn mem_alloc(&mut self, size: u64) -> CuResult<u64> {
        check_poisoned()?;
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = self.allocate(size, Owner::User)?;
        trace!("sim: mem_alloc {size} -> {ptr:#x}");
        Ok(ptr)
    }

    fn mem_free(&mut self, device_ptr: u64) -> CuResult<()> {
        match self.allocations.get(&device_ptr) {
            Some(a) if a.owner == Owner::User => {
                self.release(device_ptr);
                trace!("sim: mem_free {device_ptr:#x}");
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn mem_get_info(&mut self) -> CuResult<(u64, u64)> {
        let used = self.used.load(Ordering::SeqCst).min(SIM_TOTAL_MEM);
        Ok((SIM_TOTAL_MEM - used, SIM_TOTAL_MEM))
    }

    fn memcpy_htod(
        &mut self,
        stream: StreamRef,
        dst: u64,
        src: &[HostRun],
        _wait_for_source: bool,
    ) -> CuResult<()> {
        check_poisoned()?;
        self.check_stream(stream)?;
        // Host memory in a graph is not modelled.
        if self.capturing.contains_key(&stream_key(stream)) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let total = src
            .iter()
            .try_fold(0u64, |sum, run| sum.checked_add(run.len as u64))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if total == 0 {
            return Ok(());
        }
        let reachable = lock_reachable(&self.reachable);
        let base = self.reach(&reachable, dst, total)?;
        let mut offset = 0usize;
        for run in src.iter().filter(|r| r.len > 0) {
            // SAFETY: the session guarantees `run` is mapped guest memory of
            // `run.len` bytes (HostRun); the destination range was checked to
            // hold all runs' bytes, in a live block or in registered memory,
            // both kept there while `reachable` is held; `copy` allows the
            // two to overlap (registered memory is guest memory too).
            unsafe { std::ptr::copy(run.ptr, base.add(offset), run.len) };
            offset += run.len;
        }
        drop(reachable);
        trace!("sim: memcpy_htod {total} bytes -> {dst:#x}");
        Ok(())
    }

    fn memcpy_dtoh(
        &mut self,
        stream: StreamRef,
        dst: &[HostRun],
        src: u64,
        wait: bool,
    ) -> CuResult<()> {
        check_poisoned()?;
        self.check_stream(stream)?;
        if self.capturing.contains_key(&stream_key(stream)) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if wait {
            // A synchronous copy waits for the kernels before it.
            self.print_device_output();
        }
        let total = dst
            .iter()
            .try_fold(0u64, |sum, run| sum.checked_add(run.len as u64))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if total == 0 {
            return Ok(());
        }
        let reachable = lock_reachable(&self.reachable);
        let base = self.reach(&reachable, src, total)?;
        let mut offset = 0usize;
        for run in dst.iter().filter(|r| r.len > 0) {
            // SAFETY: as in memcpy_htod, with the roles swapped.
            unsafe { std::ptr::copy(base.add(offset), run.ptr, run.len) };
            offset += run.len;
        }
        drop(reachable);
        trace!("sim: memcpy_dtoh {total} bytes <- {src:#x}");
        Ok(())
    }

    fn memcpy_dtod(&mut self, stream: StreamRef, dst: u64, src: u64, size: u64) -> CuResult<()> {
        self.check_stream(stream)?;
        if self.capturing.contains_key(&stream_key(stream)) {
            self.record(stream, GraphOp::Copy(Copy3D::linear(dst, src, size)));
            return Ok(());
        }
        if size == 0 {
            return Ok(());
        }
        let reachable = lock_reachable(&self.reachable);
        let from = self.reach(&reachable, src, size)?;
        let to = self.reach(&reachable, dst, size)?;
        // SAFETY: both ranges were checked inside live blocks or registered
        // memory, kept there while `reachable` is held; `copy` allows them
        // to overlap (as a copy within one allocation may).
        unsafe { std::ptr::copy(from, to, size as usize) };
        drop(reachable);
        trace!("sim: memcpy_dtod {size} bytes {src:#x} -> {dst:#x}");
        Ok(())
    }

    fn memset(
        &mut self,
        stream: StreamRef,
        dst: u64,
        value: u32,
        element_size: u32,
        count: u64,
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        if !matches!(element_size, 1 | 2 | 4) || !dst.is_multiple_of(u64::from(element_size)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if self.capturing.contains_key(&stream_key(stream)) {
            self.record(
                stream,
                GraphOp::Memset {
                    dst,
                    value,
                    element_size,
                    count,
                    rows: 1,
                    pitch: 0,
                },
            );
            return Ok(());
        }
        let len = count
            .checked_mul(element_size.into())
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if len == 0 {
            return Ok(());
        }
        let reachable = lock_reachable(&self.reachable);
        let base = self.reach(&reachable, dst, len)?;
        let pattern = value.to_le_bytes();
        let width = element_size as usize;
        for at in (0..len as usize).step_by(width) {
            // SAFETY: `len` bytes at `base` lie in one live block or in
            // registered memory, kept there while `reachable` is held;
            // `pattern` is a local array at least `width` bytes long. Raw
            // writes: registered memory is guest memory, shared.
            unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), base.add(at), width) };
        }
        drop(reachable);
        trace!("sim: memset {count} x {element_size} bytes = {value:#x} at {dst:#x}");
        Ok(())
    }

    fn module_load(&mut self, image: &[u8]) -> CuResult<u64> {
        match classify(image) {
            Ok(ImageKind::Ptx) => {}
            Ok(kind) => {
                warn!(
                    "sim executor only takes PTX text, not a {kind:?}: rebuild the test with PTX"
                );
                return Err(CUDA_ERROR_INVALID_IMAGE);
            }
            Err(e) => {
                warn!("sim: module image refused: {e}");
                return Err(CUDA_ERROR_INVALID_IMAGE);
            }
        }
        let module = ptx::text(image)
            .ok_or(CUDA_ERROR_INVALID_IMAGE)
            .and_then(|text| {
                ptx::parse(text).map_err(|e| {
                    warn!("sim: PTX refused: {e}");
                    CUDA_ERROR_INVALID_PTX
                })
            })?;
        let handle = self.new_handle();
        let mut variables = HashMap::new();
        for variable in &module.variables {
            match self.allocate(variable.size, Owner::Module(handle)) {
                Ok(address) => {
                    variables.insert(variable.name.clone(), (address, variable.size));
                }
                Err(e) => {
                    for (address, _) in variables.values() {
                        self.release(*address);
                    }
                    return Err(e);
                }
            }
        }
        let entries = module
            .entries
            .into_iter()
            .map(|e| (e.name, e.info))
            .collect::<HashMap<_, _>>();
        debug!(
            "sim: module {handle} loaded ({} entries, {} variables)",
            entries.len(),
            variables.len()
        );
        self.modules.insert(
            handle,
            SimModule {
                entries,
                variables,
                functions: HashMap::new(),
            },
        );
        Ok(handle)
    }

    fn module_unload(&mut self, module: u64) -> CuResult<()> {
        let removed = self
            .modules
            .remove(&module)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        for (address, _) in removed.variables.values() {
            self.release(*address);
        }
        self.functions.retain(|_, f| f.module != module);
        debug!("sim: module {module} unloaded");
        Ok(())
    }

    fn module_get_function(&mut self, module: u64, name: &str) -> CuResult<(u64, FunctionInfo)> {
        let loaded = self.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let info = loaded
            .entries
            .get(name)
            .cloned()
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        if let Some(handle) = loaded.functions.get(name) {
            return Ok((*handle, info));
        }
        let handle = self.new_handle();
        self.functions.insert(
            handle,
            SimFunction {
                module,
                name: name.to_owned(),
                info: info.clone(),
                kernel: ReferenceKernel::by_name(name),
                attributes: HashMap::new(),
            },
        );
        if let Some(loaded) = self.modules.get_mut(&module) {
            loaded.functions.insert(name.to_owned(), handle);
        }
        Ok((handle, info))
    }

    fn module_get_global(&mut self, module: u64, name: &str) -> CuResult<(u64, u64)> {
        let loaded = self.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        loaded
            .variables
            .get(name)
            .copied()
            .ok_or(CUDA_ERROR_NOT_FOUND)
    }

    fn func_get_attribute(&mut self, function: u64, attribute: i32) -> CuResult<i32> {
        let f = self
            .functions
            .get(&function)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(value) = f.attributes.get(&attribute) {
            return Ok(*value);
        }
        // CUfunction_attribute numbering (cuda.h); plausible values for the
        // tiny reference kernels compiled for sm_90.
        Ok(match attribute {
            0 => 1024,                                       // MAX_THREADS_PER_BLOCK
            1 => 0,                                          // SHARED_SIZE_BYTES
            2 => 0,                                          // CONST_SIZE_BYTES
            3 => 0,                                          // LOCAL_SIZE_BYTES
            FUNC_ATTRIBUTE_NUM_REGS => SIM_KERNEL_REGISTERS, // NUM_REGS
            5 => 90,                                         // PTX_VERSION
            6 => 90,                                         // BINARY_VERSION
            7 => 0,                                          // CACHE_MODE_CA
            FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => SIM_KERNEL_MAX_DYNAMIC_SHARED,
            9 => -1,      // PREFERRED_SHARED_MEMORY_CARVEOUT
            10..=15 => 0, // cluster attributes: none required
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// The attributes `cuFuncSetAttribute` accepts, with the ranges cuda.h
    /// gives them; the rest are read-only.
    fn func_set_attribute(&mut self, function: u64, attribute: i32, value: i32) -> CuResult<()> {
        let f = self
            .functions
            .get_mut(&function)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let valid = match attribute {
            // MAX_DYNAMIC_SHARED_SIZE_BYTES: static (0) plus dynamic within the opt-in.
            FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                u64::try_from(value).is_ok_and(|v| v <= occupancy::SHARED_PER_BLOCK_OPTIN)
            }
            9 => (-1..=100).contains(&value), // PREFERRED_SHARED_MEMORY_CARVEOUT
            11..=13 => value >= 0,            // REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH
            FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => (0..=1).contains(&value),
            15 => (0..=2).contains(&value), // CLUSTER_SCHEDULING_POLICY_PREFERENCE
            _ => false,
        };
        if !valid {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        f.attributes.insert(attribute, value);
        Ok(())
    }

    fn occupancy_max_active_blocks(
        &mut self,
        function: u64,
        block_size: i32,
        dynamic_smem_bytes: u64,
        flags: u32,
    ) -> CuResult<i32> {
        if flags & !OCCUPANCY_FLAGS != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let kernel = self.kernel_resources(function)?;
        occupancy::max_active_blocks(&kernel, block_size, dynamic_smem_bytes)
    }

    fn occupancy_available_dynamic_smem(
        &mut self,
        function: u64,
        num_blocks: i32,
        block_size: i32,
    ) -> CuResult<u64> {
        let kernel = self.kernel_resources(function)?;
        occupancy::available_dynamic_shared(&kernel, num_blocks, block_size)
    }

    fn occupancy_max_potential_cluster_size(
        &mut self,
        function: u64,
        _query: &ClusterQuery,
    ) -> CuResult<i32> {
        self.kernel_resources(function)?;
        let non_portable = self
            .func_get_attribute(function, FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)?
            != 0;
        let limit = if non_portable {
            occupancy::MAX_CLUSTER
        } else {
            occupancy::MAX_PORTABLE_CLUSTER
        };
        i32::try_from(limit).map_err(|_| CUDA_ERROR_UNKNOWN)
    }

    fn occupancy_max_active_clusters(
        &mut self,
        function: u64,
        query: &ClusterQuery,
    ) -> CuResult<i32> {
        let kernel = self.kernel_resources(function)?;
        let product = |dims: [u32; 3]| dims.iter().map(|d| u64::from(*d)).product::<u64>();
        // No cluster shape given: the function's required one, else 1.
        let cluster = if query.cluster == [0; 3] {
            let required = [11, 12, 13].map(|a| {
                self.func_get_attribute(function, a)
                    .map_or(0, |v| u32::try_from(v).unwrap_or(0))
            });
            product(required).max(1)
        } else {
            product(query.cluster)
        };
        let non_portable = self
            .func_get_attribute(function, FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)?
            != 0;
        let limit = if non_portable {
            occupancy::MAX_CLUSTER
        } else {
            occupancy::MAX_PORTABLE_CLUSTER
        };
        if cluster == 0 || cluster > limit {
            return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
        }
        let block_size =
            i32::try_from(product(query.block)).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        occupancy::max_active_clusters(
            &kernel,
            block_size,
            u64::from(query.shared_mem_bytes),
            cluster,
        )
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
        // As the cuda executor's launch thread: handles checked now, the
        // launch made later (not on the per-thread stream, not in a capture).
        let defer = !self.launch_here && !matches!(stream, StreamRef::PerThread);
        if self.deferred.is_some() && defer {
            self.check_function(function)?;
        }
        if let (Some(deferred), true) = (self.deferred.as_mut(), defer) {
            deferred.push(DeferredLaunch {
                function,
                grid,
                block,
                shared_mem_bytes,
                stream,
                params,
            });
            return Ok(());
        }
        self.run_deferred();
        self.launch_kernel_now(function, grid, block, shared_mem_bytes, stream, &params)
    }

    fn fence(&mut self) {
        self.run_deferred();
    }

    fn launches_queued(&self) -> bool {
        self.deferred.as_ref().is_some_and(|held| !held.is_empty())
    }

    fn take_launch_failure(&mut self) -> Option<u32> {
        self.deferred_failure.take()
    }

    fn launch_on_calling_thread(&mut self, on: bool) {
        self.launch_here = on;
    }

    fn stream_create(&mut self, _flags: u32, _priority: i32) -> CuResult<u64> {
        let handle = self.new_handle();
        self.streams.insert(handle);
        Ok(handle)
    }

    fn stream_destroy(&mut self, stream: u64) -> CuResult<()> {
        if self.streams.remove(&stream) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    }

    fn stream_synchronize(&mut self, stream: StreamRef) -> CuResult<()> {
        self.check_stream(stream)?;
        self.wait_idle();
        self.print_device_output();
        Ok(())
    }

    /// As the driver: a query of a capturing stream is refused and
    /// invalidates the capture (its end then fails).
    fn stream_query(&mut self, stream: StreamRef) -> CuResult<()> {
        self.check_stream(stream)?;
        if self.capturing.contains_key(&stream_key(stream)) {
            self.invalidated_captures.insert(stream_key(stream));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        // Asked unfenced, as the cuda executor may be: a deferred launch on
        // the stream is work the "driver" has not seen.
        if let Some(deferred) = &self.deferred {
            if deferred.iter().any(|launch| launch.stream == stream) {
                return Err(CUDA_ERROR_NOT_READY);
            }
        }
        self.idle()
    }

    fn stream_wait_event(&mut self, stream: StreamRef, event: u64, _flags: u32) -> CuResult<()> {
        self.check_stream(stream)?;
        self.event(event).map(|_| ())
    }

    fn event_create(&mut self, flags: u32) -> CuResult<u64> {
        let handle = self.new_handle();
        self.events.insert(
            handle,
            SimEvent {
                flags,
                recorded: None,
                done_at: None,
            },
        );
        Ok(handle)
    }

    fn event_destroy(&mut self, event: u64) -> CuResult<()> {
        self.events
            .remove(&event)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    fn event_record(&mut self, event: u64, stream: StreamRef) -> CuResult<()> {
        self.check_stream(stream)?;
        let done_at = self.busy_until;
        let e = self
            .events
            .get_mut(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        e.recorded = Some(Instant::now());
        e.done_at = done_at;
        Ok(())
    }

    fn event_synchronize(&mut self, event: u64) -> CuResult<()> {
        if let Some(done_at) = self.event(event)?.done_at {
            let left = done_at.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
        }
        self.print_device_output();
        Ok(())
    }

    fn event_query(&mut self, event: u64) -> CuResult<()> {
        match self.event(event)?.done_at {
            Some(done_at) if Instant::now() < done_at => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    fn event_elapsed_time(&mut self, start: u64, end: u64) -> CuResult<f32> {
        let (start, end) = (self.event(start)?, self.event(end)?);
        if (start.flags | end.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (Some(t0), Some(t1)) = (start.recorded, end.recorded) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        let ms = if t1 >= t0 {
            t1.duration_since(t0).as_secs_f64() * 1e3
        } else {
            -(t0.duration_since(t1).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
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
        // As the driver: clusters tile the grid, at most 8 blocks (the
        // portable size). Blocks run one after another here, so a
        // cooperative launch needs nothing more.
        let cluster = options.cluster;
        if cluster != [0; 3] {
            let blocks = cluster.iter().map(|d| u64::from(*d)).product::<u64>();
            let tiles = cluster.iter().zip(grid).all(|(c, g)| *c > 0 && g % *c == 0);
            if !tiles || blocks > 8 {
                return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
            }
        }
        // Hints change nothing here (the session checked their values);
        // events are checked first, as the driver does, and recorded once
        // the kernel ran (its completion).
        let mut events = Vec::new();
        for hint in &options.hints {
            match *hint {
                LaunchHint::ProgrammaticEvent { event, .. }
                | LaunchHint::LaunchCompletionEvent { event, .. } => {
                    if !self.events.contains_key(&event) {
                        return Err(CUDA_ERROR_INVALID_HANDLE);
                    }
                    events.push(event);
                }
                _ => {}
            }
        }
        self.launch_kernel_now(function, grid, block, shared_mem_bytes, stream, params)?;
        for event in events {
            self.event_record(event, stream)?;
        }
        Ok(())
    }

    fn mem_granularity(&mut self, option: u32) -> CuResult<u64> {
        match option {
            0 | 1 => Ok(VMM_GRANULARITY),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn mem_create(&mut self, size: u64) -> CuResult<u64> {
        check_poisoned()?;
        if size == 0 || !size.is_multiple_of(VMM_GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(size).filter(|n| *n <= SIM_TOTAL_MEM)
            })
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        let Some(block) = HostBlock::shared(size) else {
            self.used.fetch_sub(size, Ordering::SeqCst);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.charged += size;
        let handle = self.new_handle();
        self.physical.insert(handle, (Rc::new(block), size));
        Ok(handle)
    }

    fn mem_export_fd(&mut self, handle: u64) -> CuResult<OwnedFd> {
        let (block, _) = self.physical.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match &block.backing {
            Backing::Shared { fd, .. } => fd.try_clone().map_err(|_| CUDA_ERROR_OUT_OF_MEMORY),
            Backing::Heap(_) => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn mem_import_fd(&mut self, fd: BorrowedFd<'_>) -> CuResult<u64> {
        let fd = fd
            .try_clone_to_owned()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // As the driver's descriptor, the memfd says how large it is.
        let size = std::fs::File::from(fd.try_clone().map_err(|_| CUDA_ERROR_INVALID_VALUE)?)
            .metadata()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?
            .len();
        if size == 0 || !size.is_multiple_of(VMM_GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let block = HostBlock::map_shared(fd, size).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        // The exporter's device memory: not this process's to count.
        let handle = self.new_handle();
        self.physical.insert(handle, (Rc::new(block), size));
        self.imported.insert(handle);
        Ok(handle)
    }

    fn mem_release(&mut self, handle: u64) -> CuResult<()> {
        let (_, size) = self
            .physical
            .remove(&handle)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if self.imported.remove(&handle) {
            return Ok(());
        }
        // Its mappings keep the memory (the block) until they go, as the
        // driver's do; the device memory is given back now.
        self.used.fetch_sub(size, Ordering::SeqCst);
        self.charged -= size;
        Ok(())
    }

    fn mem_address_reserve(&mut self, size: u64, alignment: u64, _address: u64) -> CuResult<u64> {
        if size == 0
            || !size.is_multiple_of(VMM_GRANULARITY)
            || !alignment.is_power_of_two() && alignment != 0
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(VMM_GRANULARITY);
        let address = self
            .next_address
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |next| {
                next.checked_next_multiple_of(align)?.checked_add(size)
            })
            .ok()
            .and_then(|previous| previous.checked_next_multiple_of(align))
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.reservations.insert(address, size);
        Ok(address)
    }

    fn mem_address_free(&mut self, address: u64, size: u64) -> CuResult<()> {
        if self.reservations.get(&address) != Some(&size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = address + size;
        if self.allocations.range(address..end).next().is_some() {
            // Still mapped.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.reservations.remove(&address);
        Ok(())
    }

    fn mem_map(&mut self, address: u64, size: u64, offset: u64, handle: u64) -> CuResult<()> {
        let (block, physical_size) = self
            .physical
            .get(&handle)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let end = address.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let in_reservation = self
            .reservations
            .range(..=address)
            .next_back()
            .is_some_and(|(base, len)| end <= base + len);
        let fits = offset.checked_add(size).is_some_and(|e| e <= physical_size);
        let free = self
            .allocations
            .range(..end)
            .next_back()
            .is_none_or(|(base, a)| base + a.size <= address);
        if size == 0 || !in_reservation || !fits || !free || !size.is_multiple_of(VMM_GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.insert_allocation(
            address,
            Allocation {
                block,
                offset,
                size,
                charged: 0,
                owner: Owner::Mapping,
            },
        );
        Ok(())
    }

    fn mem_unmap(&mut self, address: u64, size: u64) -> CuResult<()> {
        match self.allocations.get(&address) {
            Some(a) if a.owner == Owner::Mapping && a.size == size => {
                self.remove_allocation(address);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn mem_set_access(&mut self, address: u64, size: u64, flags: u32) -> CuResult<()> {
        if !matches!(flags, 1 | 3) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Every mapped byte is always accessible here; the whole range must
        // be mapped, by one mapping or several side by side.
        let end = address.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut at = address;
        while at < end {
            let (base, mapping) = self
                .allocations
                .range(..=at)
                .next_back()
                .filter(|(base, a)| a.owner == Owner::Mapping && at < **base + a.size)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            at = base + mapping.size;
        }
        Ok(())
    }

    fn stream_begin_capture(&mut self, stream: StreamRef, mode: u32) -> CuResult<()> {
        self.begin_capture(stream, mode, None)
    }

    fn stream_begin_capture_to_graph(
        &mut self,
        stream: StreamRef,
        graph: u64,
        dependencies: &[u64],
        mode: u32,
    ) -> CuResult<()> {
        let nodes = self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !dependencies
            .iter()
            .all(|d| nodes.iter().any(|n| n.handle == *d))
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.begin_capture(stream, mode, Some((graph, dependencies.to_vec())))
    }

    /// A write is done at once. The sim runs a stream's work at once, so a
    /// wait polls the word here (someone else, a guest thread, sets it), for
    /// at most `SIM_WAIT_VALUE_LIMIT`: the driver would wait for ever.
    fn stream_memory_op(&mut self, stream: StreamRef, op: MemoryOp) -> CuResult<()> {
        self.check_stream(stream)?;
        if self.capturing.contains_key(&stream_key(stream)) {
            self.record(stream, GraphOp::MemOp(op));
            return Ok(());
        }
        let MemoryOp {
            wait,
            address,
            value,
            width,
            flags,
        } = op;
        if !wait {
            return self.value_at(address, width, Some(value)).map(|_| ());
        }
        let mask = if width == 8 {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        };
        let value = value & mask;
        let met = |word: u64| match flags & 0x3 {
            // GEQ: cyclic, as the driver compares.
            0 if width == 8 => (word.wrapping_sub(value) as i64) >= 0,
            0 => ((word as u32).wrapping_sub(value as u32) as i32) >= 0,
            1 => word == value,
            2 => word & value != 0,
            _ => !(word | value) & mask != 0,
        };
        let deadline = std::time::Instant::now() + SIM_WAIT_VALUE_LIMIT;
        loop {
            if met(self.value_at(address, width, None)?) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                warn!("sim: a stream waited {SIM_WAIT_VALUE_LIMIT:?} for the word at {address:#x}");
                return Err(CUDA_ERROR_LAUNCH_TIMEOUT);
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    fn stream_end_capture(&mut self, stream: StreamRef) -> CuResult<u64> {
        self.check_stream(stream)?;
        let capture = self
            .capturing
            .remove(&stream_key(stream))
            .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        if self.invalidated_captures.remove(&stream_key(stream)) {
            if !capture.into_existing {
                self.graphs.remove(&capture.graph);
            }
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        Ok(capture.graph)
    }

    fn stream_capture_graph(&mut self, stream: StreamRef) -> CuResult<u64> {
        self.check_stream(stream)?;
        self.capturing
            .get(&stream_key(stream))
            .map(|c| c.graph)
            .ok_or(CUDA_ERROR_ILLEGAL_STATE)
    }

    fn stream_update_capture_dependencies(
        &mut self,
        stream: StreamRef,
        nodes: &[u64],
        flags: u32,
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        let capture = self
            .capturing
            .get_mut(&stream_key(stream))
            .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        let held = self
            .graphs
            .get(&capture.graph)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !nodes.iter().all(|n| held.iter().any(|h| h.handle == *n)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match flags {
            // CU_STREAM_ADD_CAPTURE_DEPENDENCIES
            0 => {
                for node in nodes {
                    if !capture.dependencies.contains(node) {
                        capture.dependencies.push(*node);
                    }
                }
            }
            // CU_STREAM_SET_CAPTURE_DEPENDENCIES
            1 => capture.dependencies = nodes.to_vec(),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    fn graph_driver_nodes(&mut self, which: DriverNodes) -> CuResult<Vec<(u64, u32)>> {
        let typed = |nodes: &[SimNode], handles: &[u64]| -> CuResult<Vec<(u64, u32)>> {
            handles
                .iter()
                .map(|h| {
                    nodes
                        .iter()
                        .find(|n| n.handle == *h)
                        .map(|n| (*h, node_type(&n.op)))
                        .ok_or(CUDA_ERROR_INVALID_VALUE)
                })
                .collect()
        };
        match which {
            DriverNodes::Graph { graph, roots } => {
                let nodes = self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                Ok(nodes
                    .iter()
                    .filter(|n| !roots || n.dependencies.is_empty())
                    .map(|n| (n.handle, node_type(&n.op)))
                    .collect())
            }
            DriverNodes::CaptureDependencies(stream) => {
                self.check_stream(stream)?;
                let capture = self
                    .capturing
                    .get(&stream_key(stream))
                    .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
                let nodes = self
                    .graphs
                    .get(&capture.graph)
                    .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                typed(nodes, &capture.dependencies)
            }
            DriverNodes::Edges { node, dependents } => {
                let nodes = self
                    .graphs
                    .values()
                    .find(|nodes| nodes.iter().any(|n| n.handle == node))
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let handles: Vec<u64> = if dependents {
                    nodes
                        .iter()
                        .filter(|n| n.dependencies.contains(&node))
                        .map(|n| n.handle)
                        .collect()
                } else {
                    nodes
                        .iter()
                        .find(|n| n.handle == node)
                        .map(|n| n.dependencies.clone())
                        .unwrap_or_default()
                };
                typed(nodes, &handles)
            }
        }
    }

    fn graph_instantiate(&mut self, graph: u64, _flags: u64) -> CuResult<u64> {
        let nodes = self
            .graphs
            .get(&graph)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let memory: Vec<SimNode> = nodes
            .iter()
            .filter(|n| n.op.is_memory_node())
            .cloned()
            .collect();
        // The driver keeps a graph's allocations with one executable graph.
        if !memory.is_empty() && self.allocations_owner.contains_key(&graph) {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        self.hold_allocations(&memory, true);
        let handle = self.new_handle();
        self.graph_execs.insert(handle, nodes);
        if !memory.is_empty() {
            self.allocations_owner.insert(graph, handle);
        }
        self.exec_allocations.insert(handle, memory);
        Ok(handle)
    }

    fn graph_launch(&mut self, exec: u64, stream: StreamRef) -> CuResult<()> {
        let ops = in_dependency_order(
            self.graph_execs
                .get(&exec)
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?,
        );
        self.check_stream(stream)?;
        self.replay(&ops, stream)
    }

    fn graph_exec_destroy(&mut self, exec: u64) -> CuResult<()> {
        self.graph_execs
            .remove(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let held = self.exec_allocations.remove(&exec).unwrap_or_default();
        self.hold_allocations(&held, false);
        self.allocations_owner.retain(|_, owner| *owner != exec);
        Ok(())
    }

    fn graph_destroy(&mut self, graph: u64) -> CuResult<()> {
        let nodes = self
            .graphs
            .remove(&graph)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.hold_allocations(&nodes, false);
        self.allocations_owner.remove(&graph);
        Ok(())
    }

    fn graph_create(&mut self) -> CuResult<u64> {
        let handle = self.new_handle();
        self.graphs.insert(handle, Vec::new());
        Ok(handle)
    }

    fn graph_add_node(
        &mut self,
        graph: u64,
        dependencies: &[u64],
        node: &GraphNode<'_>,
    ) -> CuResult<u64> {
        let nodes = self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // As the driver: dependencies are nodes of this graph.
        if !dependencies
            .iter()
            .all(|d| nodes.iter().any(|n| n.handle == *d))
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let op = self.graph_op(node)?;
        // As the driver: an allocation is freed once in a graph.
        if let GraphOp::MemFree(dptr) = op {
            if nodes
                .iter()
                .any(|n| matches!(n.op, GraphOp::MemFree(d) if d == dptr))
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        let handle = self.new_handle();
        self.graphs
            .get_mut(&graph)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .push(SimNode {
                handle,
                dependencies: dependencies.to_vec(),
                op,
                disabled: false,
            });
        Ok(handle)
    }

    fn graph_edges(&mut self, graph: u64, from: &[u64], to: &[u64], add: bool) -> CuResult<()> {
        let nodes = self
            .graphs
            .get_mut(&graph)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let known = |n: &u64| nodes.iter().any(|x| x.handle == *n);
        if from.len() != to.len() || !from.iter().chain(to).all(known) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Checked whole before any change, as one call.
        for (f, t) in from.iter().zip(to) {
            let exists = nodes
                .iter()
                .any(|n| n.handle == *t && n.dependencies.contains(f));
            let refused = if add {
                // As the driver: no edge to itself, none that closes a cycle.
                f == t || (!exists && depends_on(nodes, *f, *t))
            } else {
                !exists
            };
            if refused {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        for (f, t) in from.iter().zip(to) {
            if let Some(node) = nodes.iter_mut().find(|n| n.handle == *t) {
                if add && !node.dependencies.contains(f) {
                    node.dependencies.push(*f);
                } else if !add {
                    node.dependencies.retain(|d| d != f);
                }
            }
        }
        Ok(())
    }

    fn graph_destroy_node(&mut self, node: u64) -> CuResult<()> {
        let nodes = self
            .graphs
            .values_mut()
            .find(|nodes| nodes.iter().any(|n| n.handle == node))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if nodes
            .iter()
            .any(|n| n.handle == node && n.op.is_memory_node())
        {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        nodes.retain(|n| n.handle != node);
        for n in nodes.iter_mut() {
            n.dependencies.retain(|d| *d != node);
        }
        Ok(())
    }

    fn graph_clone(&mut self, graph: u64, nodes: &[u64]) -> CuResult<(u64, Vec<u64>)> {
        let original = self
            .graphs
            .get(&graph)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let renamed: HashMap<u64, u64> = original
            .iter()
            .map(|n| (n.handle, self.new_handle()))
            .collect();
        let rename = |old: &u64| renamed.get(old).copied().ok_or(CUDA_ERROR_INVALID_VALUE);
        let found = nodes.iter().map(rename).collect::<CuResult<Vec<u64>>>()?;
        let copy = original
            .into_iter()
            .map(|n| {
                Ok(SimNode {
                    handle: rename(&n.handle)?,
                    dependencies: n.dependencies.iter().map(rename).collect::<CuResult<_>>()?,
                    op: n.op,
                    disabled: n.disabled,
                })
            })
            .collect::<CuResult<Vec<SimNode>>>()?;
        self.hold_allocations(&copy, true);
        let handle = self.new_handle();
        self.graphs.insert(handle, copy);
        Ok((handle, found))
    }

    fn graph_node_set_params(&mut self, node: u64, params: &GraphNode<'_>) -> CuResult<()> {
        let op = self.graph_op(params)?;
        let held = self
            .graphs
            .values_mut()
            .flat_map(|nodes| nodes.iter_mut())
            .find(|n| n.handle == node)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        replace_params(&mut held.op, op)
    }

    fn graph_exec_node_set_params(
        &mut self,
        exec: u64,
        node: u64,
        params: &GraphNode<'_>,
    ) -> CuResult<()> {
        let op = self.graph_op(params)?;
        let held = self.exec_node_any(exec, node)?;
        replace_params(&mut held.op, op)
    }

    fn stream_set_attribute(&mut self, stream: StreamRef, hint: &LaunchHint) -> CuResult<()> {
        self.check_stream(stream)?;
        let words = hint.driver_words(|event| self.event(event).map(|_| event))?;
        self.stream_attributes.set(stream_key(stream), words);
        Ok(())
    }

    fn stream_get_attribute(&mut self, stream: StreamRef, id: u32) -> CuResult<[u32; 16]> {
        self.check_stream(stream)?;
        Ok(self.stream_attributes.get(stream_key(stream), id))
    }

    fn stream_copy_attributes(&mut self, dst: StreamRef, src: StreamRef) -> CuResult<()> {
        self.check_stream(dst)?;
        self.check_stream(src)?;
        self.stream_attributes
            .copy(stream_key(dst), stream_key(src));
        Ok(())
    }

    fn graph_kernel_node_set_attribute(
        &mut self,
        node: u64,
        attribute: &KernelNodeAttribute,
    ) -> CuResult<()> {
        self.kernel_node(node)?;
        self.node_attributes.set(node, attribute.driver_words()?);
        Ok(())
    }

    fn graph_kernel_node_get_attribute(&mut self, node: u64, id: u32) -> CuResult<[u32; 16]> {
        self.kernel_node(node)?;
        Ok(self.node_attributes.get(node, id))
    }

    fn graph_kernel_node_copy_attributes(&mut self, dst: u64, src: u64) -> CuResult<()> {
        self.kernel_node(dst)?;
        self.kernel_node(src)?;
        self.node_attributes.copy(dst, src);
        Ok(())
    }

    fn graph_exec_node_set_enabled(&mut self, exec: u64, node: u64, enabled: bool) -> CuResult<()> {
        let held = self.exec_node(exec, node)?;
        held.disabled = !enabled;
        Ok(())
    }

    fn graph_exec_node_enabled(&mut self, exec: u64, node: u64) -> CuResult<bool> {
        Ok(!self.exec_node(exec, node)?.disabled)
    }

    fn graph_exec_update(&mut self, exec: u64, graph: u64) -> CuResult<ExecUpdate> {
        let new = self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let old = self
            .graph_execs
            .get(&exec)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let failed = |update_result, node: Option<&SimNode>| ExecUpdate {
            result: CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
            update_result,
            error_node: node.map(|n| n.handle),
        };
        if new.len() != old.len() || topology(new) != topology(old) {
            return Ok(failed(exec_update::TOPOLOGY_CHANGED, None));
        }
        if let Some((changed, _)) = new
            .iter()
            .zip(old)
            .find(|(n, o)| std::mem::discriminant(&n.op) != std::mem::discriminant(&o.op))
        {
            return Ok(failed(exec_update::NODE_TYPE_CHANGED, Some(changed)));
        }
        let ops: Vec<GraphOp> = new.iter().map(|n| n.op.clone()).collect();
        let has_memory_nodes = new.iter().any(|n| n.op.is_memory_node());
        // The executable graph also holds the new graph's allocations, which
        // its nodes may now name, and has them as its own.
        let memory: Vec<SimNode> = new
            .iter()
            .filter(|n| matches!(n.op, GraphOp::MemAlloc(_)))
            .cloned()
            .collect();
        if let Some(old) = self.graph_execs.get_mut(&exec) {
            for (node, op) in old.iter_mut().zip(ops) {
                node.op = op;
            }
        }
        let held = self.exec_allocations.entry(exec).or_default();
        let fresh: Vec<SimNode> = memory
            .into_iter()
            .filter(|n| {
                !held.iter().any(|h| match (&h.op, &n.op) {
                    (GraphOp::MemAlloc(a), GraphOp::MemAlloc(b)) => a == b,
                    _ => false,
                })
            })
            .collect();
        held.extend(fresh.iter().cloned());
        self.hold_allocations(&fresh, true);
        if has_memory_nodes {
            // The allocations it had are its graph's to instantiate again.
            self.allocations_owner.retain(|_, owner| *owner != exec);
            self.allocations_owner.insert(graph, exec);
        }
        Ok(ExecUpdate {
            result: CUDA_SUCCESS,
            update_result: exec_update::SUCCESS,
            error_node: None,
        })
    }

    fn graph_add_mem_alloc_node(
        &mut self,
        graph: u64,
        dependencies: &[u64],
        size: u64,
    ) -> CuResult<(u64, u64)> {
        let nodes = self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if size == 0
            || !dependencies
                .iter()
                .all(|d| nodes.iter().any(|n| n.handle == *d))
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dptr = self.allocate(size, Owner::Graph)?;
        self.graph_allocations.insert(dptr, 1);
        let handle = self.new_handle();
        self.graphs
            .get_mut(&graph)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .push(SimNode {
                handle,
                dependencies: dependencies.to_vec(),
                op: GraphOp::MemAlloc(dptr),
                disabled: false,
            });
        Ok((handle, dptr))
    }

    fn graph_mem_trim(&mut self) -> CuResult<()> {
        // Freed memory went back at once.
        Ok(())
    }

    fn graph_upload(&mut self, exec: u64, stream: StreamRef) -> CuResult<()> {
        if !self.graph_execs.contains_key(&exec) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // Nothing to prepare: a launch replays the nodes as they are.
        self.check_stream(stream)
    }

    /// Host memory has no device mapping here: its own address stands in
    /// (the sim's kernels do not reach it).
    fn host_device_pointer(&mut self, host: HostRun) -> CuResult<u64> {
        check_poisoned()?;
        Ok(host.ptr as u64)
    }

    /// The sim's own layout: a magic, the spec's integers and the address
    /// at bytes 8..16, after the driver's documented checks (16-byte
    /// aligned address, dimensions of 1 to 2^32, boxes of 1 to 256 for a
    /// tiled map, element strides of 1 to 8).
    fn tensor_map_encode(&mut self, spec: &TensorMapSpec) -> CuResult<[u8; TENSOR_MAP_BYTES]> {
        check_poisoned()?;
        let rank = spec.rank as usize;
        let dims_ok = spec
            .global_dim
            .iter()
            .take(rank)
            .all(|d| (1..=1 << 32).contains(d));
        let boxes_ok = spec.kind == TensorMapKind::Im2col
            || spec
                .box_dim
                .iter()
                .take(rank)
                .all(|b| (1..=256).contains(b));
        let strides_ok = spec
            .element_strides
            .iter()
            .take(rank)
            .all(|s| (1..=8).contains(s));
        if !spec.global_address.is_multiple_of(16)
            || spec.data_type > 15
            || !dims_ok
            || !boxes_ok
            || !strides_ok
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut map = [0u8; TENSOR_MAP_BYTES];
        let words = [
            SIM_TENSOR_MAP_MAGIC,
            spec.global_address,
            u64::from(spec.kind as u32) | u64::from(spec.data_type) << 32,
            u64::from(spec.rank) | u64::from(spec.swizzle) << 32,
        ]
        .into_iter()
        .chain(spec.global_dim.iter().take(rank).copied());
        for (chunk, word) in map.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Ok(map)
    }

    fn tensor_map_replace_address(
        &mut self,
        map: &[u8; TENSOR_MAP_BYTES],
        address: u64,
    ) -> CuResult<[u8; TENSOR_MAP_BYTES]> {
        check_poisoned()?;
        let magic = map.first_chunk::<8>().map(|b| u64::from_le_bytes(*b));
        if magic != Some(SIM_TENSOR_MAP_MAGIC) || !address.is_multiple_of(16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut out = *map;
        if let Some(slot) = out.get_mut(8..16) {
            slot.copy_from_slice(&address.to_le_bytes());
        }
        Ok(out)
    }

    fn graph_node_count(&mut self, graph: u64, roots: bool) -> CuResult<u64> {
        let nodes = self.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let counted = nodes.iter().filter(|n| !roots || n.dependencies.is_empty());
        Ok(counted.count() as u64)
    }

    /// A handle the tenant's registry records; nothing else is kept (the
    /// session checked that the pointer is memory of this process).
    fn ipc_get_mem_handle(&mut self, device_ptr: u64) -> CuResult<IpcHandle> {
        check_poisoned()?;
        Ok(sim_ipc_handle(
            SIM_IPC_MEM_MAGIC,
            self.executor_id,
            device_ptr,
        ))
    }

    /// Memory of another context of this executor is there already (one
    /// address space): the open answers its allocation, counted. Another
    /// worker's device memory is host memory of its own process: the
    /// fixture cannot map it. The session answers only once the tenant's
    /// registry let the handle through, so this result is what a handle the
    /// registry accepted gets.
    fn ipc_open_mem_handle(&mut self, handle: &IpcHandle, _flags: u32) -> CuResult<(u64, u64)> {
        let Some(object) = sim_ipc_object(SIM_IPC_MEM_MAGIC, self.executor_id, handle) else {
            debug!("sim: an IPC memory handle passed the registry; the fixture cannot open it");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        };
        let (base, (_, size)) = lock_reachable(&self.reachable)
            .allocation(object)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        *self.ipc_opens.entry(base).or_insert(0) += 1;
        self.observer.0.ipc_opens.fetch_add(1, Ordering::SeqCst);
        Ok((base, size))
    }

    fn ipc_close_mem_handle(&mut self, device_ptr: u64) -> CuResult<()> {
        let opens = self
            .ipc_opens
            .get_mut(&device_ptr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        *opens -= 1;
        if *opens == 0 {
            self.ipc_opens.remove(&device_ptr);
        }
        self.observer.0.ipc_opens.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// As the driver: only an event created with `CU_EVENT_INTERPROCESS |
    /// CU_EVENT_DISABLE_TIMING` has a handle.
    fn ipc_get_event_handle(&mut self, event: u64) -> CuResult<IpcHandle> {
        let flags = self.event(event)?.flags;
        let wanted = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
        if flags & wanted != wanted {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(sim_ipc_handle(SIM_IPC_EVENT_MAGIC, self.executor_id, event))
    }

    /// An event of another context of this executor opens as a new event
    /// of this one, which waits for nothing (the other context's records
    /// are not followed: no session test needs them). As for memory,
    /// another process's event is out of the fixture's reach.
    fn ipc_open_event_handle(&mut self, handle: &IpcHandle) -> CuResult<u64> {
        if sim_ipc_object(SIM_IPC_EVENT_MAGIC, self.executor_id, handle).is_none() {
            debug!("sim: an IPC event handle passed the registry; the fixture cannot open it");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        self.event_create(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.global .align 4 .u32 counter;
.global .align 8 .b8 table[64];

.visible .entry rgpu_vector_add(
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_0,
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_1,
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_2,
	.param .u32 rgpu_vector_add_param_3
)
{
	ret;
}
.visible .entry rgpu_scale(
	.param .u64 .ptr .global .align 4 rgpu_scale_param_0,
	.param .f32 rgpu_scale_param_1,
	.param .u32 rgpu_scale_param_2
)
{
	ret;
}
.visible .entry rgpu_fill_index(
	.param .u64 .ptr .global .align 4 rgpu_fill_index_param_0,
	.param .u32 rgpu_fill_index_param_1,
	.param .u32 rgpu_fill_index_param_2
)
{
	ret;
}
.visible .entry rgpu_empty()
{
	ret;
}
.visible .entry mystery(.param .u32 a)
{
	ret;
}
.visible .entry rgpu_scale_wrong(.param .u64 a)
{
	ret;
}
"#;

    fn context() -> Box<dyn ContextExecutor> {
        SimExecutor::new().create_context(0).unwrap()
    }

    fn run(buf: &mut [u8]) -> HostRun {
        HostRun {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn read_back(ctx: &mut dyn ContextExecutor, ptr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        ctx.memcpy_dtoh(StreamRef::Legacy, &[run(&mut out)], ptr, true)
            .unwrap();
        out
    }

    fn params(values: &[&[u8]], info: &FunctionInfo) -> Vec<u8> {
        let mut buf = vec![0u8; info.buffer_size()];
        for (value, slot) in values.iter().zip(&info.params) {
            buf[slot.offset as usize..][..value.len()].copy_from_slice(value);
        }
        buf
    }

    #[test]
    fn describes_the_fixture_device() {
        let sim = SimExecutor::new();
        assert_eq!(sim.kind(), "sim");
        assert_eq!(sim.driver_version(), 13000);
        let devices = sim.devices();
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(d.name, SIM_DEVICE_NAME);
        assert_eq!(d.uuid, SIM_UUID);
        assert_eq!(d.total_mem, 16 << 30);
        assert_eq!(d.attributes.len(), ATTRIBUTE_SLOTS);
        use rgpu_proto::capset::device_attribute as a;
        assert_eq!(d.attribute(a::MAX_THREADS_PER_BLOCK), Some(1024));
        assert_eq!(d.attribute(a::MULTIPROCESSOR_COUNT), Some(132));
        assert_eq!(d.attribute(a::COMPUTE_CAPABILITY_MAJOR), Some(9));
        assert_eq!(d.attribute(0), None);
        assert_eq!(d.attribute(150), None); // "error 1" in the table
        assert!(sim.create_context(1).is_err());
    }

    #[test]
    fn attribute_table_parsing_tolerates_junk() {
        let parsed = parse_attributes("1\t5\n2\terror 1\nx\t3\n999\t1\n\n3\n4\t-7\r\n");
        assert_eq!(parsed[1], 5);
        assert_eq!(parsed[2], ATTRIBUTE_UNSUPPORTED);
        assert_eq!(parsed[3], ATTRIBUTE_UNSUPPORTED);
        assert_eq!(parsed[4], -7);
    }

    #[test]
    fn alloc_free_and_ranges() {
        let mut ctx = context();
        let a = ctx.mem_alloc(1000).unwrap();
        let b = ctx.mem_alloc(1).unwrap();
        assert_eq!(a, BASE_ADDRESS);
        assert_eq!(a % ALLOC_ALIGN, 0);
        assert_eq!(b % ALLOC_ALIGN, 0);
        assert!(b >= a + 1000);
        assert_eq!(ctx.mem_alloc(0), Err(CUDA_ERROR_INVALID_VALUE));
        let (free, total) = ctx.mem_get_info().unwrap();
        assert_eq!(total, SIM_TOTAL_MEM);
        assert_eq!(free, SIM_TOTAL_MEM - 1024 - 256);

        let mut data = vec![7u8; 1000];
        // Inside, at the end, past the end, before the start, in a gap.
        ctx.memcpy_htod(StreamRef::Legacy, a, &[run(&mut data)], true)
            .unwrap();
        let mut four = [1u8; 4];
        ctx.memcpy_htod(StreamRef::Legacy, a + 996, &[run(&mut four)], true)
            .unwrap();
        for bad in [a + 997, a - 1, a + 1000, b + 1, u64::MAX - 1] {
            assert_eq!(
                ctx.memcpy_htod(StreamRef::Legacy, bad, &[run(&mut four)], true),
                Err(CUDA_ERROR_INVALID_VALUE),
                "{bad:#x}"
            );
        }
        assert_eq!(
            ctx.memcpy_dtod(StreamRef::Legacy, b, a, 2),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        // Freed memory is gone and its address is not handed out again.
        ctx.mem_free(a).unwrap();
        assert_eq!(ctx.mem_free(a), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ctx.mem_free(b + 1), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(
            ctx.memcpy_htod(StreamRef::Legacy, a, &[run(&mut four)], true),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        let c = ctx.mem_alloc(16).unwrap();
        assert!(c > b);
        assert_eq!(ctx.mem_get_info().unwrap().0, SIM_TOTAL_MEM - 512);
    }

    #[test]
    fn device_status_follows_the_shared_memory_accounting() {
        let sim = SimExecutor::new();
        let idle = sim.device_status(0).unwrap();
        assert_eq!(
            idle,
            DeviceStatus {
                free: SIM_TOTAL_MEM,
                total: SIM_TOTAL_MEM,
                gpu_utilization: Some(SIM_GPU_UTILIZATION),
                memory_utilization: Some(SIM_MEMORY_UTILIZATION),
                driver_version: SIM_DRIVER_VERSION_STRING.to_owned(),
            }
        );
        let mut ctx = sim.create_context(0).unwrap();
        ctx.mem_alloc(1000).unwrap();
        assert_eq!(sim.device_status(0).unwrap().free, SIM_TOTAL_MEM - 1024);
        drop(ctx);
        assert_eq!(sim.device_status(0).unwrap().free, SIM_TOTAL_MEM);
        assert_eq!(sim.device_status(1), Err(CUDA_ERROR_INVALID_DEVICE));
    }

    #[test]
    fn memory_is_capped_and_shared_between_contexts() {
        // 4 GiB pieces: calloc'd lazily, so no memory is touched, and each
        // stays below what a small machine's overcommit check allows.
        let sim = SimExecutor::new();
        let mut one = sim.create_context(0).unwrap();
        let mut two = sim.create_context(0).unwrap();
        for _ in 0..3 {
            one.mem_alloc(4 << 30).unwrap();
        }
        assert_eq!(two.mem_alloc((4 << 30) + 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(two.mem_alloc(u64::MAX), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(two.mem_get_info().unwrap().0, 4 << 30);
        let last = two.mem_alloc(4 << 30).unwrap();
        assert_eq!(one.mem_alloc(1), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(one.mem_get_info().unwrap(), (0, SIM_TOTAL_MEM));
        two.mem_free(last).unwrap();
        assert_eq!(two.mem_get_info().unwrap().0, 4 << 30);
        // Dropping a context gives its memory back.
        drop(one);
        assert_eq!(two.mem_get_info().unwrap().0, SIM_TOTAL_MEM);
    }

    #[test]
    fn contexts_of_one_executor_never_share_an_address() {
        let sim = SimExecutor::new();
        let mut one = sim.create_context(0).unwrap();
        let mut two = sim.create_context(0).unwrap();
        let a = one.mem_alloc(1000).unwrap();
        let b = two.mem_alloc(1000).unwrap();
        assert_eq!(a, BASE_ADDRESS);
        assert!(b >= a + 1000, "{a:#x} {b:#x}");
        // One address space, as with the driver's unified addressing: a
        // copy of one context reaches the other's allocation.
        let mut four = [1u8; 4];
        assert_eq!(
            two.memcpy_htod(StreamRef::Legacy, a, &[run(&mut four)], true),
            Ok(())
        );
        assert_eq!(read_back(one.as_mut(), a, 4), [1; 4]);
    }

    #[test]
    fn copies_through_several_runs() {
        let mut ctx = context();
        let dev = ctx.mem_alloc(4096).unwrap();
        let mut a: Vec<u8> = (0..100).collect();
        let mut b: Vec<u8> = (100..103).collect();
        let mut empty: Vec<u8> = Vec::new();
        let mut c: Vec<u8> = (200..250).collect();
        ctx.memcpy_htod(
            StreamRef::PerThread,
            dev + 10,
            &[run(&mut a), run(&mut b), run(&mut empty), run(&mut c)],
            true,
        )
        .unwrap();
        let mut x = vec![0u8; 7];
        let mut y = vec![0u8; 153];
        ctx.memcpy_dtoh(
            StreamRef::Legacy,
            &[run(&mut x), run(&mut y)],
            dev + 3,
            true,
        )
        .unwrap();
        let mut all = x.clone();
        all.extend_from_slice(&y);
        let mut expected = vec![0u8; 7];
        expected.extend(0u8..103);
        expected.extend(200u8..250);
        assert_eq!(all, expected);

        // Device to device, within one allocation and overlapping.
        ctx.memcpy_dtod(StreamRef::Legacy, dev + 11, dev + 10, 4)
            .unwrap();
        assert_eq!(read_back(ctx.as_mut(), dev + 10, 5), [0, 0, 1, 2, 3]);
        let other = ctx.mem_alloc(8).unwrap();
        ctx.memcpy_dtod(StreamRef::Legacy, other, dev + 12, 8)
            .unwrap();
        assert_eq!(read_back(ctx.as_mut(), other, 8), [1, 2, 3, 5, 6, 7, 8, 9]);
        assert_eq!(
            ctx.memcpy_dtoh(StreamRef::Legacy, &[run(&mut y)], other, true),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn memset_of_each_width() {
        let mut ctx = context();
        let dev = ctx.mem_alloc(16).unwrap();
        ctx.memset(StreamRef::Legacy, dev, 0xAB, 1, 16).unwrap();
        ctx.memset(StreamRef::Legacy, dev + 2, 0x1234, 2, 2)
            .unwrap();
        ctx.memset(StreamRef::Legacy, dev + 8, 0xDEAD_BEEF, 4, 1)
            .unwrap();
        assert_eq!(
            read_back(ctx.as_mut(), dev, 16),
            [
                0xAB, 0xAB, 0x34, 0x12, 0x34, 0x12, 0xAB, 0xAB, 0xEF, 0xBE, 0xAD, 0xDE, 0xAB, 0xAB,
                0xAB, 0xAB
            ]
        );
        let bad = CUDA_ERROR_INVALID_VALUE;
        assert_eq!(ctx.memset(StreamRef::Legacy, dev + 1, 0, 2, 1), Err(bad));
        assert_eq!(ctx.memset(StreamRef::Legacy, dev, 0, 4, 5), Err(bad));
        assert_eq!(ctx.memset(StreamRef::Legacy, dev, 0, 3, 1), Err(bad));
        assert_eq!(ctx.memset(StreamRef::Legacy, dev, 0, 4, u64::MAX), Err(bad));
        assert_eq!(
            ctx.memset(StreamRef::Created(99), dev, 0, 1, 1),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
    }

    #[test]
    fn reference_kernels_compute() {
        let mut ctx = context();
        let module = ctx.module_load(REFERENCE_PTX.as_bytes()).unwrap();
        let n = 1000usize;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
        let (da, db, dc) = (
            ctx.mem_alloc(4 * n as u64).unwrap(),
            ctx.mem_alloc(4 * n as u64).unwrap(),
            ctx.mem_alloc(4 * n as u64).unwrap(),
        );
        let (mut ha, mut hb) = (f32s(&a), f32s(&b));
        ctx.memcpy_htod(StreamRef::Legacy, da, &[run(&mut ha)], true)
            .unwrap();
        ctx.memcpy_htod(StreamRef::Legacy, db, &[run(&mut hb)], true)
            .unwrap();

        let (add, info) = ctx.module_get_function(module, "rgpu_vector_add").unwrap();
        assert_eq!(info.buffer_size(), 28);
        let p = params(
            &[
                &da.to_le_bytes(),
                &db.to_le_bytes(),
                &dc.to_le_bytes(),
                &(n as u32).to_le_bytes(),
            ],
            &info,
        );
        ctx.launch_kernel(add, [4, 1, 1], [256, 1, 1], 0, StreamRef::Legacy, p.clone())
            .unwrap();
        let c = read_back(ctx.as_mut(), dc, 4 * n);
        let expected: Vec<f32> = (0..n).map(|i| 1.5 * i as f32).collect();
        assert_eq!(c, f32s(&expected));

        let stream = ctx.stream_create(0, 0).unwrap();
        let (scale, info) = ctx.module_get_function(module, "rgpu_scale").unwrap();
        let p = params(
            &[
                &dc.to_le_bytes(),
                &2.0f32.to_le_bytes(),
                &(n as u32).to_le_bytes(),
            ],
            &info,
        );
        // Fewer threads than elements: only the first 100 change.
        ctx.launch_kernel(
            scale,
            [10, 1, 1],
            [10, 1, 1],
            0,
            StreamRef::Created(stream),
            p,
        )
        .unwrap();
        let c = read_back(ctx.as_mut(), dc, 4 * n);
        let expected: Vec<f32> = (0..n)
            .map(|i| {
                if i < 100 {
                    3.0 * i as f32
                } else {
                    1.5 * i as f32
                }
            })
            .collect();
        assert_eq!(c, f32s(&expected));

        let (fill, info) = ctx.module_get_function(module, "rgpu_fill_index").unwrap();
        let p = params(
            &[&da.to_le_bytes(), &7u32.to_le_bytes(), &5u32.to_le_bytes()],
            &info,
        );
        ctx.launch_kernel(
            fill,
            [1, 2, 1],
            [2, 2, 2],
            0,
            StreamRef::PerThread,
            p.clone(),
        )
        .unwrap();
        let out = read_back(ctx.as_mut(), da, 24);
        let expected: Vec<u8> = [7u32, 8, 9, 10, 11]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .chain(f32s(&[5.0]))
            .collect();
        assert_eq!(out, expected);

        let (empty, info) = ctx.module_get_function(module, "rgpu_empty").unwrap();
        assert!(info.params.is_empty());
        ctx.launch_kernel(
            empty,
            [1, 1, 1],
            [1, 1, 1],
            0,
            StreamRef::Legacy,
            Vec::new(),
        )
        .unwrap();
    }

    /// The PTX the C tests ship, the same text a real GPU JIT-compiles.
    const SHIPPED_PTX: &str = include_str!("../../tests/programs/reference_kernels.ptx");

    #[test]
    fn count_mismatches_counts_on_the_device() {
        let mut ctx = context();
        let module = ctx.module_load(SHIPPED_PTX.as_bytes()).unwrap();
        let n = 1000u32;
        let data = ctx.mem_alloc(4 * u64::from(n)).unwrap();
        let counter = ctx.mem_alloc(4).unwrap();
        let mut values: Vec<u8> = (0..n).flat_map(|i| (100 + i).to_le_bytes()).collect();
        // Two wrong values.
        values[40..44].copy_from_slice(&0u32.to_le_bytes());
        values[400..404].copy_from_slice(&7u32.to_le_bytes());
        let mut host = values.clone();
        let src = [run(&mut host)];
        ctx.memcpy_htod(StreamRef::Legacy, data, &src, true)
            .unwrap();
        ctx.memset(StreamRef::Legacy, counter, 0, 4, 1).unwrap();
        let (kernel, info) = ctx
            .module_get_function(module, "rgpu_count_mismatches")
            .unwrap();
        let p = params(
            &[
                &data.to_le_bytes(),
                &100u32.to_le_bytes(),
                &n.to_le_bytes(),
                &counter.to_le_bytes(),
            ],
            &info,
        );
        ctx.launch_kernel(
            kernel,
            [4, 1, 1],
            [256, 1, 1],
            0,
            StreamRef::Legacy,
            p.clone(),
        )
        .unwrap();
        assert_eq!(read_back(ctx.as_mut(), counter, 4), 2u32.to_le_bytes());
    }

    #[test]
    fn launch_errors() {
        let mut ctx = context();
        let module = ctx.module_load(REFERENCE_PTX.as_bytes()).unwrap();
        let dev = ctx.mem_alloc(16).unwrap();
        let (fill, info) = ctx.module_get_function(module, "rgpu_fill_index").unwrap();
        let ok = params(
            &[&dev.to_le_bytes(), &0u32.to_le_bytes(), &4u32.to_le_bytes()],
            &info,
        );
        let launch = |ctx: &mut dyn ContextExecutor, f, grid, block, p: &[u8]| {
            ctx.launch_kernel(f, grid, block, 0, StreamRef::Legacy, p.to_vec())
        };
        assert_eq!(
            launch(ctx.as_mut(), fill, [1, 1, 1], [4, 1, 1], &ok),
            Ok(())
        );
        let inval = Err(CUDA_ERROR_INVALID_VALUE);
        // Geometry: zero dimensions, too many threads per block.
        assert_eq!(launch(ctx.as_mut(), fill, [0, 1, 1], [4, 1, 1], &ok), inval);
        assert_eq!(
            launch(ctx.as_mut(), fill, [1, 1, 1], [1024, 2, 1], &ok),
            inval
        );
        assert_eq!(
            launch(ctx.as_mut(), fill, [1, 1, 1], [1, 1, 65], &ok),
            inval
        );
        // A parameter buffer shorter than the layout.
        assert_eq!(
            launch(ctx.as_mut(), fill, [1, 1, 1], [4, 1, 1], &ok[..10]),
            inval
        );
        // Writing past the allocation is an illegal address, as on a GPU.
        let long = params(
            &[&dev.to_le_bytes(), &0u32.to_le_bytes(), &5u32.to_le_bytes()],
            &info,
        );
        assert_eq!(
            launch(ctx.as_mut(), fill, [1, 1, 1], [8, 1, 1], &long),
            Err(CUDA_ERROR_ILLEGAL_ADDRESS)
        );
        // Unknown kernel, and a reference name with the wrong layout.
        let (mystery, _) = ctx.module_get_function(module, "mystery").unwrap();
        let four = [0u8; 4];
        for _ in 0..2 {
            assert_eq!(
                launch(ctx.as_mut(), mystery, [1, 1, 1], [1, 1, 1], &four),
                Err(CUDA_ERROR_NOT_SUPPORTED)
            );
        }
        assert_eq!(
            ctx.module_get_function(module, "nope"),
            Err(CUDA_ERROR_NOT_FOUND)
        );
        let renamed = REFERENCE_PTX
            .replace("rgpu_scale_wrong", "rgpu_scale2")
            .replace("rgpu_scale(", "rgpu_unused(")
            .replace("rgpu_scale2", "rgpu_scale");
        let module2 = ctx.module_load(renamed.as_bytes()).unwrap();
        let (wrong, _) = ctx.module_get_function(module2, "rgpu_scale").unwrap();
        assert_eq!(
            launch(ctx.as_mut(), wrong, [1, 1, 1], [1, 1, 1], &[0u8; 8]),
            inval
        );
        // Handles: unknown function, stream; unloaded module's functions.
        assert_eq!(
            launch(ctx.as_mut(), 12345, [1, 1, 1], [1, 1, 1], &ok),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            ctx.launch_kernel(
                fill,
                [1, 1, 1],
                [1, 1, 1],
                0,
                StreamRef::Created(fill),
                ok.clone()
            ),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        ctx.module_unload(module).unwrap();
        assert_eq!(
            launch(ctx.as_mut(), fill, [1, 1, 1], [4, 1, 1], &ok),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(ctx.module_unload(module), Err(CUDA_ERROR_INVALID_HANDLE));
    }

    #[test]
    fn function_attributes_and_occupancy() {
        let mut ctx = context();
        let module = ctx.module_load(REFERENCE_PTX.as_bytes()).unwrap();
        let (f, _) = ctx.module_get_function(module, "rgpu_empty").unwrap();
        assert_eq!(ctx.occupancy_max_active_blocks(f, 256, 0, 0), Ok(8));
        assert_eq!(
            ctx.occupancy_max_active_blocks(f, 256, 0, 2),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        // More dynamic shared memory than the function allows: no block fits
        // until the function is allowed more.
        assert_eq!(ctx.occupancy_max_active_blocks(f, 128, 100_000, 0), Ok(0));
        ctx.func_set_attribute(f, 8, 100_000).unwrap();
        assert_eq!(ctx.func_get_attribute(f, 8), Ok(100_000));
        assert_eq!(ctx.occupancy_max_active_blocks(f, 128, 100_000, 0), Ok(2));
        // Read-only attributes and out-of-range values are refused.
        assert_eq!(
            ctx.func_set_attribute(f, 4, 32),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            ctx.func_set_attribute(f, 8, 300_000),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            ctx.func_set_attribute(f, 9, 101),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            ctx.func_set_attribute(f + 100, 8, 0),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(ctx.occupancy_available_dynamic_smem(f, 4, 128), Ok(57344));
        let query = |cluster: [u32; 3]| ClusterQuery {
            function: 0,
            grid: [16, 1, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 0,
            cluster,
        };
        assert_eq!(
            ctx.occupancy_max_active_clusters(f, &query([2, 1, 1])),
            Ok(1024)
        );
        assert_eq!(
            ctx.occupancy_max_active_clusters(f, &query([0, 0, 0])),
            Ok(2048)
        );
        assert_eq!(
            ctx.occupancy_max_active_clusters(f, &query([16, 1, 1])),
            Err(CUDA_ERROR_INVALID_CLUSTER_SIZE)
        );
        ctx.func_set_attribute(f, 14, 1).unwrap();
        assert_eq!(
            ctx.occupancy_max_active_clusters(f, &query([16, 1, 1])),
            Ok(128)
        );
    }

    #[test]
    fn modules_functions_and_globals() {
        let mut ctx = context();
        let free_before = ctx.mem_get_info().unwrap().0;
        let module = ctx.module_load(REFERENCE_PTX.as_bytes()).unwrap();
        let (counter, size) = ctx.module_get_global(module, "counter").unwrap();
        assert_eq!(size, 4);
        let (table, size) = ctx.module_get_global(module, "table").unwrap();
        assert_eq!(size, 64);
        assert_eq!(read_back(ctx.as_mut(), table, 64), vec![0u8; 64]);
        ctx.memset(StreamRef::Legacy, counter, 41, 4, 1).unwrap();
        assert_eq!(read_back(ctx.as_mut(), counter, 4), 41u32.to_le_bytes());
        // A module's memory is not the guest's to free.
        assert_eq!(ctx.mem_free(counter), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(
            ctx.module_get_global(module, "nope"),
            Err(CUDA_ERROR_NOT_FOUND)
        );
        assert_eq!(
            ctx.module_get_global(module + 100, "counter"),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        // The same name gives the same function handle.
        let (f1, _) = ctx.module_get_function(module, "rgpu_empty").unwrap();
        let (f2, _) = ctx.module_get_function(module, "rgpu_empty").unwrap();
        assert_eq!(f1, f2);
        assert_eq!(ctx.func_get_attribute(f1, 0), Ok(1024));
        assert_eq!(ctx.func_get_attribute(f1, 1), Ok(0));
        assert_eq!(ctx.func_get_attribute(f1, 4), Ok(16));
        assert_eq!(
            ctx.func_get_attribute(f1, 99),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            ctx.func_get_attribute(module, 0),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        ctx.module_unload(module).unwrap();
        assert_eq!(ctx.mem_get_info().unwrap().0, free_before);
        assert_eq!(
            ctx.memset(StreamRef::Legacy, counter, 0, 4, 1),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn module_images_other_than_ptx_are_refused() {
        let mut ctx = context();
        let mut cubin = vec![0u8; 64];
        cubin[..4].copy_from_slice(b"\x7fELF");
        cubin[4] = 2;
        cubin[5] = 1;
        assert_eq!(ctx.module_load(&cubin), Err(CUDA_ERROR_INVALID_IMAGE));
        assert_eq!(ctx.module_load(b"garbage"), Err(CUDA_ERROR_INVALID_IMAGE));
        assert_eq!(
            ctx.module_load(b".version 9.0\n.entry k( {"),
            Err(CUDA_ERROR_INVALID_PTX)
        );
        let mut terminated = REFERENCE_PTX.as_bytes().to_vec();
        terminated.push(0);
        assert!(ctx.module_load(&terminated).is_ok());
    }

    #[test]
    fn streams_and_events() {
        let mut ctx = context();
        let s = ctx.stream_create(1, -1).unwrap();
        let start = ctx.event_create(0).unwrap();
        let end = ctx.event_create(0).unwrap();
        let untimed = ctx.event_create(CU_EVENT_DISABLE_TIMING).unwrap();
        let handle = Err(CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(ctx.event_elapsed_time(start, end), handle.map(|()| 0.0));
        ctx.event_record(start, StreamRef::Created(s)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        ctx.event_record(end, StreamRef::Legacy).unwrap();
        ctx.event_record(untimed, StreamRef::Legacy).unwrap();
        let ms = ctx.event_elapsed_time(start, end).unwrap();
        assert!((20.0..2000.0).contains(&ms), "{ms}");
        assert!(ctx.event_elapsed_time(end, start).unwrap() < 0.0);
        assert_eq!(ctx.event_elapsed_time(start, untimed), handle.map(|()| 0.0));
        assert_eq!(ctx.event_synchronize(end), Ok(()));
        assert_eq!(ctx.event_query(end), Ok(()));
        assert_eq!(ctx.stream_query(StreamRef::Created(s)), Ok(()));
        assert_eq!(ctx.stream_synchronize(StreamRef::PerThread), Ok(()));
        assert_eq!(ctx.stream_wait_event(StreamRef::Created(s), end, 0), Ok(()));
        assert_eq!(ctx.stream_wait_event(StreamRef::Created(s), s, 0), handle);
        // An event handle is no stream and vice versa.
        assert_eq!(ctx.stream_synchronize(StreamRef::Created(end)), handle);
        assert_eq!(ctx.event_query(s), handle);
        ctx.stream_destroy(s).unwrap();
        assert_eq!(ctx.stream_destroy(s), handle);
        assert_eq!(ctx.stream_query(StreamRef::Created(s)), handle);
        ctx.event_destroy(end).unwrap();
        assert_eq!(ctx.event_destroy(end), handle);
        assert_eq!(ctx.event_record(end, StreamRef::Legacy), handle);
        assert_eq!(ctx.event_elapsed_time(start, end), handle.map(|()| 0.0));
        assert_eq!(ctx.synchronize(), Ok(()));
    }

    #[test]
    fn limits_are_kept_per_context() {
        let mut ctx = context();
        assert_eq!(ctx.get_limit(0), Ok(1024));
        assert_eq!(ctx.get_limit(1), Ok(1 << 20));
        assert_eq!(ctx.get_limit(2), Ok(8 << 20));
        ctx.set_limit(0, 4096).unwrap();
        ctx.set_limit(2, 64 << 20).unwrap();
        assert_eq!(ctx.get_limit(0), Ok(4096));
        assert_eq!(ctx.get_limit(2), Ok(64 << 20));
        assert_eq!(ctx.set_limit(8, 1), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ctx.get_limit(42), Err(CUDA_ERROR_UNSUPPORTED_LIMIT));
        assert_eq!(ctx.set_limit(42, 1), Err(CUDA_ERROR_UNSUPPORTED_LIMIT));
        assert_eq!(context().get_limit(0), Ok(1024));
    }

    #[test]
    fn registered_host_memory_is_reachable_by_its_host_address_until_unregistered() {
        // As with the driver's unified addressing: this is what the
        // sessions' pointer checks must keep guests from.
        let executor = SimExecutor::new();
        let mut ctx = executor.create_context(0).unwrap();
        let mut buf = vec![0u8; 64];
        let address = buf.as_ptr() as u64;
        let mut data = [9u8; 16];
        assert_eq!(
            ctx.memcpy_htod(StreamRef::Legacy, address, &[run(&mut data)], true),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(executor.register_host_memory(run(&mut buf)), Ok(()));
        ctx.memcpy_htod(StreamRef::Legacy, address + 8, &[run(&mut data)], true)
            .unwrap();
        ctx.memset(StreamRef::Legacy, address + 60, 0x0403_0201, 4, 1)
            .unwrap();
        let mut back = [0u8; 4];
        ctx.memcpy_dtoh(StreamRef::Legacy, &[run(&mut back)], address + 8, true)
            .unwrap();
        assert_eq!(back, [9; 4]);
        assert_eq!(
            ctx.memcpy_dtoh(StreamRef::Legacy, &[run(&mut back)], address + 61, true),
            Err(CUDA_ERROR_INVALID_VALUE),
            "past the registered run"
        );
        executor.unregister_host_memory(run(&mut buf));
        assert_eq!(
            ctx.memcpy_dtoh(StreamRef::Legacy, &[run(&mut back)], address, true),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(&buf[8..24], &[9; 16]);
        assert_eq!(&buf[60..], &[1, 2, 3, 4]);
    }

    #[test]
    fn ipc_handles_are_distinct_and_open_within_their_executor_only() {
        let executor = SimExecutor::new();
        let observer = executor.observer();
        let mut ctx = executor.create_context(0).unwrap();
        let mut other = executor.create_context(0).unwrap();
        let ptr = ctx.mem_alloc(4096).unwrap();
        let (one, two) = (
            ctx.ipc_get_mem_handle(ptr + 16).unwrap(),
            ctx.ipc_get_mem_handle(ptr).unwrap(),
        );
        assert_eq!(&one[..16], SIM_IPC_MEM_MAGIC);
        assert_ne!(one, two, "unpredictable bytes");
        // Another context of the executor: the allocation, where it is.
        assert_eq!(other.ipc_open_mem_handle(&one, 1), Ok((ptr, 4096)));
        assert_eq!(other.ipc_open_mem_handle(&two, 1), Ok((ptr, 4096)));
        assert_eq!(observer.ipc_opens(), 2);
        assert_eq!(other.ipc_close_mem_handle(ptr), Ok(()));
        assert_eq!(observer.ipc_opens(), 1);
        drop(other);
        assert_eq!(observer.ipc_opens(), 0, "closed with its context");
        assert_eq!(ctx.ipc_close_mem_handle(ptr), Err(CUDA_ERROR_INVALID_VALUE));
        // Another executor's (another worker process's) handle.
        let mut stranger = SimExecutor::new().create_context(0).unwrap();
        assert_eq!(
            stranger.ipc_open_mem_handle(&one, 1),
            Err(CUDA_ERROR_NOT_SUPPORTED)
        );
        // Only an interprocess event without timing has a handle.
        let plain = ctx.event_create(CU_EVENT_DISABLE_TIMING).unwrap();
        assert_eq!(
            ctx.ipc_get_event_handle(plain),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        let shared = ctx
            .event_create(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)
            .unwrap();
        let handle = ctx.ipc_get_event_handle(shared).unwrap();
        assert_eq!(&handle[..16], SIM_IPC_EVENT_MAGIC);
        let mut other = executor.create_context(0).unwrap();
        let opened = other.ipc_open_event_handle(&handle).unwrap();
        assert_eq!(other.event_synchronize(opened), Ok(()));
        assert_eq!(
            stranger.ipc_open_event_handle(&handle),
            Err(CUDA_ERROR_NOT_SUPPORTED)
        );
    }

    #[test]
    fn contexts_reach_each_others_memory_until_it_is_freed() {
        let executor = SimExecutor::new();
        let observer = executor.observer();
        let mut owner = executor.create_context(0).unwrap();
        let mut other = executor.create_context(0).unwrap();
        assert_eq!(
            (observer.contexts_created(), observer.live_contexts()),
            (2, 2)
        );
        let ptr = owner.mem_alloc(64).unwrap();
        other
            .memset(StreamRef::Legacy, ptr + 8, 0x5a, 1, 4)
            .unwrap();
        assert_eq!(read_back(owner.as_mut(), ptr + 8, 4), [0x5a; 4]);
        owner.mem_free(ptr).unwrap();
        assert_eq!(
            other.memset(StreamRef::Legacy, ptr, 0, 1, 4),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        let kept = owner.mem_alloc(64).unwrap();
        drop(owner);
        assert_eq!(observer.live_contexts(), 1);
        assert_eq!(
            other.memset(StreamRef::Legacy, kept, 0, 1, 4),
            Err(CUDA_ERROR_INVALID_VALUE),
            "gone with its context"
        );
        observer.fail_context_creation(Some(CUDA_ERROR_OUT_OF_MEMORY));
        assert!(matches!(
            executor.create_context(0),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        ));
        observer.fail_context_creation(None);
        assert!(executor.create_context(0).is_ok());
        assert_eq!(observer.contexts_created(), 3);
    }
}

//! CUDA graphs by stream capture: the capture happens on the host, where
//! NVIDIA's driver records what the session's stream is given between
//! `cuStreamBeginCapture` and `cuStreamEndCapture` into a real graph; the
//! guest holds handles (chosen by it, as for streams and events) to that
//! graph and its executable form, and `cuGraphLaunch` replays it with one
//! command. Begin, end and instantiate wait for the host (their errors are
//! the driver's); launch and destroy are queued.
//!
//! Graphs built node by node (`cuGraphCreate`, `cuGraphAdd*Node`,
//! `cuGraphClone`) are built on the host too, one command per call (each
//! waits, so the driver's errors come back at the call): nodes get handles
//! chosen here; the host checks that a dependency is a node of the same
//! graph and that what a node names (function and parameters, memory,
//! events, child graph) passes the checks of the matching launch, memset,
//! copy or event call. The guest keeps each graph's nodes, their types,
//! dependencies and (kernel and memset nodes) parameters as last set, and
//! answers `cuGraphGetNodes`, `cuGraphNodeGetType`, the dependency queries
//! and `Get*Params` itself; setting parameters, `cuGraphExecUpdate` and
//! `cuGraphUpload` are one waiting command each.
//!
//! The guest also remembers which of its streams capture, for
//! `cuStreamIsCapturing` and `cuStreamGetCaptureInfo` (answered locally):
//! the stream a capture began on, until it ends. A stream that joins a
//! capture by waiting on a captured event is not tracked (the host driver
//! captures its work all the same).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use rgpu_proto::command::{name_nodes, Launch, MAX_NODE_DEPENDENCIES};
use rgpu_proto::reply::{decode_u64s, decode_value_union, FunctionInfo};

use crate::abi::{write_optional, write_out, CUdeviceptr, CUevent, CUfunction, CUstream};
use crate::api::context::same_context;
use crate::api::library::function_or_kernel;
use crate::device_ranges;
use crate::host_functions::GateAddresses;
use crate::params::marshal;
use crate::pinned::{self, Unreachable};
use crate::state::{current, driver, resolve_stream, Context, Registry};
use rgpu_proto::command::{Copy3D, PitchedSide};

pub(crate) type CUgraph = *mut c_void;
pub(crate) type CUgraphExec = *mut c_void;
pub(crate) type CUgraphNode = *mut c_void;

/// `CUgraphNodeType`.
const NODE_KERNEL: c_int = 0;
const NODE_MEMCPY: c_int = 1;
const NODE_MEMSET: c_int = 2;
const NODE_HOST: c_int = 3;
const NODE_GRAPH: c_int = 4;
const NODE_EMPTY: c_int = 5;
const NODE_WAIT_EVENT: c_int = 6;
const NODE_EVENT_RECORD: c_int = 7;
const NODE_MEM_ALLOC: c_int = 10;
const NODE_MEM_FREE: c_int = 11;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE` and
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`: the only memory-allocation node
/// the host makes is pinned memory of the context's device, read-write for
/// that device alone.
const ALLOCATION_TYPE_PINNED: c_uint = 1;
const LOCATION_TYPE_DEVICE: c_uint = 1;
const ACCESS_READ_WRITE: c_uint = 3;
/// Most access descriptors a memory-allocation node is read with (one per
/// device is all that means anything).
const MAX_ACCESS_DESCS: usize = 64;

/// `CU_MEMORYTYPE_*` of a memcpy node's sides: host memory (page-locked
/// only: its address is a device address), device memory and unified
/// addresses; arrays are not offered.
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;
const MEMORYTYPE_UNIFIED: c_uint = 4;

/// `CUDA_KERNEL_NODE_PARAMS` (`_v2`; v1 is its first nine fields).
#[repr(C)]
pub struct KernelNodeParams {
    func: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    kern: *mut c_void,
    ctx: *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v1`.
#[repr(C)]
pub struct KernelNodeParamsV1 {
    func: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

impl KernelNodeParamsV1 {
    /// The same parameters in the `_v2` struct (no `CUkernel`, no context).
    fn to_v2(&self) -> KernelNodeParams {
        KernelNodeParams {
            func: self.func,
            grid: self.grid,
            block: self.block,
            shared_mem_bytes: self.shared_mem_bytes,
            kernel_params: self.kernel_params,
            extra: self.extra,
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AccessDescRaw {
    location_type: c_uint,
    location_id: c_int,
    flags: c_uint,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`, which `cuGraphAddMemAllocNode`
/// takes): `CUmemPoolProps`, the access descriptors, the size and the
/// device pointer the call writes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocNodeParams {
    alloc_type: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
    access_descs: *const AccessDescRaw,
    access_desc_count: usize,
    bytesize: usize,
    dptr: CUdeviceptr,
}

// cuda.h's layout: 88 bytes of pool properties, then four 8-byte fields.
const _: () = assert!(std::mem::size_of::<MemAllocNodeParams>() == 120);

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
pub struct ExecUpdateResultInfo {
    result: c_int,
    error_node: CUgraphNode,
    error_from_node: CUgraphNode,
}

/// `CUgraphEdgeData`: all zero for the default edges this graph API makes.
#[repr(C)]
pub struct EdgeData {
    bytes: [u8; 8],
}

impl EdgeData {
    /// A plain edge, or a programmatic one (`from_port` default,
    /// programmatic or launch order; `type` programmatic): either is
    /// honoured by a plain dependency, which orders at least as much.
    fn orders_no_less_as_plain(&self) -> bool {
        let [from_port, to_port, kind, ..] = self.bytes;
        from_port <= 2 && to_port == 0 && kind <= 1
    }
}

/// Checks `count` edges at `edges` (NULL: plain ones) for `call`: plain
/// and programmatic edges are taken as plain dependencies (XLA adds
/// programmatic ones between kernels: the same results, without the
/// overlap; said once), others are `CUDA_ERROR_NOT_SUPPORTED`.
fn plain_dependencies(call: &str, edges: *const EdgeData, count: usize) -> Result<(), u32> {
    if edges.is_null() || count == 0 {
        return Ok(());
    }
    if count > MAX_NODE_DEPENDENCIES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it `count` entries.
    let edges = unsafe { std::slice::from_raw_parts(edges, count) };
    if !edges.iter().all(EdgeData::orders_no_less_as_plain) {
        log::warn!("rgpu: {call}: edges other than plain and programmatic ones are not supported");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if edges.iter().any(|e| e.bytes != [0; 8]) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            log::info!(
                "rgpu: programmatic graph edges are added as full dependencies (same results, \
                 no overlap of dependent kernels)"
            );
        });
    }
    Ok(())
}

/// `CUDA_MEMSET_NODE_PARAMS` (`_v2` adds a context after it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemsetNodeParams {
    dst: CUdeviceptr,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_memory_type: c_uint,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    reserved0: *mut c_void,
    src_pitch: usize,
    src_height: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_memory_type: c_uint,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    reserved1: *mut c_void,
    dst_pitch: usize,
    dst_height: usize,
    width_in_bytes: usize,
    height: usize,
    depth: usize,
}

/// `CU_STREAM_CAPTURE_STATUS_*`.
pub(crate) const CAPTURE_STATUS_NONE: c_int = 0;
pub(crate) const CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`, the mode of `cuStreamBeginCapture`
/// without one; modes go up to `RELAXED` (2).
const MODE_GLOBAL: c_int = 0;
const MODE_RELAXED: c_int = 2;
/// Guest handles set aside for the driver's nodes a listing names, unless
/// it needs more (then a second listing has room for all).
const DRIVER_NODES_ROOM: u32 = 16;
/// Most nodes one listing answers (the session's node limit is lower).
const MAX_LISTED_NODES: usize = 1 << 20;

pub(crate) struct Graph {
    context: Arc<Context>,
    handle: u32,
    /// Its nodes (their registry handles) in the order they were added.
    nodes: Mutex<Vec<usize>>,
    /// Made by stream capture, captured into, or cloned from such a graph:
    /// (some of) its nodes are the host driver's, not known here.
    captured: std::sync::atomic::AtomicBool,
    /// A clone's nodes by the original's (`cuGraphNodeFindInClone`).
    originals: Mutex<HashMap<usize, usize>>,
    /// Copied into another graph as a child: the copy's host nodes use
    /// this graph's gates, which then stay for the process's life.
    embedded: std::sync::atomic::AtomicBool,
}

impl Graph {
    fn new(context: Arc<Context>, handle: u32, captured: bool) -> Self {
        Self {
            context,
            handle,
            nodes: Mutex::new(Vec::new()),
            captured: std::sync::atomic::AtomicBool::new(captured),
            originals: Mutex::new(HashMap::new()),
            embedded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Its host nodes' gates (and whose they are), unless it was copied
    /// into another graph.
    fn own_gates(&self) -> Vec<usize> {
        if self.embedded.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.nodes()
            .iter()
            .filter_map(|n| NODES.get(*n as *mut c_void))
            .filter_map(|node| match *node.params() {
                NodeParams::Host { gate, .. } => Some(gate.host),
                _ => None,
            })
            .collect()
    }

    fn captured(&self) -> bool {
        self.captured.load(Ordering::Acquire)
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) struct Node {
    context: Arc<Context>,
    /// The graph's handle (for destroying its nodes with it).
    graph: u32,
    handle: u32,
    kind: c_int,
    /// The nodes it depends on (their registry handles).
    dependencies: Mutex<Vec<usize>>,
    /// Its parameters as last set, for the `Get*Params` calls.
    params: Mutex<NodeParams>,
}

impl Node {
    fn params(&self) -> std::sync::MutexGuard<'_, NodeParams> {
        self.params.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn dependencies(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.dependencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a node's `Get*Params` answers.
#[derive(Clone)]
enum NodeParams {
    None,
    /// A host node: its function and argument, its gate, and its three
    /// memory-operation nodes on the host (raise, wait, reset: the last is
    /// the node's handle).
    Host {
        function: crate::host_functions::HostFunction,
        data: usize,
        gate: GateAddresses,
        nodes: [u32; 3],
    },
    Kernel(Arc<HeldKernelParams>),
    Memset(MemsetNodeParams),
    Memcpy(HeldMemcpy),
    /// An event record or wait node's event (the application's handle).
    Event(usize),
    MemAlloc(Arc<HeldMemAlloc>),
    MemFree(CUdeviceptr),
    /// A node the host's driver made (by stream capture), named here when
    /// listed: its parameters and edges are the driver's.
    Driver,
}

/// A memcpy node's parameters as the application gave them, for
/// `cuGraphMemcpyNodeGetParams`.
#[derive(Clone, Copy)]
struct HeldMemcpy(Memcpy3D);

// SAFETY: the struct holds the application's pointer values, which this
// library never dereferences once the node is made.
unsafe impl Send for HeldMemcpy {}
// SAFETY: as above; it is only copied out.
unsafe impl Sync for HeldMemcpy {}

/// A memory-allocation node's parameters as `cuGraphMemAllocNodeGetParams`
/// hands them out: `params.access_descs` points into `descs`.
struct HeldMemAlloc {
    params: MemAllocNodeParams,
    /// Never read here: `params` points into it.
    _descs: Box<[AccessDescRaw]>,
}

// SAFETY: `params` holds the application's opaque pointer values and a
// pointer into `_descs`, which this struct owns and never changes; nothing
// here is dereferenced by this library.
unsafe impl Send for HeldMemAlloc {}
// SAFETY: as above; the struct is never changed after it is made.
unsafe impl Sync for HeldMemAlloc {}

/// A kernel node's parameters as `cuGraphKernelNodeGetParams` hands them
/// out: the argument values in a buffer of their own, and one pointer per
/// argument into it (valid until the node's parameters change, as the
/// driver's).
struct HeldKernelParams {
    func: CUfunction,
    kern: *mut c_void,
    ctx: *mut c_void,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    /// Never read here: `pointers` point into it.
    _values: Box<[u8]>,
    pointers: Box<[*mut c_void]>,
}

// SAFETY: the handles are opaque values the application passed in, and
// `pointers` point into `_values`, which this struct owns and never
// changes; nothing here is dereferenced by this library.
unsafe impl Send for HeldKernelParams {}
// SAFETY: as above; the struct is never changed after it is made.
unsafe impl Sync for HeldKernelParams {}

impl HeldKernelParams {
    fn new(p: &KernelNodeParams, buffer: &[u8], info: &FunctionInfo) -> Self {
        let mut values: Box<[u8]> = buffer.into();
        let base = values.as_mut_ptr();
        let pointers = info
            .params
            .iter()
            // The buffer is laid out by `info` (marshal checked each slot
            // lies inside it).
            .map(|slot| base.wrapping_add(slot.offset as usize).cast())
            .collect();
        Self {
            func: p.func,
            kern: p.kern,
            ctx: p.ctx,
            grid: p.grid,
            block: p.block,
            shared_mem_bytes: p.shared_mem_bytes,
            _values: values,
            pointers,
        }
    }

    fn to_v2(&self) -> KernelNodeParams {
        KernelNodeParams {
            func: self.func,
            grid: self.grid,
            block: self.block,
            shared_mem_bytes: self.shared_mem_bytes,
            kernel_params: self.pointers.as_ptr().cast_mut(),
            extra: std::ptr::null_mut(),
            kern: self.kern,
            ctx: self.ctx,
        }
    }
}

pub(crate) struct GraphExec {
    context: Arc<Context>,
    handle: u32,
    /// The graph it was instantiated from (whose nodes its node calls name).
    graph: u32,
    /// The flags it was instantiated with (`cuGraphExecGetFlags`).
    flags: c_ulonglong,
    /// A gate of its own per host node of its graph, in the graph's order.
    gates: Mutex<Vec<ExecGate>>,
    /// Its graph had host nodes (fixed when made: launches look at this,
    /// not at `gates`).
    has_host_nodes: bool,
    /// The streams it was launched on (while it has gates), as the
    /// application named them: where its gates are let go after its last
    /// launch.
    launched_on: Mutex<std::collections::HashSet<(usize, bool)>>,
}

/// A host node's gate in one executable graph: its node (registry
/// handle), the node's three memory-operation nodes, and the gate.
#[derive(Clone, Copy)]
struct ExecGate {
    node: usize,
    nodes: [u32; 3],
    gate: GateAddresses,
}

impl GraphExec {
    fn gates(&self) -> std::sync::MutexGuard<'_, Vec<ExecGate>> {
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets go of its gates (it is gone): at once if it was never
    /// launched, else once each stream it was launched on has passed its
    /// launches (a launch in flight finishes, as natively).
    fn release_gates(&self) {
        let gates: Vec<usize> = self.gates().drain(..).map(|g| g.gate.host).collect();
        let launched: Vec<(usize, bool)> = self
            .launched_on
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        // A stream destroyed since may still run a launch: its gates stay.
        let streams: Option<Vec<u32>> = launched
            .iter()
            .map(|(stream, per_thread)| {
                resolve_stream(*stream as CUstream, *per_thread)
                    .ok()
                    .filter(|(ctx, _)| Arc::ptr_eq(ctx, &self.context))
                    .map(|(_, handle)| handle)
            })
            .collect();
        match streams {
            Some(streams) => crate::host_functions::disarm_after(&self.context, gates, &streams),
            None => log::debug!("rgpu: the gates of a destroyed graph stay armed"),
        }
    }

    /// Points the host node `held` of this executable graph at its gate.
    fn point_at_gate(&self, held: &ExecGate) -> Result<(), u32> {
        for (node, (wait, address, value, flags)) in held.nodes.iter().zip(gate_ops(&held.gate)) {
            self.context.call(&Command::GraphExecMemOpNodeSetParams {
                exec: self.handle,
                node: *node,
                wait,
                width: 4,
                address,
                value,
                flags,
            })?;
        }
        Ok(())
    }
}

/// Says once that a host node could not be moved to a gate of its own.
fn gates_not_moved(code: u32) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        log::warn!(
            "rgpu: the host's driver would not move a host node to a gate of its own (error \
             {code}): executable graphs and clones share their graph's host-node gates"
        );
    });
}

/// A host node's three memory operations at `gate` (wait, address, value,
/// flags): raise the request, wait until it is done, reset done.
fn gate_ops(gate: &GateAddresses) -> [(u32, u64, u64, u32); 3] {
    let wait_equal = crate::host_functions::WAIT_EQUAL;
    [
        (0, gate.request, 1, 0),
        (1, gate.done, 1, wait_equal),
        (0, gate.done, 0, 0),
    ]
}

/// The host nodes of `graph` with a gate of their own for an executable
/// graph: each armed with the node's function and argument as they are
/// now. `CUDA_ERROR_OUT_OF_MEMORY` (nothing kept) when gates run out.
fn exec_gates(graph: &Graph) -> Result<Vec<ExecGate>, u32> {
    let host_nodes: Vec<(usize, Arc<Node>)> = graph
        .nodes()
        .iter()
        .filter_map(|n| NODES.get(*n as *mut c_void).map(|node| (*n, node)))
        .filter(|(_, node)| node.kind == NODE_HOST)
        .collect();
    let mut gates: Vec<ExecGate> = Vec::with_capacity(host_nodes.len());
    for (key, node) in host_nodes {
        let NodeParams::Host {
            function,
            data,
            nodes,
            ..
        } = *node.params()
        else {
            continue;
        };
        let Some(gate) =
            crate::host_functions::arm_for_graph(&graph.context, function, data as *mut c_void)
        else {
            for taken in &gates {
                crate::host_functions::disarm(graph.context.id, taken.gate.host);
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        gates.push(ExecGate {
            node: key,
            nodes,
            gate,
        });
    }
    Ok(gates)
}

static GRAPHS: Registry<Graph> = Registry::new();
static GRAPH_EXECS: Registry<GraphExec> = Registry::new();
static NODES: Registry<Node> = Registry::new();

/// Captures going on, as the guest answers capture queries from them.
#[derive(Default)]
struct Captures {
    /// Streams capturing now, by (context id, stream handle).
    streams: HashMap<(u64, u32), Capture>,
    /// Events last recorded in a capture, by (context id, event handle):
    /// the capture's id (a stream waiting on one joins that capture).
    events: HashMap<(u64, u32), u64>,
    /// The graph (registry handle) each capture records into, once named
    /// (`cuStreamGetCaptureInfo`), by capture id.
    graphs: HashMap<u64, usize>,
    /// The dependencies `cuStreamGetCaptureInfo` last answered for a stream
    /// (registry handles, and their edge data), by (context id, stream):
    /// the caller reads them until its next capture call on the stream.
    dependencies: HashMap<(u64, u32), (Vec<usize>, Vec<EdgeData>)>,
}

#[derive(Debug, Clone, Copy)]
struct Capture {
    id: u64,
    /// Began it (`cuStreamBeginCapture`), else joined it by waiting on an
    /// event recorded in it.
    origin: bool,
    /// Began by `cuStreamBeginCaptureToGraph`: the graph (registry handle)
    /// it records into.
    into: Option<usize>,
}

static CAPTURES: Mutex<Option<Captures>> = Mutex::new(None);
static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);
/// Captures begun and not ended. With none, no event belongs to one: event
/// records and stream waits skip the bookkeeping (and its lock).
static ACTIVE_CAPTURES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// `cuThreadExchangeStreamCaptureMode`'s per-thread mode.
    static THREAD_CAPTURE_MODE: Cell<c_int> = const { Cell::new(MODE_GLOBAL) };
}

fn captures<R>(f: impl FnOnce(&mut Captures) -> R) -> R {
    let mut guard = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(Captures::default))
}

/// The id of the capture `stream` of `context` is in, if any.
pub(crate) fn capture_of(context: &Context, stream: u32) -> Option<u64> {
    captures(|c| c.streams.get(&(context.id, stream)).map(|s| s.id))
}

/// Whether `stream` of `context` is capturing (one load while nothing is).
pub(crate) fn is_capturing(context: &Context, stream: u32) -> bool {
    ACTIVE_CAPTURES.load(Ordering::Acquire) != 0 && capture_of(context, stream).is_some()
}

/// `event` was recorded in `stream`: in its capture, if it is capturing.
pub(crate) fn note_event_record(context: &Context, event: u32, stream: u32) {
    if ACTIVE_CAPTURES.load(Ordering::Acquire) == 0 {
        return;
    }
    captures(|c| match c.streams.get(&(context.id, stream)) {
        Some(capture) => {
            c.events.insert((context.id, event), capture.id);
        }
        None => {
            c.events.remove(&(context.id, event));
        }
    });
}

/// `stream` waits on `event`: one recorded in a capture still going on
/// makes the stream join it, as the host's driver has it do.
pub(crate) fn note_stream_wait(context: &Context, stream: u32, event: u32) {
    if ACTIVE_CAPTURES.load(Ordering::Acquire) == 0 {
        return;
    }
    captures(|c| {
        let Some(id) = c.events.get(&(context.id, event)).copied() else {
            return;
        };
        if c.streams.values().any(|s| s.id == id && s.origin) {
            c.streams.entry((context.id, stream)).or_insert(Capture {
                id,
                origin: false,
                into: None,
            });
        }
    });
}

/// Nodes as the host's driver lists them (`which` of `handle`, nodes of
/// `graph`), as registry handles: a node made here is its own; one the
/// driver made gets a guest handle and a node here the first time.
fn driver_nodes(graph: &Graph, which: u32, handle: u32) -> Result<Vec<usize>, u32> {
    let ctx = &graph.context;
    let mut room = DRIVER_NODES_ROOM;
    for _ in 0..2 {
        let first_node = ctx.new_handles(room)?;
        let reply = ctx.call(&Command::GraphNameNodes {
            which,
            handle,
            first_node,
            room,
        })?;
        let words = rgpu_proto::reply::decode_u64_list(&reply, 1 + 2 * MAX_LISTED_NODES)
            .map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let (&total, pairs) = words.split_first().ok_or(CUDA_ERROR_UNKNOWN)?;
        if pairs.len() as u64 != 2 * total {
            return Err(CUDA_ERROR_UNKNOWN);
        }
        if pairs.chunks(2).any(|pair| pair.first() == Some(&0)) {
            // More new nodes than there was room for: again, with room
            // for all (those named stay named).
            room = u32::try_from(total).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
            continue;
        }
        let mine: Vec<Arc<Node>> = NODES
            .values()
            .into_iter()
            .filter(|n| n.context.id == ctx.id && n.graph == graph.handle)
            .collect();
        let known: HashMap<u32, usize> = mine
            .iter()
            .map(|n| (n.handle, Arc::as_ptr(n) as usize))
            .collect();
        // A host node is three nodes on the host; the first two are its own.
        let hidden: Vec<u32> = mine
            .iter()
            .filter_map(|n| match *n.params() {
                NodeParams::Host { nodes, .. } => Some([nodes[0], nodes[1]]),
                _ => None,
            })
            .flatten()
            .collect();
        let mut listed = Vec::with_capacity(pairs.len() / 2);
        for pair in pairs.chunks(2) {
            let [guest, kind] = *pair else {
                return Err(CUDA_ERROR_UNKNOWN);
            };
            let guest = u32::try_from(guest).map_err(|_| CUDA_ERROR_UNKNOWN)?;
            if hidden.contains(&guest) {
                continue;
            }
            let key = match known.get(&guest) {
                Some(key) => *key,
                None => NODES.insert(Arc::new(Node {
                    context: ctx.clone(),
                    graph: graph.handle,
                    handle: guest,
                    kind: c_int::try_from(kind).map_err(|_| CUDA_ERROR_UNKNOWN)?,
                    dependencies: Mutex::new(Vec::new()),
                    params: Mutex::new(NodeParams::Driver),
                })) as usize,
            };
            listed.push(key);
        }
        return Ok(listed);
    }
    // The session's node limit left nodes unnamed.
    Err(CUDA_ERROR_OUT_OF_MEMORY)
}

/// The graph (registry handle) `stream` of `ctx`'s capture records into:
/// named on the host the first time it is asked for.
fn capture_graph(ctx: &Arc<Context>, stream: u32, capture: Capture) -> Result<usize, u32> {
    if let Some(key) = capture.into {
        return Ok(key);
    }
    if let Some(key) = captures(|c| c.graphs.get(&capture.id).copied()) {
        return Ok(key);
    }
    let handle = ctx.new_handle()?;
    ctx.call(&Command::StreamCaptureGraph {
        stream,
        graph: handle,
    })?;
    let key = GRAPHS.insert(Arc::new(Graph::new(ctx.clone(), handle, true))) as usize;
    captures(|c| c.graphs.insert(capture.id, key));
    Ok(key)
}

/// What `cuStreamGetCaptureInfo` answers beyond the status and id, for
/// `stream` of `ctx` capturing: the graph, and if asked the nodes the next
/// captured node will depend on (an array, with its edge data, that stays
/// until the next such call on the stream).
pub(crate) fn capture_details(
    ctx: &Arc<Context>,
    stream: u32,
    with_dependencies: bool,
) -> Result<Option<CaptureDetails>, u32> {
    let Some(capture) = captures(|c| c.streams.get(&(ctx.id, stream)).copied()) else {
        return Ok(None);
    };
    let key = capture_graph(ctx, stream, capture)?;
    if !with_dependencies {
        return Ok(Some(CaptureDetails {
            graph: key as CUgraph,
            dependencies: std::ptr::null(),
            edges: std::ptr::null(),
            count: 0,
        }));
    }
    let graph = GRAPHS.get(key as CUgraph).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    let nodes = driver_nodes(&graph, name_nodes::CAPTURE_DEPENDENCIES, stream)?;
    let edges = (0..nodes.len())
        .map(|_| EdgeData { bytes: [0; 8] })
        .collect();
    captures(|c| {
        let held = c
            .dependencies
            .entry((ctx.id, stream))
            .or_insert_with(|| (Vec::new(), Vec::new()));
        *held = (nodes, edges);
        Ok(Some(CaptureDetails {
            graph: key as CUgraph,
            // Registry handles are the nodes' addresses: an array of them
            // is an array of CUgraphNode.
            dependencies: held.0.as_ptr().cast(),
            edges: held.1.as_ptr(),
            count: held.0.len(),
        }))
    })
}

/// [`capture_details`]' answer.
pub(crate) struct CaptureDetails {
    pub graph: CUgraph,
    pub dependencies: *const CUgraphNode,
    pub edges: *const EdgeData,
    pub count: usize,
}

/// `cuStreamUpdateCaptureDependencies` (`_v2`: plain edges only): the next
/// node captured on `stream` depends on `nodes` too (`flags` 0), or only on
/// them (1).
fn update_capture_dependencies_on(
    stream: CUstream,
    nodes: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
    flags: c_uint,
    per_thread: bool,
) -> Result<(), u32> {
    plain_dependencies("cuStreamUpdateCaptureDependencies", edges, count)?;
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if capture_of(&ctx, handle).is_none() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let nodes = dependency_handles(&ctx, nodes, count)?
        .into_iter()
        .map(|(_, handle)| handle)
        .collect();
    ctx.call(&Command::StreamUpdateCaptureDependencies {
        stream: handle,
        nodes,
        flags,
    })
    .map(|_| ())
}

pub(crate) fn update_capture_dependencies(
    stream: CUstream,
    nodes: *const CUgraphNode,
    count: usize,
    flags: c_uint,
) -> Result<(), u32> {
    update_capture_dependencies_on(stream, nodes, std::ptr::null(), count, flags, false)
}

pub(crate) fn update_capture_dependencies_ptsz(
    stream: CUstream,
    nodes: *const CUgraphNode,
    count: usize,
    flags: c_uint,
) -> Result<(), u32> {
    update_capture_dependencies_on(stream, nodes, std::ptr::null(), count, flags, true)
}

pub(crate) fn update_capture_dependencies_v2(
    stream: CUstream,
    nodes: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
    flags: c_uint,
) -> Result<(), u32> {
    update_capture_dependencies_on(stream, nodes, edges, count, flags, false)
}

pub(crate) fn update_capture_dependencies_v2_ptsz(
    stream: CUstream,
    nodes: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
    flags: c_uint,
) -> Result<(), u32> {
    update_capture_dependencies_on(stream, nodes, edges, count, flags, true)
}

fn begin_on(stream: CUstream, mode: c_int, per_thread: bool) -> Result<(), u32> {
    begin_capture_of(stream, mode, per_thread, None)
}

/// Begins a capture of `stream`, into an existing graph with `into`:
/// the graph, its registry handle, and the dependencies' guest handles.
fn begin_capture_of(
    stream: CUstream,
    mode: c_int,
    per_thread: bool,
    into: Option<(&Graph, usize, Vec<u32>)>,
) -> Result<(), u32> {
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&mode) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if capture_of(&ctx, handle).is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let target = match into {
        None => {
            ctx.call(&Command::StreamBeginCapture {
                stream: handle,
                mode: mode as u32,
            })?;
            None
        }
        Some((graph, key, dependencies)) => {
            same_context(&ctx, &graph.context)?;
            ctx.call(&Command::StreamBeginCaptureToGraph {
                stream: handle,
                mode: mode as u32,
                graph: graph.handle,
                dependencies,
            })?;
            Some(key)
        }
    };
    let id = NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed);
    captures(|c| {
        c.streams.insert(
            (ctx.id, handle),
            Capture {
                id,
                origin: true,
                into: target,
            },
        )
    });
    ACTIVE_CAPTURES.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// `cuStreamBeginCaptureToGraph`: the stream's work is recorded into
/// `graph` after `dependencies` (plain or programmatic edges, the latter
/// as plain dependencies, as `cuGraphAddNode_v2` takes them).
pub(crate) fn begin_capture_to_graph(
    stream: CUstream,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
    mode: c_int,
) -> Result<(), u32> {
    let target = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    plain_dependencies("cuStreamBeginCaptureToGraph", edges, count)?;
    let deps = dependency_handles(&target.context, dependencies, count)?
        .into_iter()
        .map(|(_, handle)| handle)
        .collect();
    begin_capture_of(stream, mode, false, Some((&target, graph as usize, deps)))
}

pub(crate) fn begin_capture(stream: CUstream) -> Result<(), u32> {
    begin_on(stream, MODE_GLOBAL, false)
}

pub(crate) fn begin_capture_ptsz(stream: CUstream) -> Result<(), u32> {
    begin_on(stream, MODE_GLOBAL, true)
}

pub(crate) fn begin_capture_v2(stream: CUstream, mode: c_int) -> Result<(), u32> {
    begin_on(stream, mode, false)
}

pub(crate) fn begin_capture_v2_ptsz(stream: CUstream, mode: c_int) -> Result<(), u32> {
    begin_on(stream, mode, true)
}

fn end_on(stream: CUstream, graph: *mut CUgraph, per_thread: bool) -> Result<(), u32> {
    if graph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    let Some(capture) = captures(|c| c.streams.get(&(ctx.id, handle)).copied()) else {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    };
    if capture.origin {
        // The capture ends whatever the host says (as the driver's does),
        // for the streams that joined it too. A joined stream does not end
        // it: the host's driver refuses that.
        captures(|c| {
            c.streams.retain(|_, s| s.id != capture.id);
            c.events.retain(|_, id| *id != capture.id);
            let streams = &c.streams;
            c.dependencies.retain(|key, _| streams.contains_key(key));
        });
        ACTIVE_CAPTURES.fetch_sub(1, Ordering::AcqRel);
    }
    let named = captures(|c| {
        if capture.origin {
            c.graphs.remove(&capture.id)
        } else {
            c.graphs.get(&capture.id).copied()
        }
    });
    if let (Some(key), None) = (named, capture.into) {
        // Named while capturing: the capture ends in that graph.
        let ended = ctx.call(&Command::StreamEndCapture {
            stream: handle,
            graph: 0,
        });
        if let Err(code) = ended {
            // The host forgot it with the failed capture.
            if let Some(lost) = GRAPHS.remove(key as CUgraph) {
                NODES.retain(|n| !(n.context.id == lost.context.id && n.graph == lost.handle));
            }
            return Err(code);
        }
        return write_out(graph, key as CUgraph);
    }
    if let Some(key) = capture.into {
        // Into an existing graph: the capture ends in it.
        ctx.call(&Command::StreamEndCapture {
            stream: handle,
            graph: 0,
        })?;
        if let Some(target) = GRAPHS.get(key as CUgraph) {
            target.captured.store(true, Ordering::Release);
        }
        return write_out(graph, key as CUgraph);
    }
    let graph_handle = ctx.new_handle()?;
    ctx.call(&Command::StreamEndCapture {
        stream: handle,
        graph: graph_handle,
    })?;
    write_out(
        graph,
        GRAPHS.insert(Arc::new(Graph::new(ctx, graph_handle, true))),
    )
}

pub(crate) fn end_capture(stream: CUstream, graph: *mut CUgraph) -> Result<(), u32> {
    end_on(stream, graph, false)
}

pub(crate) fn end_capture_ptsz(stream: CUstream, graph: *mut CUgraph) -> Result<(), u32> {
    end_on(stream, graph, true)
}

pub(crate) fn instantiate_with_flags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> Result<(), u32> {
    driver()?;
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx = graph.context.clone();
    let exec_handle = ctx.new_handle()?;
    // Its host nodes run through gates of its own, so that setting their
    // parameters in it reaches no other (natively each executable graph
    // holds its own copy).
    let gates = exec_gates(&graph)?;
    let made = Arc::new(GraphExec {
        context: ctx.clone(),
        handle: exec_handle,
        graph: graph.handle,
        flags,
        has_host_nodes: !gates.is_empty(),
        gates: Mutex::new(gates),
        launched_on: Mutex::new(std::collections::HashSet::new()),
    });
    if let Err(code) = ctx.call(&Command::GraphInstantiate {
        graph: graph.handle,
        exec: exec_handle,
        flags,
    }) {
        made.release_gates();
        return Err(code);
    }
    let pointed = made
        .gates()
        .clone()
        .iter()
        .try_for_each(|held| made.point_at_gate(held));
    if let Err(code) = pointed {
        // The host's driver would not move a node to its gate: the
        // executable graph runs on what it was made with (the graph's
        // gates, kept for good now) and its host nodes take no parameters
        // of their own; the gates it took stay armed (some nodes may have
        // moved to them).
        gates_not_moved(code);
        graph.embedded.store(true, Ordering::Release);
        made.gates().clear();
    }
    write_out(exec, GRAPH_EXECS.insert(made))
}

/// The older form (`cuGraphInstantiate`, `_v2`): no error node and an
/// empty log on success.
pub(crate) fn instantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> Result<(), u32> {
    write_optional(error_node, std::ptr::null_mut());
    if !log.is_null() && log_size > 0 {
        // SAFETY: the caller gave `log_size` (> 0) writable bytes at `log`.
        unsafe { log.write(0) };
    }
    instantiate_with_flags(exec, graph, 0)
}

fn launch_on(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Result<(), u32> {
    let exec = GRAPH_EXECS.get(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    same_context(&ctx, &exec.context)?;
    if exec.has_host_nodes {
        exec.launched_on
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((stream as usize, per_thread));
    }
    ctx.send(&Command::GraphLaunch {
        exec: exec.handle,
        stream: handle,
    })
}

pub(crate) fn launch(exec: CUgraphExec, stream: CUstream) -> Result<(), u32> {
    launch_on(exec, stream, false)
}

pub(crate) fn launch_ptsz(exec: CUgraphExec, stream: CUstream) -> Result<(), u32> {
    launch_on(exec, stream, true)
}

pub(crate) fn exec_destroy(exec: CUgraphExec) -> Result<(), u32> {
    driver()?;
    let exec = GRAPH_EXECS.remove(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // A launch in flight still runs its host nodes (the runner lets a
    // raised gate go after its run).
    exec.release_gates();
    exec.context
        .send(&Command::GraphExecDestroy { exec: exec.handle })
}

pub(crate) fn destroy(graph: CUgraph) -> Result<(), u32> {
    driver()?;
    let graph = GRAPHS.remove(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let context_id = graph.context.id;
    // Its executable graphs and clones have gates of their own.
    for gate in graph.own_gates() {
        crate::host_functions::disarm(context_id, gate);
    }
    NODES.retain(|n| !(n.context.id == context_id && n.graph == graph.handle));
    graph.context.send(&Command::GraphDestroy {
        graph: graph.handle,
    })
}

/// `cuGraphCreate`: an empty graph of the current context.
pub(crate) fn create(graph: *mut CUgraph, flags: c_uint) -> Result<(), u32> {
    if graph.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let handle = ctx.new_handle()?;
    ctx.call(&Command::GraphCreate {
        graph: handle,
        flags,
    })?;
    write_out(
        graph,
        GRAPHS.insert(Arc::new(Graph::new(ctx, handle, false))),
    )
}

/// `cuGraphClone`: the clone's nodes get consecutive handles, in the
/// order of the original's.
pub(crate) fn clone(clone: *mut CUgraph, original: CUgraph) -> Result<(), u32> {
    driver()?;
    if clone.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let original = GRAPHS.get(original).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx = original.context.clone();
    let originals: Vec<(usize, Option<Arc<Node>>)> = original
        .nodes()
        .iter()
        .map(|n| (*n, NODES.get(*n as *mut c_void)))
        .collect();
    // A host node is three nodes on the host, copied in order; the copy
    // gets a gate of its own (armed with the same function).
    let on_host = |node: &Option<Arc<Node>>| match node.as_ref().map(|n| n.params().clone()) {
        Some(NodeParams::Host { function, data, .. }) => Some((function, data)),
        _ => None,
    };
    let mut gates: Vec<GateAddresses> = Vec::new();
    for (function, data) in originals.iter().filter_map(|(_, n)| on_host(n)) {
        match crate::host_functions::arm_for_graph(&ctx, function, data as *mut c_void) {
            Some(gate) => gates.push(gate),
            None => {
                for gate in &gates {
                    crate::host_functions::disarm(ctx.id, gate.host);
                }
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
    }
    let host_nodes = originals.len().saturating_add(2 * gates.len());
    let count = u32::try_from(host_nodes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    let handle = ctx.new_handle()?;
    let first_node = ctx.new_handles(count)?;
    if let Err(code) = ctx.call(&Command::GraphClone {
        graph: handle,
        original: original.handle,
        first_node,
    }) {
        for gate in &gates {
            crate::host_functions::disarm(ctx.id, gate.host);
        }
        return Err(code);
    }
    let mut gates = gates.into_iter();
    let graph = Arc::new(Graph::new(ctx.clone(), handle, original.captured()));
    {
        let mut nodes = graph.nodes();
        // Original registry handle -> the copy's; then each copy's
        // dependencies (an edge added later may point to a later node).
        let mut copies: HashMap<usize, usize> = HashMap::new();
        let mut made: Vec<(Arc<Node>, Vec<usize>)> = Vec::new();
        let mut next = first_node;
        for (old, node) in originals {
            let (kind, dependencies, mut params) = node.map_or_else(
                || (NODE_EMPTY, Vec::new(), NodeParams::None),
                |n| (n.kind, n.dependencies().clone(), n.params().clone()),
            );
            let mut copy_handle = next;
            if let NodeParams::Host {
                function,
                data,
                gate: shared,
                ..
            } = params
            {
                let nodes = [next, next + 1, next + 2];
                let own = gates.next().ok_or(CUDA_ERROR_UNKNOWN)?;
                let moved = nodes.iter().zip(gate_ops(&own)).try_for_each(
                    |(node, (wait, address, value, flags))| {
                        ctx.call(&Command::GraphMemOpNodeSetParams {
                            node: *node,
                            wait,
                            width: 4,
                            address,
                            value,
                            flags,
                        })
                        .map(|_| ())
                    },
                );
                // Not moved: the copy runs through the original's gate
                // (kept for good now); its own stays armed (some of its
                // nodes may have moved).
                let gate = match moved {
                    Ok(()) => own,
                    Err(code) => {
                        gates_not_moved(code);
                        // Neither graph gives that gate back now.
                        original.embedded.store(true, Ordering::Release);
                        graph.embedded.store(true, Ordering::Release);
                        shared
                    }
                };
                params = NodeParams::Host {
                    function,
                    data,
                    gate,
                    nodes,
                };
                copy_handle = next + 2;
                next += 2;
            }
            next += 1;
            let copy = Arc::new(Node {
                context: ctx.clone(),
                graph: handle,
                handle: copy_handle,
                kind,
                dependencies: Mutex::new(Vec::new()),
                params: Mutex::new(params),
            });
            let key = NODES.insert(copy.clone());
            copies.insert(old, key as usize);
            nodes.push(key as usize);
            made.push((copy, dependencies));
        }
        for (copy, dependencies) in made {
            *copy.dependencies() = dependencies
                .iter()
                .filter_map(|d| copies.get(d).copied())
                .collect();
        }
        *graph
            .originals
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = copies;
    }
    write_out(clone, GRAPHS.insert(graph))
}

/// The registry and guest handles of `count` dependencies at
/// `dependencies`: nodes of `ctx` (which graph they belong to is the
/// host's to check).
fn dependency_handles(
    ctx: &Arc<Context>,
    dependencies: *const CUgraphNode,
    count: usize,
) -> Result<Vec<(usize, u32)>, u32> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if dependencies.is_null() || count > MAX_NODE_DEPENDENCIES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, `count` (bounded) handles: the API contract.
    let nodes = unsafe { std::slice::from_raw_parts(dependencies, count) };
    nodes
        .iter()
        .map(|n| {
            let node = NODES.get(*n).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            same_context(ctx, &node.context)?;
            Ok((*n as usize, node.handle))
        })
        .collect()
}

/// Adds a node of type `kind` to `graph`: `command` builds the command
/// (and the parameters the node keeps) from the graph's context, the
/// graph's handle, the node's and its dependencies'. The node, and the
/// host's reply.
fn add_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    kind: c_int,
    command: impl FnOnce(&Arc<Context>, u32, u32, Vec<u32>) -> Result<(Command, NodeParams), u32>,
) -> Result<(Arc<Node>, Vec<u8>), u32> {
    driver()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx = graph.context.clone();
    let (registered, deps): (Vec<usize>, Vec<u32>) = dependency_handles(&ctx, dependencies, count)?
        .into_iter()
        .unzip();
    let handle = ctx.new_handle()?;
    let (command, params) = command(&ctx, graph.handle, handle, deps)?;
    let reply = ctx.call(&command)?;
    let node = Arc::new(Node {
        context: ctx,
        graph: graph.handle,
        handle,
        kind,
        dependencies: Mutex::new(registered),
        params: Mutex::new(params),
    });
    let key = NODES.insert(node.clone());
    graph.nodes().push(key as usize);
    write_out(out, key)?;
    Ok((node, reply))
}

pub(crate) fn add_empty_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
) -> Result<(), u32> {
    add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_EMPTY,
        |_, graph, node, dependencies| {
            Ok((
                Command::GraphAddEmptyNode {
                    graph,
                    node,
                    dependencies,
                },
                NodeParams::None,
            ))
        },
    )
    .map(|_| ())
}

/// A kernel node's launch (its stream unused) and the parameters it keeps,
/// checked as `cuLaunchKernel` checks them (a `CUkernel` in `kern` when
/// `func` is NULL).
fn kernel_launch(
    ctx: &Arc<Context>,
    p: &KernelNodeParams,
) -> Result<(Launch, Arc<HeldKernelParams>), u32> {
    let f = if p.func.is_null() { p.kern } else { p.func };
    if f.is_null() || p.grid.contains(&0) || p.block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let function = function_or_kernel(f, ctx)?;
    same_context(ctx, &function.context)?;
    // SAFETY: the API contract on kernelParams / extra (see `marshal`).
    let params = unsafe { marshal(&function.info, p.kernel_params.cast(), p.extra.cast()) }?;
    let held = Arc::new(HeldKernelParams::new(p, &params, &function.info));
    Ok((
        Launch {
            function: function.handle,
            grid: p.grid,
            block: p.block,
            shared_mem_bytes: p.shared_mem_bytes,
            stream: 0,
            params,
        },
        held,
    ))
}

fn add_kernel(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    p: &KernelNodeParams,
) -> Result<(), u32> {
    add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_KERNEL,
        |ctx, graph, node, dependencies| {
            let (launch, held) = kernel_launch(ctx, p)?;
            Ok((
                Command::GraphAddKernelNode {
                    graph,
                    node,
                    dependencies,
                    launch,
                },
                NodeParams::Kernel(held),
            ))
        },
    )
    .map(|_| ())
}

/// The struct at `params`, read (NULL is `CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
/// A non-NULL `params` points to a readable `T` (the API contract).
unsafe fn read_params<T>(params: *const T) -> Result<T, u32> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; readable by the caller's contract.
    Ok(unsafe { params.read() })
}

/// `cuGraphAddKernelNode_v2`.
pub(crate) fn add_kernel_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *const KernelNodeParams,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable CUDA_KERNEL_NODE_PARAMS.
    let p = unsafe { read_params(params) }?;
    add_kernel(out, graph, dependencies, count, &p)
}

/// `cuGraphAddKernelNode` with the older parameter struct.
pub(crate) fn add_kernel_node_v1(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *const KernelNodeParamsV1,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable struct.
    let p = unsafe { read_params(params) }?;
    add_kernel(out, graph, dependencies, count, &p.to_v2())
}

/// `cuGraphAddMemsetNode` (device memory; the host checks the range).
pub(crate) fn add_memset_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *const MemsetNodeParams,
    _ctx: *mut c_void,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable struct.
    let p = unsafe { memset_params("cuGraphAddMemsetNode", params) }?;
    add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_MEMSET,
        |_, graph, node, dependencies| {
            Ok((
                Command::GraphAddMemsetNode {
                    graph,
                    node,
                    dependencies,
                    dst: p.dst,
                    value: p.value,
                    element_size: p.element_size,
                    width: p.width as u64,
                    height: p.height as u64,
                    pitch: p.pitch as u64,
                },
                NodeParams::Memset(p),
            ))
        },
    )
    .map(|_| ())
}

/// Where one side of `CUDA_MEMCPY3D` starts, as a device address: device
/// memory and unified addresses as they are, host memory only when it is
/// page-locked memory of this process (the host's worker maps it at the
/// same address, registered with the GPU). Over the network carrier no
/// host memory is shared with the host: any side naming it is refused.
#[allow(clippy::too_many_arguments)]
fn copy_side(
    call: &'static str,
    ctx: &Context,
    memory_type: c_uint,
    host: usize,
    device: CUdeviceptr,
    [x, y, z]: [usize; 3],
    pitch: usize,
    rows: usize,
    extent: impl Fn(u64, u64) -> Option<u64>,
) -> Result<PitchedSide, u32> {
    let base = match memory_type {
        MEMORYTYPE_HOST => host as u64,
        MEMORYTYPE_DEVICE | MEMORYTYPE_UNIFIED => device,
        _ => {
            log::warn!("rgpu: {call}: memory type {memory_type} (arrays) is not supported");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
    };
    let (pitch, rows) = (pitch as u64, rows as u64);
    let address = (z as u64)
        .checked_mul(rows)
        .and_then(|r| r.checked_add(y as u64))
        .and_then(|r| r.checked_mul(pitch))
        .and_then(|o| o.checked_add(x as u64))
        .and_then(|o| o.checked_add(base))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if base == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let span = extent(pitch, rows);
    // Page-locked memory named as either type (as a device address it
    // might coincide with device memory on the host).
    if pinned::host_cannot_reach(address, span.unwrap_or(1))
        || (memory_type == MEMORYTYPE_HOST && ctx.over_network())
    {
        return Err(pinned::unreachable(call, Unreachable::Graph));
    }
    if memory_type == MEMORYTYPE_HOST {
        let span = span.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if !device_ranges::is_page_locked(ctx.space, address, span) {
            log::warn!(
                "rgpu: {call}: host memory {address:#x}+{span:#x} is not page-locked memory \
                 of this process; only page-locked host memory reaches the host's GPU"
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    Ok(PitchedSide {
        address,
        pitch,
        rows,
    })
}

/// A memcpy node's copy as the host makes it: both sides as device
/// addresses. Checked as `cuGraphAddMemcpyNode` checks it, but for the
/// ranges, which the host checks.
fn node_copy(call: &'static str, ctx: &Context, p: &Memcpy3D) -> Result<Copy3D, u32> {
    if p.src_lod != 0 || p.dst_lod != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let width = p.width_in_bytes as u64;
    // A CUDA_MEMCPY3D asks for at least one row of one slice.
    let (height, depth) = ((p.height as u64).max(1), (p.depth as u64).max(1));
    // From a side's first byte to its last (the last row ends `width`
    // bytes after it starts).
    let extent = |pitch: u64, rows: u64| {
        (depth - 1)
            .checked_mul(rows)?
            .checked_add(height - 1)?
            .checked_mul(pitch)?
            .checked_add(width)
    };
    let src = copy_side(
        call,
        ctx,
        p.src_memory_type,
        p.src_host as usize,
        p.src_device,
        [p.src_x_in_bytes, p.src_y, p.src_z],
        p.src_pitch,
        p.src_height,
        extent,
    )?;
    let dst = copy_side(
        call,
        ctx,
        p.dst_memory_type,
        p.dst_host as usize,
        p.dst_device,
        [p.dst_x_in_bytes, p.dst_y, p.dst_z],
        p.dst_pitch,
        p.dst_height,
        extent,
    )?;
    Ok(Copy3D {
        dst,
        src,
        width,
        height,
        depth,
    })
}

/// The struct behind a `*const CUDA_MEMCPY3D`.
fn read_memcpy(params: *const Memcpy3D) -> Result<Memcpy3D, u32> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUDA_MEMCPY3D.
    Ok(unsafe { params.read() })
}

/// `cuGraphAddMemcpyNode`: 1D, 2D and 3D copies between device memory and
/// page-locked host memory (unified addresses too). Arrays and pageable
/// host memory are not supported.
pub(crate) fn add_memcpy_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *const Memcpy3D,
    _ctx: *mut c_void,
) -> Result<(), u32> {
    let p = read_memcpy(params)?;
    add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_MEMCPY,
        |ctx, graph, node, dependencies| {
            let copy = node_copy("cuGraphAddMemcpyNode", ctx, &p)?;
            let command = if copy.height == 1 && copy.depth == 1 {
                Command::GraphAddMemcpyNode {
                    graph,
                    node,
                    dependencies,
                    dst: copy.dst.address,
                    src: copy.src.address,
                    size: copy.width,
                }
            } else {
                Command::GraphAddMemcpy3DNode {
                    graph,
                    node,
                    dependencies,
                    copy,
                }
            };
            Ok((command, NodeParams::Memcpy(HeldMemcpy(p))))
        },
    )
    .map(|_| ())
}

/// `cuGraphMemcpyNodeGetParams`: the parameters as last given.
pub(crate) fn memcpy_node_get_params(node: CUgraphNode, params: *mut Memcpy3D) -> Result<(), u32> {
    match &*node_of_kind(node, NODE_MEMCPY)?.params() {
        NodeParams::Memcpy(held) => write_out(params, held.0),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphMemcpyNodeSetParams`.
pub(crate) fn memcpy_node_set_params(
    node: CUgraphNode,
    params: *const Memcpy3D,
) -> Result<(), u32> {
    let node = node_of_kind(node, NODE_MEMCPY)?;
    let p = read_memcpy(params)?;
    let copy = node_copy("cuGraphMemcpyNodeSetParams", &node.context, &p)?;
    node.context.call(&Command::GraphMemcpyNodeSetParams {
        node: node.handle,
        copy,
    })?;
    *node.params() = NodeParams::Memcpy(HeldMemcpy(p));
    Ok(())
}

/// `cuGraphExecMemcpyNodeSetParams`: the executable graph only.
pub(crate) fn exec_memcpy_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const Memcpy3D,
    _ctx: *mut c_void,
) -> Result<(), u32> {
    let (exec, node) = exec_node(exec, node, NODE_MEMCPY)?;
    let p = read_memcpy(params)?;
    let copy = node_copy("cuGraphExecMemcpyNodeSetParams", &exec.context, &p)?;
    exec.context
        .call(&Command::GraphExecMemcpyNodeSetParams {
            exec: exec.handle,
            node: node.handle,
            copy,
        })
        .map(|_| ())
}

fn add_event_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    event: CUevent,
    kind: c_int,
) -> Result<(), u32> {
    add_node(
        out,
        graph,
        dependencies,
        count,
        kind,
        |ctx, graph, node, dependencies| {
            let event_handle = event;
            let event = crate::api::event::named(event)?;
            same_context(ctx, &event.context)?;
            let event = event.handle;
            let command = if kind == NODE_EVENT_RECORD {
                Command::GraphAddEventRecordNode {
                    graph,
                    node,
                    dependencies,
                    event,
                }
            } else {
                Command::GraphAddEventWaitNode {
                    graph,
                    node,
                    dependencies,
                    event,
                }
            };
            Ok((command, NodeParams::Event(event_handle as usize)))
        },
    )
    .map(|_| ())
}

pub(crate) fn add_event_record_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    event: CUevent,
) -> Result<(), u32> {
    add_event_node(out, graph, dependencies, count, event, NODE_EVENT_RECORD)
}

pub(crate) fn add_event_wait_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    event: CUevent,
) -> Result<(), u32> {
    add_event_node(out, graph, dependencies, count, event, NODE_WAIT_EVENT)
}

/// `cuGraphAddChildGraphNode`: the node holds a copy of `child`.
pub(crate) fn add_child_graph_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    child: CUgraph,
) -> Result<(), u32> {
    let child = GRAPHS.get(child).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // The copy's host nodes run through the child's gates.
    child.embedded.store(true, Ordering::Release);
    add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_GRAPH,
        |ctx, graph, node, dependencies| {
            same_context(ctx, &child.context)?;
            Ok((
                Command::GraphAddChildGraphNode {
                    graph,
                    node,
                    dependencies,
                    child: child.handle,
                },
                NodeParams::None,
            ))
        },
    )
    .map(|_| ())
}

/// `cuGraphAddMemAllocNode`: pinned memory of the graph's device, for
/// that device alone, made on the host (which charges it to the tenant
/// from now until no graph or executable graph holds the node); the
/// device pointer comes back in `dptr`. Other pool properties and access
/// by other devices are not supported.
pub(crate) fn add_mem_alloc_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *mut MemAllocNodeParams,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable CUDA_MEM_ALLOC_NODE_PARAMS.
    let mut p = unsafe { read_params(params.cast_const()) }?;
    if p.bytesize == 0 || p.access_desc_count > MAX_ACCESS_DESCS {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let descs: Box<[AccessDescRaw]> = if p.access_desc_count == 0 {
        Box::new([])
    } else if p.access_descs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    } else {
        // SAFETY: non-NULL, `access_desc_count` (bounded) descriptors: the
        // API contract.
        unsafe { std::slice::from_raw_parts(p.access_descs, p.access_desc_count) }.into()
    };
    let (node, reply) = add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_MEM_ALLOC,
        |ctx, graph, node, dependencies| {
            let own_device =
                |kind: c_uint, id: c_int| kind == LOCATION_TYPE_DEVICE && id == ctx.device;
            let supported = p.alloc_type == ALLOCATION_TYPE_PINNED
                && p.handle_types == 0
                && p.usage == 0
                && own_device(p.location_type, p.location_id)
                && descs.iter().all(|d| {
                    own_device(d.location_type, d.location_id) && d.flags == ACCESS_READ_WRITE
                });
            if !supported {
                log::warn!(
                    "rgpu: cuGraphAddMemAllocNode: only pinned memory of the graph's device, \
                     for that device alone, is supported (type {}, handle types {:#x}, \
                     location {}:{}, {} access descriptors)",
                    p.alloc_type,
                    p.handle_types,
                    p.location_type,
                    p.location_id,
                    descs.len()
                );
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            let command = Command::GraphAddMemAllocNode {
                graph,
                node,
                dependencies,
                size: p.bytesize as u64,
            };
            Ok((command, NodeParams::None))
        },
    )?;
    let [dptr] = decode_u64s::<1>(&reply).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    p.dptr = dptr;
    p.access_descs = descs.as_ptr();
    *node.params() = NodeParams::MemAlloc(Arc::new(HeldMemAlloc {
        params: p,
        _descs: descs,
    }));
    write_out(params, p)
}

/// `cuGraphAddMemFreeNode` of a graph allocation (the host checks that it
/// is one of this process's).
pub(crate) fn add_mem_free_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    dptr: CUdeviceptr,
) -> Result<(), u32> {
    add_node(
        out,
        graph,
        dependencies,
        count,
        NODE_MEM_FREE,
        |_, graph, node, dependencies| {
            let command = Command::GraphAddMemFreeNode {
                graph,
                node,
                dependencies,
                dptr,
            };
            Ok((command, NodeParams::MemFree(dptr)))
        },
    )
    .map(|_| ())
}

/// `cuGraphMemAllocNodeGetParams`: as the node was added, with the
/// device pointer it got.
pub(crate) fn mem_alloc_node_get_params(
    node: CUgraphNode,
    params: *mut MemAllocNodeParams,
) -> Result<(), u32> {
    match &*node_of_kind(node, NODE_MEM_ALLOC)?.params() {
        NodeParams::MemAlloc(held) => write_out(params, held.params),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphMemFreeNodeGetParams`: the pointer the node frees.
pub(crate) fn mem_free_node_get_params(
    node: CUgraphNode,
    dptr: *mut CUdeviceptr,
) -> Result<(), u32> {
    match &*node_of_kind(node, NODE_MEM_FREE)?.params() {
        NodeParams::MemFree(ptr) => write_out(dptr, *ptr),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphGetNodes` of a graph built node by node (a captured graph's
/// nodes are the host driver's: `CUDA_ERROR_NOT_SUPPORTED`).
pub(crate) fn get_nodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> Result<(), u32> {
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let held = if graph.captured() {
        // The driver made (some of) its nodes on the host: their number is
        // asked there (PyTorch checks that a capture recorded any), and
        // they are named when the caller asks for the nodes.
        if nodes.is_null() {
            let held = host_count(
                &graph,
                Command::GraphGetNodeCount {
                    graph: graph.handle,
                },
            )?;
            return write_out(count, held);
        }
        driver_nodes(&graph, name_nodes::NODES, graph.handle)?
    } else {
        graph.nodes().clone()
    };
    if !nodes.is_null() {
        // SAFETY: checked non-NULL; the caller passes a readable count.
        let room = unsafe { count.read() };
        for (i, node) in held.iter().take(room).enumerate() {
            // SAFETY: `nodes` has room for `room` handles (the API
            // contract); `i < room`.
            unsafe { nodes.add(i).write(*node as CUgraphNode) };
        }
    }
    write_out(count, held.len())
}

/// A count the host's driver answers for `graph` (`query`: of its nodes or
/// its roots).
fn host_count(graph: &Graph, query: Command) -> Result<usize, u32> {
    let payload = graph.context.call(&query)?;
    let [held] = decode_u64s::<1>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    usize::try_from(held).map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// `cuGraphNodeGetType`.
pub(crate) fn node_get_type(node: CUgraphNode, kind: *mut c_int) -> Result<(), u32> {
    let node = NODES.get(node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_out(kind, node.kind)
}

/// Node `node`, which must be of kind `kind` (the driver answers a node
/// of another kind `CUDA_ERROR_INVALID_VALUE`).
fn node_of_kind(node: CUgraphNode, kind: c_int) -> Result<Arc<Node>, u32> {
    driver()?;
    let node = NODES.get(node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if node.kind != kind {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(node)
}

/// Executable graph `exec` and its node `node` of kind `kind`: a node of
/// the graph `exec` was instantiated from.
fn exec_node(
    exec: CUgraphExec,
    node: CUgraphNode,
    kind: c_int,
) -> Result<(Arc<GraphExec>, Arc<Node>), u32> {
    let node = node_of_kind(node, kind)?;
    let exec = GRAPH_EXECS.get(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !Arc::ptr_eq(&exec.context, &node.context) || exec.graph != node.graph {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok((exec, node))
}

/// The kernel parameters node `node` keeps.
fn held_kernel_params(node: CUgraphNode) -> Result<Arc<HeldKernelParams>, u32> {
    match &*node_of_kind(node, NODE_KERNEL)?.params() {
        NodeParams::Kernel(held) => Ok(held.clone()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphKernelNodeGetParams_v2`: `kernelParams` points to one pointer
/// per argument, into values this library keeps until the node's
/// parameters change; `extra` is NULL.
pub(crate) fn kernel_node_get_params(
    node: CUgraphNode,
    params: *mut KernelNodeParams,
) -> Result<(), u32> {
    write_out(params, held_kernel_params(node)?.to_v2())
}

/// `cuGraphKernelNodeGetParams` with the older struct.
pub(crate) fn kernel_node_get_params_v1(
    node: CUgraphNode,
    params: *mut KernelNodeParamsV1,
) -> Result<(), u32> {
    let p = held_kernel_params(node)?.to_v2();
    write_out(
        params,
        KernelNodeParamsV1 {
            func: p.func,
            grid: p.grid,
            block: p.block,
            shared_mem_bytes: p.shared_mem_bytes,
            kernel_params: p.kernel_params,
            extra: p.extra,
        },
    )
}

fn kernel_node_set(node: CUgraphNode, p: &KernelNodeParams) -> Result<(), u32> {
    let node = node_of_kind(node, NODE_KERNEL)?;
    let (launch, held) = kernel_launch(&node.context, p)?;
    node.context.call(&Command::GraphKernelNodeSetParams {
        node: node.handle,
        launch,
    })?;
    *node.params() = NodeParams::Kernel(held);
    Ok(())
}

/// `cuGraphKernelNodeSetParams_v2`.
pub(crate) fn kernel_node_set_params(
    node: CUgraphNode,
    params: *const KernelNodeParams,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable CUDA_KERNEL_NODE_PARAMS.
    let p = unsafe { read_params(params) }?;
    kernel_node_set(node, &p)
}

/// `cuGraphKernelNodeSetParams` with the older struct.
pub(crate) fn kernel_node_set_params_v1(
    node: CUgraphNode,
    params: *const KernelNodeParamsV1,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable struct.
    let p = unsafe { read_params(params) }?;
    kernel_node_set(node, &p.to_v2())
}

fn exec_kernel_node_set(
    exec: CUgraphExec,
    node: CUgraphNode,
    p: &KernelNodeParams,
) -> Result<(), u32> {
    let (exec, node) = exec_node(exec, node, NODE_KERNEL)?;
    let (launch, _) = kernel_launch(&node.context, p)?;
    exec.context
        .call(&Command::GraphExecKernelNodeSetParams {
            exec: exec.handle,
            node: node.handle,
            launch,
        })
        .map(|_| ())
}

/// `cuGraphExecKernelNodeSetParams_v2`: the executable graph only.
pub(crate) fn exec_kernel_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const KernelNodeParams,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable CUDA_KERNEL_NODE_PARAMS.
    let p = unsafe { read_params(params) }?;
    exec_kernel_node_set(exec, node, &p)
}

/// `cuGraphExecKernelNodeSetParams` with the older struct.
pub(crate) fn exec_kernel_node_set_params_v1(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const KernelNodeParamsV1,
) -> Result<(), u32> {
    // SAFETY: the caller passes a readable struct.
    let p = unsafe { read_params(params) }?;
    exec_kernel_node_set(exec, node, &p.to_v2())
}

/// `cuGraphMemsetNodeGetParams`.
pub(crate) fn memset_node_get_params(
    node: CUgraphNode,
    params: *mut MemsetNodeParams,
) -> Result<(), u32> {
    match &*node_of_kind(node, NODE_MEMSET)?.params() {
        NodeParams::Memset(p) => write_out(params, *p),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// A memset node's parameters for `call`, read and checked (the host
/// checks the range): refused where they name page-locked memory of this
/// process only (network carrier), which no graph reaches.
///
/// # Safety
/// A non-NULL `params` points to a readable CUDA_MEMSET_NODE_PARAMS.
unsafe fn memset_params(
    call: &'static str,
    params: *const MemsetNodeParams,
) -> Result<MemsetNodeParams, u32> {
    // SAFETY: the caller's contract.
    let p = unsafe { read_params(params) }?;
    if !matches!(p.element_size, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // From the first byte to the last row's end; a span that overflows is
    // left to the host's range check.
    let span = (p.height as u64)
        .saturating_sub(1)
        .checked_mul(p.pitch as u64)
        .and_then(|rows| rows.checked_add((p.width as u64).checked_mul(p.element_size.into())?));
    if pinned::host_cannot_reach(p.dst, span.unwrap_or(1)) {
        return Err(pinned::unreachable(call, Unreachable::Graph));
    }
    Ok(p)
}

/// `cuGraphMemsetNodeSetParams`.
pub(crate) fn memset_node_set_params(
    node: CUgraphNode,
    params: *const MemsetNodeParams,
) -> Result<(), u32> {
    let node = node_of_kind(node, NODE_MEMSET)?;
    // SAFETY: the caller passes a readable struct.
    let p = unsafe { memset_params("cuGraphMemsetNodeSetParams", params) }?;
    node.context.call(&Command::GraphMemsetNodeSetParams {
        node: node.handle,
        dst: p.dst,
        value: p.value,
        element_size: p.element_size,
        width: p.width as u64,
        height: p.height as u64,
        pitch: p.pitch as u64,
    })?;
    *node.params() = NodeParams::Memset(p);
    Ok(())
}

/// `cuGraphExecMemsetNodeSetParams`: the executable graph only.
pub(crate) fn exec_memset_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const MemsetNodeParams,
    _ctx: *mut c_void,
) -> Result<(), u32> {
    let (exec, node) = exec_node(exec, node, NODE_MEMSET)?;
    // SAFETY: the caller passes a readable struct.
    let p = unsafe { memset_params("cuGraphExecMemsetNodeSetParams", params) }?;
    exec.context
        .call(&Command::GraphExecMemsetNodeSetParams {
            exec: exec.handle,
            node: node.handle,
            dst: p.dst,
            value: p.value,
            element_size: p.element_size,
            width: p.width as u64,
            height: p.height as u64,
            pitch: p.pitch as u64,
        })
        .map(|_| ())
}

/// What `cuGraphExecUpdate` answered: the call's result, the
/// `CUgraphExecUpdateResult` and the node of `graph` that failed it.
struct UpdateAnswer {
    result: u32,
    update_result: c_int,
    error_node: CUgraphNode,
}

fn exec_update_on(exec: CUgraphExec, graph: CUgraph) -> Result<UpdateAnswer, u32> {
    driver()?;
    let exec = GRAPH_EXECS.get(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !Arc::ptr_eq(&exec.context, &graph.context) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let payload = exec.context.call(&Command::GraphExecUpdate {
        exec: exec.handle,
        graph: graph.handle,
    })?;
    let [result, update_result, failed] =
        decode_u64s::<3>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if result == u64::from(CUDA_SUCCESS) {
        // The executable graph's host nodes now name `graph`'s gates: back
        // to its own, which take `graph`'s functions (paired in order, as
        // the update pairs nodes).
        let functions: Vec<(crate::host_functions::HostFunction, usize)> = graph
            .nodes()
            .iter()
            .filter_map(|n| NODES.get(*n as *mut c_void))
            .filter_map(|node| match *node.params() {
                NodeParams::Host { function, data, .. } => Some((function, data)),
                _ => None,
            })
            .collect();
        let gates = exec.gates().clone();
        for (held, (function, data)) in gates.iter().zip(functions) {
            crate::host_functions::rearm(held.gate.host, function, data as *mut c_void);
            exec.point_at_gate(held)?;
        }
    }
    let error_node = graph
        .nodes()
        .iter()
        .copied()
        .find(|n| {
            failed != 0
                && NODES
                    .get(*n as *mut c_void)
                    .is_some_and(|node| u64::from(node.handle) == failed)
        })
        .map_or(std::ptr::null_mut(), |n| n as CUgraphNode);
    Ok(UpdateAnswer {
        result: u32::try_from(result).unwrap_or(CUDA_ERROR_UNKNOWN),
        update_result: c_int::try_from(update_result).unwrap_or(c_int::MAX),
        error_node,
    })
}

/// `cuGraphExecUpdate_v2`: on the host driver, `exec` takes the
/// parameters of `graph`'s nodes (topologically identical to the graph it
/// was made from, nodes paired in the order they were added).
pub(crate) fn exec_update_v2(
    exec: CUgraphExec,
    graph: CUgraph,
    info: *mut ExecUpdateResultInfo,
) -> Result<(), u32> {
    let answer = exec_update_on(exec, graph)?;
    write_optional(
        info,
        ExecUpdateResultInfo {
            result: answer.update_result,
            error_node: answer.error_node,
            error_from_node: std::ptr::null_mut(),
        },
    );
    match answer.result {
        CUDA_SUCCESS => Ok(()),
        code => Err(code),
    }
}

/// `cuGraphExecUpdate`, the older form.
pub(crate) fn exec_update(
    exec: CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    update_result: *mut c_int,
) -> Result<(), u32> {
    let answer = exec_update_on(exec, graph)?;
    write_optional(error_node, answer.error_node);
    write_optional(update_result, answer.update_result);
    match answer.result {
        CUDA_SUCCESS => Ok(()),
        code => Err(code),
    }
}

fn upload_on(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Result<(), u32> {
    driver()?;
    let exec = GRAPH_EXECS.get(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    same_context(&ctx, &exec.context)?;
    ctx.call(&Command::GraphUpload {
        exec: exec.handle,
        stream: handle,
    })
    .map(|_| ())
}

/// `cuGraphUpload`: run on the host, where the driver prepares the launch.
pub(crate) fn upload(exec: CUgraphExec, stream: CUstream) -> Result<(), u32> {
    upload_on(exec, stream, false)
}

pub(crate) fn upload_ptsz(exec: CUgraphExec, stream: CUstream) -> Result<(), u32> {
    upload_on(exec, stream, true)
}

/// Writes `held` as `cuGraphNodeGetDependencies` does: NULL `nodes` asks
/// for the count; else up to `*count` entries are written (NULL past the
/// end of `held`, and default edge data where `edges` is given) and
/// `*count` becomes the number of nodes written.
fn write_nodes(
    held: &[usize],
    nodes: *mut CUgraphNode,
    edges: *mut EdgeData,
    count: *mut usize,
) -> Result<(), u32> {
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if nodes.is_null() {
        return write_out(count, held.len());
    }
    // SAFETY: checked non-NULL; the caller passes a readable count.
    let room = unsafe { count.read() };
    for i in 0..room {
        let node = held
            .get(i)
            .map_or(std::ptr::null_mut(), |n| *n as CUgraphNode);
        // SAFETY: `nodes` (and a non-NULL `edges`) has room for `room`
        // entries (the API contract); `i < room`.
        unsafe {
            nodes.add(i).write(node);
            if !edges.is_null() {
                edges.add(i).write(EdgeData { bytes: [0; 8] });
            }
        }
    }
    write_out(count, held.len().min(room))
}

/// `cuGraphNodeGetDependencies` (`_v2` with edge data), from what the
/// node was added with.
pub(crate) fn node_get_dependencies(
    node: CUgraphNode,
    dependencies: *mut CUgraphNode,
    count: *mut usize,
) -> Result<(), u32> {
    node_get_dependencies_v2(node, dependencies, std::ptr::null_mut(), count)
}

pub(crate) fn node_get_dependencies_v2(
    node: CUgraphNode,
    dependencies: *mut CUgraphNode,
    edges: *mut EdgeData,
    count: *mut usize,
) -> Result<(), u32> {
    let node = NODES.get(node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let held = match graph_of(&node).filter(|_| edges_on_host(&node)) {
        Some(graph) => driver_nodes(&graph, name_nodes::DEPENDENCIES, node.handle)?,
        None => node.dependencies().clone(),
    };
    write_nodes(&held, dependencies, edges, count)
}

/// `cuGraphNodeGetDependentNodes` (`_v2` with edge data): the nodes of
/// its graph that depend on it, in the order they were added.
pub(crate) fn node_get_dependent_nodes(
    node: CUgraphNode,
    dependents: *mut CUgraphNode,
    count: *mut usize,
) -> Result<(), u32> {
    node_get_dependent_nodes_v2(node, dependents, std::ptr::null_mut(), count)
}

pub(crate) fn node_get_dependent_nodes_v2(
    node: CUgraphNode,
    dependents: *mut CUgraphNode,
    edges: *mut EdgeData,
    count: *mut usize,
) -> Result<(), u32> {
    let me = NODES.get(node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let key = node as usize;
    let graph = graph_of(&me).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if edges_on_host(&me) {
        let held = driver_nodes(&graph, name_nodes::DEPENDENTS, me.handle)?;
        return write_nodes(&held, dependents, edges, count);
    }
    let held: Vec<usize> = graph
        .nodes()
        .iter()
        .copied()
        .filter(|n| {
            NODES
                .get(*n as *mut c_void)
                .is_some_and(|other| other.dependencies().contains(&key))
        })
        .collect();
    write_nodes(&held, dependents, edges, count)
}

/// The nodes of a graph built here (their registry handles and nodes).
fn built_nodes(graph: &Graph) -> (Vec<usize>, Vec<Arc<Node>>) {
    graph
        .nodes()
        .iter()
        .filter_map(|n| NODES.get(*n as *mut c_void).map(|node| (*n, node)))
        .unzip()
}

/// Whether `node` has edges only the host's driver knows: it is in a
/// graph that stream capture recorded into.
fn edges_on_host(node: &Node) -> bool {
    matches!(*node.params(), NodeParams::Driver) || graph_of(node).is_some_and(|g| g.captured())
}

/// `cuGraphGetRootNodes`: the nodes that depend on none, in the order they
/// were added.
pub(crate) fn get_root_nodes(
    graph: CUgraph,
    roots: *mut CUgraphNode,
    count: *mut usize,
) -> Result<(), u32> {
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // A captured graph's roots are the host driver's (XLA checks that a
    // trace recorded something): counted there, named when asked for.
    let held: Vec<usize> = if graph.captured() {
        if roots.is_null() {
            let roots = host_count(
                &graph,
                Command::GraphGetRootNodeCount {
                    graph: graph.handle,
                },
            )?;
            return write_out(count, roots);
        }
        driver_nodes(&graph, name_nodes::ROOTS, graph.handle)?
    } else {
        let (keys, nodes) = built_nodes(&graph);
        keys.into_iter()
            .zip(&nodes)
            .filter(|(_, node)| node.dependencies().is_empty())
            .map(|(key, _)| key)
            .collect()
    };
    if roots.is_null() {
        return write_out(count, held.len());
    }
    // SAFETY: checked non-NULL; the caller passes a readable count.
    let room = unsafe { count.read() };
    for (i, node) in held.iter().take(room).enumerate() {
        // SAFETY: `roots` has room for `room` handles (the API contract).
        unsafe { roots.add(i).write(*node as CUgraphNode) };
    }
    write_out(count, held.len().min(room))
}

/// An edge: (dependency, dependent), as registry handles.
type Edge = (usize, usize);

/// A graph's nodes (registry handles) and its edges as (dependency,
/// dependent) pairs, by dependent: from the host's driver for a graph
/// that stream capture recorded into (each node's dependencies asked
/// there), else as the nodes were added here.
fn nodes_and_edges(graph: &Graph) -> Result<(Vec<usize>, Vec<Edge>), u32> {
    if graph.captured() {
        let keys = driver_nodes(graph, name_nodes::NODES, graph.handle)?;
        let mut pairs = Vec::new();
        for key in &keys {
            let node = NODES
                .get(*key as CUgraphNode)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            for dependency in driver_nodes(graph, name_nodes::DEPENDENCIES, node.handle)? {
                pairs.push((dependency, *key));
            }
        }
        return Ok((keys, pairs));
    }
    let (keys, nodes) = built_nodes(graph);
    let pairs = keys
        .iter()
        .zip(&nodes)
        .flat_map(|(key, node)| {
            node.dependencies()
                .iter()
                .map(|d| (*d, *key))
                .collect::<Vec<_>>()
        })
        .collect();
    Ok((keys, pairs))
}

/// `cuGraphGetEdges`.
pub(crate) fn get_edges(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    count: *mut usize,
) -> Result<(), u32> {
    get_edges_v2(graph, from, to, std::ptr::null_mut(), count)
}

/// `cuGraphGetEdges_v2`: every (dependency, dependent) pair, by dependent
/// in the order the nodes were added; all edges are plain (default edge
/// data).
pub(crate) fn get_edges_v2(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    edges: *mut EdgeData,
    count: *mut usize,
) -> Result<(), u32> {
    driver()?;
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (_, pairs) = nodes_and_edges(&graph)?;
    if count.is_null() || from.is_null() != to.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if from.is_null() {
        return write_out(count, pairs.len());
    }
    // SAFETY: checked non-NULL; the caller passes a readable count.
    let room = unsafe { count.read() };
    for i in 0..room {
        let (f, t) = pairs
            .get(i)
            .map_or((std::ptr::null_mut(), std::ptr::null_mut()), |p| {
                (p.0 as CUgraphNode, p.1 as CUgraphNode)
            });
        // SAFETY: `from`, `to` (and a non-NULL `edges`) have room for
        // `room` entries (the API contract); `i < room`.
        unsafe {
            from.add(i).write(f);
            to.add(i).write(t);
            if !edges.is_null() {
                edges.add(i).write(EdgeData { bytes: [0; 8] });
            }
        }
    }
    write_out(count, pairs.len().min(room))
}

/// `cuGraphNodeFindInClone`: the node of `clone` copied from `original`.
pub(crate) fn node_find_in_clone(
    found: *mut CUgraphNode,
    original: CUgraphNode,
    clone: CUgraph,
) -> Result<(), u32> {
    driver()?;
    let clone = GRAPHS.get(clone).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let copy = clone
        .originals
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&(original as usize))
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_out(found, copy as CUgraphNode)
}

/// `cuGraphEventRecordNodeGetEvent`.
pub(crate) fn event_record_node_get_event(
    node: CUgraphNode,
    event: *mut CUevent,
) -> Result<(), u32> {
    node_event(node, NODE_EVENT_RECORD, event)
}

/// `cuGraphEventWaitNodeGetEvent`.
pub(crate) fn event_wait_node_get_event(node: CUgraphNode, event: *mut CUevent) -> Result<(), u32> {
    node_event(node, NODE_WAIT_EVENT, event)
}

fn node_event(node: CUgraphNode, kind: c_int, event: *mut CUevent) -> Result<(), u32> {
    match *node_of_kind(node, kind)?.params() {
        NodeParams::Event(held) => write_out(event, held as CUevent),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphEventRecordNodeSetEvent` / `cuGraphEventWaitNodeSetEvent`.
fn node_set_event(node: CUgraphNode, kind: c_int, event: CUevent) -> Result<(), u32> {
    let node = node_of_kind(node, kind)?;
    let held = crate::api::event::named(event)?;
    same_context(&node.context, &held.context)?;
    node.context.call(&Command::GraphEventNodeSetEvent {
        node: node.handle,
        event: held.handle,
        wait: u32::from(kind == NODE_WAIT_EVENT),
    })?;
    *node.params() = NodeParams::Event(event as usize);
    Ok(())
}

pub(crate) fn event_record_node_set_event(node: CUgraphNode, event: CUevent) -> Result<(), u32> {
    node_set_event(node, NODE_EVENT_RECORD, event)
}

pub(crate) fn event_wait_node_set_event(node: CUgraphNode, event: CUevent) -> Result<(), u32> {
    node_set_event(node, NODE_WAIT_EVENT, event)
}

/// `cuGraphExecEventRecordNodeSetEvent` / `...WaitNodeSetEvent`: the
/// executable graph only.
fn exec_node_set_event(
    exec: CUgraphExec,
    node: CUgraphNode,
    kind: c_int,
    event: CUevent,
) -> Result<(), u32> {
    let (exec, node) = exec_node(exec, node, kind)?;
    let held = crate::api::event::named(event)?;
    same_context(&exec.context, &held.context)?;
    exec.context
        .call(&Command::GraphExecEventNodeSetEvent {
            exec: exec.handle,
            node: node.handle,
            event: held.handle,
            wait: u32::from(kind == NODE_WAIT_EVENT),
        })
        .map(|_| ())
}

pub(crate) fn exec_event_record_node_set_event(
    exec: CUgraphExec,
    node: CUgraphNode,
    event: CUevent,
) -> Result<(), u32> {
    exec_node_set_event(exec, node, NODE_EVENT_RECORD, event)
}

pub(crate) fn exec_event_wait_node_set_event(
    exec: CUgraphExec,
    node: CUgraphNode,
    event: CUevent,
) -> Result<(), u32> {
    exec_node_set_event(exec, node, NODE_WAIT_EVENT, event)
}

/// `cuGraphExecChildGraphNodeSetParams`: the child graph node of `exec`
/// takes `child`'s parameters (the host's driver asks for the same
/// topology).
pub(crate) fn exec_child_graph_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> Result<(), u32> {
    let (exec, node) = exec_node(exec, node, NODE_GRAPH)?;
    let child = GRAPHS.get(child).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    same_context(&exec.context, &child.context)?;
    child.embedded.store(true, Ordering::Release);
    exec.context
        .call(&Command::GraphExecChildGraphNodeSetParams {
            exec: exec.handle,
            node: node.handle,
            child: child.handle,
        })
        .map(|_| ())
}

/// Node `node` of the graph `exec` was instantiated from, any kind (the
/// host's driver refuses the kinds it cannot enable or disable).
fn exec_any_node(exec: CUgraphExec, node: CUgraphNode) -> Result<(Arc<GraphExec>, Arc<Node>), u32> {
    driver()?;
    let kind = NODES.get(node).ok_or(CUDA_ERROR_INVALID_VALUE)?.kind;
    exec_node(exec, node, kind)
}

/// `cuGraphNodeSetEnabled`: kernel, memset and memcpy nodes of `exec`.
pub(crate) fn node_set_enabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: c_uint,
) -> Result<(), u32> {
    let (exec, node) = exec_any_node(exec, node)?;
    exec.context
        .call(&Command::GraphExecNodeSetEnabled {
            exec: exec.handle,
            node: node.handle,
            enabled: u32::from(enabled != 0),
        })
        .map(|_| ())
}

/// `cuGraphNodeGetEnabled`.
pub(crate) fn node_get_enabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: *mut c_uint,
) -> Result<(), u32> {
    let (exec, node) = exec_any_node(exec, node)?;
    let answer = exec.context.call(&Command::GraphExecNodeGetEnabled {
        exec: exec.handle,
        node: node.handle,
    })?;
    let [value] = decode_u64s::<1>(&answer).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(enabled, c_uint::from(value != 0))
}

/// `CUlaunchAttributeValue`, the value of a kernel node's attribute.
pub type KernelNodeAttributeValue = [u32; 16];

/// `cuGraphKernelNodeSetAttribute`: the host's driver sets it; a cluster
/// dimension, cooperativity and every attribute a launch takes but events.
pub(crate) fn kernel_node_set_attribute(
    node: CUgraphNode,
    id: c_int,
    value: *const KernelNodeAttributeValue,
) -> Result<(), u32> {
    use rgpu_proto::command::{launch_attribute as attr, LaunchAttr};
    let node = node_of_kind(node, NODE_KERNEL)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUlaunchAttributeValue.
    let w = unsafe { value.read() };
    let id = u32::try_from(id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    match id {
        attr::CLUSTER_DIMENSION
        | attr::COOPERATIVE
        | attr::ACCESS_POLICY_WINDOW
        | attr::SYNCHRONIZATION_POLICY
        | attr::CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | attr::PRIORITY
        | attr::MEM_SYNC_DOMAIN_MAP
        | attr::MEM_SYNC_DOMAIN
        | attr::PREFERRED_CLUSTER_DIMENSION
        | attr::PREFERRED_SHARED_MEMORY_CARVEOUT => {}
        // A launch's events are no node's: driver 580 refuses them so.
        attr::PROGRAMMATIC_EVENT | attr::LAUNCH_COMPLETION_EVENT => {
            log::debug!("rgpu: cuGraphKernelNodeSetAttribute: attribute {id} names an event");
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        other => {
            log::warn!(
                "rgpu: cuGraphKernelNodeSetAttribute: attribute {other} ({:?}) is not supported",
                &w[..4]
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    node.context
        .call(&Command::GraphKernelNodeSetAttribute {
            node: node.handle,
            attribute: vec![LaunchAttr::from_union(id, &w)],
        })
        .map(|_| ())
}

/// `cuGraphKernelNodeGetAttribute`: as the host's driver holds it.
pub(crate) fn kernel_node_get_attribute(
    node: CUgraphNode,
    id: c_int,
    value: *mut KernelNodeAttributeValue,
) -> Result<(), u32> {
    let node = node_of_kind(node, NODE_KERNEL)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let id = u32::try_from(id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let answer = node.context.call(&Command::GraphKernelNodeGetAttribute {
        node: node.handle,
        id,
    })?;
    let words = decode_value_union(&answer).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(value, words)
}

/// `cuGraphKernelNodeCopyAttributes`: `dst` takes `src`'s, two kernel
/// nodes of one context.
pub(crate) fn kernel_node_copy_attributes(dst: CUgraphNode, src: CUgraphNode) -> Result<(), u32> {
    let (dst, src) = (
        node_of_kind(dst, NODE_KERNEL)?,
        node_of_kind(src, NODE_KERNEL)?,
    );
    same_context(&dst.context, &src.context)?;
    dst.context
        .call(&Command::GraphKernelNodeCopyAttributes {
            dst: dst.handle,
            src: src.handle,
        })
        .map(|_| ())
}

/// `cuGraphExecGetFlags`: the flags it was instantiated with.
pub(crate) fn exec_get_flags(exec: CUgraphExec, flags: *mut c_ulonglong) -> Result<(), u32> {
    driver()?;
    let exec = GRAPH_EXECS.get(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_out(flags, exec.flags)
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    flags: c_ulonglong,
    upload_stream: CUstream,
    error_node: CUgraphNode,
    result: c_int,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: upload on `upload_stream` too.
const INSTANTIATE_FLAG_UPLOAD: c_ulonglong = 2;
/// `CUDA_GRAPH_INSTANTIATE_SUCCESS`, `_ERROR`.
const INSTANTIATE_SUCCESS: c_int = 0;
const INSTANTIATE_ERROR: c_int = 1;

/// `cuGraphInstantiateWithParams`: as with flags, then an upload when
/// asked; the result and (no) error node written back.
pub(crate) fn instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut InstantiateParams,
) -> Result<(), u32> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a CUDA_GRAPH_INSTANTIATE_PARAMS.
    let p = unsafe { &mut *params };
    p.error_node = std::ptr::null_mut();
    // The upload is this call's, not a flag of the executable graph.
    let made =
        instantiate_with_flags(exec, graph, p.flags & !INSTANTIATE_FLAG_UPLOAD).and_then(|()| {
            if p.flags & INSTANTIATE_FLAG_UPLOAD == 0 {
                return Ok(());
            }
            // SAFETY: `exec` was just written by the instantiation.
            upload(unsafe { exec.read() }, p.upload_stream)
        });
    p.result = if made.is_ok() {
        INSTANTIATE_SUCCESS
    } else {
        INSTANTIATE_ERROR
    };
    made
}

/// `cuGraphDebugDotPrint`: the graph in Graphviz's language, one node per
/// line with its kind, one edge per dependency.
pub(crate) fn debug_dot_print(
    graph: CUgraph,
    path: *const c_char,
    _flags: c_uint,
) -> Result<(), u32> {
    if path.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a NUL-terminated path.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    driver()?;
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (keys, pairs) = nodes_and_edges(&graph)?;
    let node = |key: usize| NODES.get(key as CUgraphNode);
    let mut dot = format!("digraph rgpu_graph_{} {{\n", graph.handle);
    for held in keys.iter().filter_map(|k| node(*k)) {
        dot.push_str(&format!(
            "  n{} [label=\"{} (type {})\"];\n",
            held.handle, held.handle, held.kind
        ));
    }
    for (from, to) in &pairs {
        if let (Some(from), Some(to)) = (node(*from), node(*to)) {
            dot.push_str(&format!("  n{} -> n{};\n", from.handle, to.handle));
        }
    }
    dot.push_str("}\n");
    use std::os::unix::ffi::OsStrExt;
    std::fs::write(std::ffi::OsStr::from_bytes(path.to_bytes()), dot).map_err(|e| {
        log::warn!("rgpu: cuGraphDebugDotPrint: {e}");
        CUDA_ERROR_OPERATING_SYSTEM
    })
}

/// The graph a node of `node`'s belongs to.
fn graph_of(node: &Node) -> Option<Arc<Graph>> {
    GRAPHS
        .values()
        .into_iter()
        .find(|g| Arc::ptr_eq(&g.context, &node.context) && g.handle == node.graph)
}

/// `count` nodes at `nodes`, each a node of `graph` other than a host
/// node (three nodes on the host, whose edges are not offered).
fn edge_ends(
    graph: &Graph,
    nodes: *const CUgraphNode,
    count: usize,
) -> Result<Vec<(usize, Arc<Node>)>, u32> {
    // SAFETY: the caller checked `nodes` non-NULL and `count` bounded; the
    // API contract gives `count` handles there.
    let handles = unsafe { std::slice::from_raw_parts(nodes, count) };
    handles
        .iter()
        .map(|h| {
            let node = NODES.get(*h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if !Arc::ptr_eq(&node.context, &graph.context) || node.graph != graph.handle {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok((*h as usize, node))
        })
        .collect()
}

/// Adds (`add`) or removes the edges `from[i]` -> `to[i]`.
fn change_edges(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
    add: bool,
) -> Result<(), u32> {
    driver()?;
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if count == 0 {
        return Ok(());
    }
    if from.is_null() || to.is_null() || count > MAX_NODE_DEPENDENCIES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let from = edge_ends(&graph, from, count)?;
    let to = edge_ends(&graph, to, count)?;
    // A host node's edges start at its last node on the host (its
    // handle) and end at its first.
    let from_handles = from.iter().map(|(_, n)| n.handle).collect();
    let to_handles = to
        .iter()
        .map(|(_, n)| match *n.params() {
            NodeParams::Host { nodes, .. } => nodes[0],
            _ => n.handle,
        })
        .collect();
    let graph_handle = graph.handle;
    graph.context.call(&if add {
        Command::GraphAddDependencies {
            graph: graph_handle,
            from: from_handles,
            to: to_handles,
        }
    } else {
        Command::GraphRemoveDependencies {
            graph: graph_handle,
            from: from_handles,
            to: to_handles,
        }
    })?;
    for ((from_key, _), (_, to_node)) in from.iter().zip(&to) {
        let mut dependencies = to_node.dependencies();
        if add && !dependencies.contains(from_key) {
            dependencies.push(*from_key);
        } else if !add {
            dependencies.retain(|d| d != from_key);
        }
    }
    Ok(())
}

/// `cuGraphAddDependencies`: `to[i]` depends on `from[i]` from now on.
pub(crate) fn add_dependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> Result<(), u32> {
    add_dependencies_v2(graph, from, to, std::ptr::null(), count)
}

/// `cuGraphAddDependencies_v2`: plain edges only (programmatic ones as
/// plain, as `cuGraphAddNode_v2` takes them).
pub(crate) fn add_dependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
) -> Result<(), u32> {
    plain_dependencies("cuGraphAddDependencies_v2", edges, count)?;
    change_edges(graph, from, to, count, true)
}

/// `cuGraphRemoveDependencies`.
pub(crate) fn remove_dependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> Result<(), u32> {
    remove_dependencies_v2(graph, from, to, std::ptr::null(), count)
}

/// `cuGraphRemoveDependencies_v2`.
pub(crate) fn remove_dependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
) -> Result<(), u32> {
    plain_dependencies("cuGraphRemoveDependencies_v2", edges, count)?;
    change_edges(graph, from, to, count, false)
}

/// `cuGraphDestroyNode`: the node leaves its graph, with its edges (not
/// offered for host nodes, nor in graphs with memory nodes).
pub(crate) fn destroy_node(node: CUgraphNode) -> Result<(), u32> {
    driver()?;
    let held = NODES.get(node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let host = match *held.params() {
        NodeParams::Host { gate, nodes, .. } => Some((gate, nodes)),
        _ => None,
    };
    match host {
        // Its three nodes on the host, the last (its handle) first.
        Some((_, nodes)) => {
            for node in nodes.iter().rev() {
                held.context
                    .call(&Command::GraphDestroyNode { node: *node })?;
            }
        }
        None => {
            held.context
                .call(&Command::GraphDestroyNode { node: held.handle })?;
        }
    }
    NODES.remove(node);
    let key = node as usize;
    let graph = graph_of(&held);
    if let Some((gate, _)) = host {
        if !graph
            .as_ref()
            .is_some_and(|g| g.embedded.load(Ordering::Acquire))
        {
            crate::host_functions::disarm(held.context.id, gate.host);
        }
    }
    if let Some(graph) = graph {
        graph.nodes().retain(|n| *n != key);
        for other in graph
            .nodes()
            .iter()
            .filter_map(|n| NODES.get(*n as *mut c_void))
        {
            other.dependencies().retain(|d| *d != key);
        }
    }
    Ok(())
}

/// `cuThreadExchangeStreamCaptureMode`: the calling thread's mode is
/// swapped with `*mode`. (The host's driver enforces capture rules on its
/// own thread; this keeps the value the runtime asks back.)
pub(crate) fn exchange_capture_mode(mode: *mut c_int) -> Result<(), u32> {
    if mode.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the caller passes a readable, writable int.
    let wanted = unsafe { mode.read() };
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&wanted) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let previous = THREAD_CAPTURE_MODE.with(|m| m.replace(wanted));
    write_out(mode, previous)
}

/// `CU_STREAM_CAPTURE_STATUS_*` of a stream in capture `capture` (or none).
pub(crate) fn status_of(capture: Option<u64>) -> c_int {
    match capture {
        Some(_) => CAPTURE_STATUS_ACTIVE,
        None => CAPTURE_STATUS_NONE,
    }
}

/// `CUgraphNodeParams`: a node's type, then the parameters its
/// `cuGraphAdd*Node` takes, in a 232-byte union (256 bytes in all).
#[repr(C)]
pub struct GraphNodeParams {
    node_type: c_int,
    reserved0: [c_int; 3],
    params: [u64; 29],
    reserved2: i64,
}

/// `CUDA_MEMCPY_NODE_PARAMS`: flags, a reserved word and the copy's
/// context come before its `CUDA_MEMCPY3D`.
const MEMCPY_NODE_COPY_OFFSET: usize = 16;

/// The `CUDA_MEMCPY3D` of the `CUDA_MEMCPY_NODE_PARAMS` in a
/// `CUgraphNodeParams` union.
fn memcpy_of(params: *mut GraphNodeParams) -> *const Memcpy3D {
    // SAFETY: the union lies inside the caller's CUgraphNodeParams, which
    // is larger than this offset plus a CUDA_MEMCPY3D; only the address is
    // computed here.
    unsafe { union_of::<u8>(params).add(MEMCPY_NODE_COPY_OFFSET) }.cast()
}

/// The union of `params` as the struct of its node type.
fn union_of<T>(params: *mut GraphNodeParams) -> *mut T {
    // SAFETY: only an address computation inside the caller's struct,
    // whose union starts at byte 16 (`params` was checked non-NULL).
    unsafe { params.cast::<u8>().add(16).cast::<T>() }
}

/// The first field of the union of `params` (an event node's event, a
/// child graph node's graph).
fn union_field<T: Copy>(params: *mut GraphNodeParams) -> Result<T, u32> {
    // SAFETY: the caller checked `params` non-NULL and the node type whose
    // parameters start with a `T`; the union is large enough for it.
    Ok(unsafe { union_of::<T>(params).read_unaligned() })
}

/// A node type the generic calls do not take (yet): logged once per type.
fn unsupported_node_type(call: &str, node_type: c_int) -> u32 {
    static LOGGED: std::sync::Mutex<Vec<c_int>> = std::sync::Mutex::new(Vec::new());
    let first = LOGGED.lock().is_ok_and(|mut logged| {
        let first = !logged.contains(&node_type);
        if first {
            logged.push(node_type);
        }
        first
    });
    if first {
        log::warn!("rgpu: {call} of a node of type {node_type} is not supported");
    }
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuGraphAddNode`: the generic form of every `cuGraphAdd*Node`.
pub(crate) fn add_node_generic(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *mut GraphNodeParams,
) -> Result<(), u32> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUgraphNodeParams.
    let node_type = unsafe { (*params).node_type };
    match node_type {
        NODE_KERNEL => add_kernel_node(out, graph, dependencies, count, union_of(params)),
        NODE_MEMCPY => add_memcpy_node(
            out,
            graph,
            dependencies,
            count,
            memcpy_of(params),
            null_mut(),
        ),
        NODE_MEMSET => add_memset_node(
            out,
            graph,
            dependencies,
            count,
            union_of(params),
            null_mut(),
        ),
        NODE_GRAPH => {
            // SAFETY: the union holds a CUDA_CHILD_GRAPH_NODE_PARAMS.
            let child = unsafe { union_of::<CUgraph>(params).read() };
            add_child_graph_node(out, graph, dependencies, count, child)
        }
        NODE_EMPTY => add_empty_node(out, graph, dependencies, count),
        NODE_WAIT_EVENT | NODE_EVENT_RECORD => {
            // SAFETY: the union holds a CUDA_EVENT_*_NODE_PARAMS.
            let event = unsafe { union_of::<CUevent>(params).read() };
            add_event_node(out, graph, dependencies, count, event, node_type)
        }
        NODE_MEM_ALLOC => add_mem_alloc_node(out, graph, dependencies, count, union_of(params)),
        NODE_HOST => add_host_node(out, graph, dependencies, count, union_of(params)),
        NODE_MEM_FREE => {
            // SAFETY: the union holds a CUDA_MEM_FREE_NODE_PARAMS.
            let dptr = unsafe { union_of::<CUdeviceptr>(params).read() };
            add_mem_free_node(out, graph, dependencies, count, dptr)
        }
        _ => Err(unsupported_node_type("cuGraphAddNode", node_type)),
    }
}

/// `cuGraphAddNode_v2`: with edge data. A programmatic edge lets the
/// dependent kernel start before the one it depends on has finished, up
/// to its `cudaGridDependencySynchronize`; as a full dependency it orders
/// strictly more (the wait then returns at once).
pub(crate) fn add_node_generic_v2(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edges: *const EdgeData,
    count: usize,
    params: *mut GraphNodeParams,
) -> Result<(), u32> {
    plain_dependencies("cuGraphAddNode_v2", edges, count)?;
    add_node_generic(out, graph, dependencies, count, params)
}

/// `cuGraphNodeSetParams`: kernel, memset, memcpy, host and event nodes.
pub(crate) fn node_set_params_generic(
    node: CUgraphNode,
    params: *mut GraphNodeParams,
) -> Result<(), u32> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUgraphNodeParams.
    match unsafe { (*params).node_type } {
        NODE_KERNEL => kernel_node_set_params(node, union_of(params)),
        NODE_MEMSET => memset_node_set_params(node, union_of(params)),
        NODE_MEMCPY => memcpy_node_set_params(node, memcpy_of(params)),
        NODE_HOST => host_node_set_params(node, union_of(params)),
        kind @ (NODE_EVENT_RECORD | NODE_WAIT_EVENT) => {
            node_set_event(node, kind, union_field(params)?)
        }
        other => Err(unsupported_node_type("cuGraphNodeSetParams", other)),
    }
}

/// `cuGraphExecNodeSetParams`: kernel, memset, memcpy, event, host and
/// child graph nodes.
pub(crate) fn exec_node_set_params_generic(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *mut GraphNodeParams,
) -> Result<(), u32> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUgraphNodeParams.
    match unsafe { (*params).node_type } {
        NODE_KERNEL => exec_kernel_node_set_params(exec, node, union_of(params)),
        NODE_MEMSET => exec_memset_node_set_params(exec, node, union_of(params), null_mut()),
        NODE_MEMCPY => exec_memcpy_node_set_params(exec, node, memcpy_of(params), null_mut()),
        kind @ (NODE_EVENT_RECORD | NODE_WAIT_EVENT) => {
            exec_node_set_event(exec, node, kind, union_field(params)?)
        }
        NODE_GRAPH => exec_child_graph_node_set_params(exec, node, union_field(params)?),
        NODE_HOST => exec_host_node_set_params(exec, node, union_of(params)),
        other => Err(unsupported_node_type("cuGraphExecNodeSetParams", other)),
    }
}

/// `CUDA_HOST_NODE_PARAMS` (`_v2` adds a sync mode after it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HostNodeParams {
    function: Option<crate::host_functions::HostFunction>,
    data: *mut c_void,
}

/// `cuGraphAddHostNode`: three memory-operation nodes on the host (raise
/// the gate's request, wait until it is done, reset it) around a gate that
/// stays armed, so every launch of the graph runs the function in this
/// process, in order (see `crate::host_functions`).
pub(crate) fn add_host_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *const HostNodeParams,
) -> Result<(), u32> {
    driver()?;
    if out.is_null() || params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUDA_HOST_NODE_PARAMS.
    let p = unsafe { params.read() };
    let function = crate::host_functions::checked(p.function)?;
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx = graph.context.clone();
    let (registered, deps): (Vec<usize>, Vec<u32>) = dependency_handles(&ctx, dependencies, count)?
        .into_iter()
        .unzip();
    let Some(gate) = crate::host_functions::arm_for_graph(&ctx, function, p.data) else {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            log::warn!(
                "rgpu: cuGraphAddHostNode is not supported where the host's GPU cannot reach \
                 page-locked memory (as over the network carrier, which shares no memory with \
                 the host)"
            );
        });
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    };
    let nodes = [ctx.new_handle()?, ctx.new_handle()?, ctx.new_handle()?];
    let mut after = deps;
    for (node, (wait, address, value, flags)) in nodes.iter().zip(gate_ops(&gate)) {
        let added = ctx.call(&Command::GraphAddMemOpNode {
            graph: graph.handle,
            node: *node,
            dependencies: std::mem::replace(&mut after, vec![*node]),
            wait,
            width: 4,
            address,
            value,
            flags,
        });
        if let Err(code) = added {
            crate::host_functions::disarm(ctx.id, gate.host);
            return Err(code);
        }
    }
    let node = Arc::new(Node {
        context: ctx,
        graph: graph.handle,
        handle: nodes[2],
        kind: NODE_HOST,
        dependencies: Mutex::new(registered),
        params: Mutex::new(NodeParams::Host {
            function,
            data: p.data as usize,
            gate,
            nodes,
        }),
    });
    let key = NODES.insert(node);
    graph.nodes().push(key as usize);
    write_out(out, key)
}

/// `cuGraphHostNodeGetParams`: the function and argument as last set.
pub(crate) fn host_node_get_params(
    node: CUgraphNode,
    params: *mut HostNodeParams,
) -> Result<(), u32> {
    let node = node_of_kind(node, NODE_HOST)?;
    let NodeParams::Host { function, data, .. } = *node.params() else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    write_out(
        params,
        HostNodeParams {
            function: Some(function),
            data: data as *mut c_void,
        },
    )
}

/// `cuGraphHostNodeSetParams`: the graph's gate for the node (clones and
/// child copies share it; executable graphs made from now on take the
/// new function, those made before keep theirs, as natively).
pub(crate) fn host_node_set_params(
    node: CUgraphNode,
    params: *const HostNodeParams,
) -> Result<(), u32> {
    let node = node_of_kind(node, NODE_HOST)?;
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUDA_HOST_NODE_PARAMS.
    let p = unsafe { params.read() };
    let function = crate::host_functions::checked(p.function)?;
    let mut held = node.params();
    let NodeParams::Host { gate, nodes, .. } = *held else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    crate::host_functions::rearm(gate.host, function, p.data);
    *held = NodeParams::Host {
        function,
        data: p.data as usize,
        gate,
        nodes,
    };
    Ok(())
}

/// `cuGraphExecHostNodeSetParams`: the host node's gate in `exec` (each
/// executable graph has its own) runs the new function and argument from
/// its next launch on.
pub(crate) fn exec_host_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const HostNodeParams,
) -> Result<(), u32> {
    let (exec, _) = exec_node(exec, node, NODE_HOST)?;
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUDA_HOST_NODE_PARAMS.
    let p = unsafe { params.read() };
    let function = crate::host_functions::checked(p.function)?;
    let key = node as usize;
    let gates = exec.gates();
    let held = gates
        .iter()
        .find(|g| g.node == key)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    crate::host_functions::rearm(held.gate.host, function, p.data);
    Ok(())
}

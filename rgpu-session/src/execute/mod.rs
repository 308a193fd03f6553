//! Executing one ring command against the session's device context: guest
//! handles, blob ranges and device pointers are checked and translated
//! here, then handed to the executor; the session's limits are kept here.
//! [`Worker::execute`] creates the context when a command first needs it
//! and hands each command to its handler, one function per command in the
//! module of its table group (context, memory, module, stream, event,
//! graph, vmm, ipc, tensor_map), with the session's state in an [`Env`].

use std::collections::HashMap;
use std::os::fd::AsFd;

use rgpu_executor::{
    ContextExecutor, Copy3D, CuResult, DriverNodes, Executor, GraphNode, HostRun,
    KernelNodeAttribute, LaunchHint, LaunchOptions, MemoryOp,
};
use rgpu_proto::command::{launch_attribute, name_nodes};
use rgpu_proto::cuda_result::{
    CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN,
    CUDA_SUCCESS,
};

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the one flag of
/// `cuIpcOpenMemHandle` (NVIDIA documents it as required; 0 is taken too).
const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;
use rgpu_proto::command::Launch;
use rgpu_proto::reply::{u64_payload, value_union_payload, DeviceStatus, UTILIZATION_UNKNOWN};
use rgpu_proto::wire::WireWriter;
use rgpu_proto::{BlobRange, Command, LaunchAttr, STREAM_PER_THREAD};

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: u32 = 2;

use crate::device_ranges::{Inserted, RangeKind, RangeOwner};
use crate::driver_memory::Refresh;
use crate::handles::{
    check_new, FunctionEntry, GraphAllocation, GraphNodes, Handles, IpcMapping, Physical,
};
use crate::ipc::{event_key, IpcKind};
use crate::limits::{check_room, SessionLimits, LIMIT_ERROR};
use crate::module_cache::{image_hash, ModuleCache};
use crate::shareable::{physical_key, SHAREABLE_TOKEN_BYTES};
use crate::shared_ledger::{token_key, ShareKey};
use crate::tenant::Usage;
use crate::worker::{Attached, DeviceContext, Worker};
use crate::{clamp_to_budget, warn_limited, Counters, Tenant};

// One handler per command, by the command table's groups.
mod context;
mod event;
mod graph;
mod ipc;
mod memory;
mod module;
mod stream;
mod tensor_map;
mod vmm;

/// What a command's handler works with: the session's state, borrowed for
/// one command.
struct Env<'a> {
    reply_seq: u64,
    usage: &'a Usage,
    tenant: &'a Tenant,
    limits: SessionLimits,
    ctx_id: u32,
    executor: &'a dyn Executor,
    ctx: &'a mut dyn ContextExecutor,
    handles: &'a mut Handles,
    counters: &'a Counters,
    blobs: &'a HashMap<u32, Attached>,
    channel_blob: Option<u32>,
    module_cache: &'a ModuleCache,
}

/// The session's ownership of a device range of `kind`.
fn range_owner(usage: &Usage, kind: RangeKind) -> RangeOwner {
    RangeOwner {
        session: usage.member,
        kind,
    }
}

/// Counts a copy's bytes as staged or zero-copy, and unregistered.
fn count_copy(counters: &Counters, resolved: &Resolved, bytes: u64) {
    let counter = if resolved.staged {
        &counters.staged_bytes
    } else {
        &counters.zero_copy_bytes
    };
    Counters::add(counter, bytes);
    if !resolved.dma_registered {
        Counters::add(&counters.unregistered_copy_bytes, bytes);
    }
}

/// Where a blob range of a copy lives.
struct Resolved {
    runs: Vec<HostRun>,
    /// In the channel's own blob: staged by the guest library, reused as soon
    /// as the command is consumed.
    staged: bool,
    /// Whether the memory is registered for DMA (else the driver stages it).
    dma_registered: bool,
}

fn resolve(
    blobs: &std::collections::HashMap<u32, Attached>,
    channel_blob: Option<u32>,
    range: &BlobRange,
) -> CuResult<Resolved> {
    let attached = blobs
        .get(&range.resource_id)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let runs = attached
        .blob
        .host_runs(range.offset, range.length)
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    Ok(Resolved {
        runs,
        staged: channel_blob == Some(range.resource_id),
        dma_registered: attached.blob.dma_registered(),
    })
}

/// Copies a module image out of guest memory: the guest could change it
/// while the driver reads it, and the cache keeps it.
fn read_image(
    blobs: &std::collections::HashMap<u32, Attached>,
    image: &BlobRange,
    max_bytes: u64,
    ctx_id: u32,
) -> CuResult<Vec<u8>> {
    let attached = blobs
        .get(&image.resource_id)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // Checked before allocating: the length comes from the guest.
    image
        .end()
        .filter(|end| *end <= attached.blob.size())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if image.length > max_bytes {
        warn_limited!(
            "ctx {ctx_id}: module image of {} bytes refused (limit {max_bytes})",
            image.length
        );
        return Err(LIMIT_ERROR);
    }
    let length = usize::try_from(image.length).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut bytes = vec![0u8; length];
    attached
        .blob
        .read(image.offset, &mut bytes)
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    Ok(bytes)
}

fn empty(_: ()) -> Vec<u8> {
    Vec::new()
}

/// A launch's attributes as the executor takes them, each checked: the
/// guest names its own events and its own device memory only, and every
/// value is one the driver defines (it is passed on as is).
fn launch_hints(
    attributes: &[LaunchAttr],
    handles: &Handles,
    tenant: &Tenant,
    ctx_id: u32,
) -> CuResult<Vec<LaunchHint>> {
    attributes
        .iter()
        .map(|attribute| {
            let v = attribute.value;
            let low = |word: u64| word as u32;
            let high = |word: u64| (word >> 32) as u32;
            let at_most = |value: u32, max: u32| {
                if value <= max {
                    Ok(value)
                } else {
                    Err(CUDA_ERROR_INVALID_VALUE)
                }
            };
            Ok(match attribute.id {
                launch_attribute::ACCESS_POLICY_WINDOW => {
                    let (base, bytes) = (v[0], v[1]);
                    check_device_range(tenant, ctx_id, "an access policy window", base, bytes)?;
                    let hit_ratio = f32::from_bits(low(v[2]));
                    if !(0.0..=1.0).contains(&hit_ratio) {
                        return Err(CUDA_ERROR_INVALID_VALUE);
                    }
                    LaunchHint::AccessPolicyWindow {
                        base,
                        bytes,
                        hit_ratio,
                        hit_property: at_most(high(v[2]), 2)?,
                        miss_property: at_most(low(v[3]), 2)?,
                    }
                }
                launch_attribute::SYNCHRONIZATION_POLICY => {
                    LaunchHint::SynchronizationPolicy(at_most(low(v[0]), 4)?)
                }
                launch_attribute::CLUSTER_SCHEDULING_POLICY_PREFERENCE => {
                    LaunchHint::ClusterSchedulingPolicy(at_most(low(v[0]), 2)?)
                }
                launch_attribute::PROGRAMMATIC_STREAM_SERIALIZATION => {
                    LaunchHint::ProgrammaticStreamSerialization(low(v[0]) != 0)
                }
                launch_attribute::PROGRAMMATIC_EVENT => LaunchHint::ProgrammaticEvent {
                    event: handles.event(low(v[0]))?,
                    flags: low(v[1]),
                    trigger_at_block_start: high(v[1]) != 0,
                },
                launch_attribute::PRIORITY => LaunchHint::Priority(low(v[0]) as i32),
                launch_attribute::MEM_SYNC_DOMAIN_MAP => LaunchHint::MemSyncDomainMap {
                    default: v[0] as u8,
                    remote: (v[0] >> 8) as u8,
                },
                launch_attribute::MEM_SYNC_DOMAIN => {
                    LaunchHint::MemSyncDomain(at_most(low(v[0]), 1)?)
                }
                launch_attribute::PREFERRED_CLUSTER_DIMENSION => {
                    LaunchHint::PreferredClusterDimension([low(v[0]), high(v[0]), low(v[1])])
                }
                launch_attribute::LAUNCH_COMPLETION_EVENT => LaunchHint::LaunchCompletionEvent {
                    event: handles.event(low(v[0]))?,
                    flags: low(v[1]),
                },
                launch_attribute::PREFERRED_SHARED_MEMORY_CARVEOUT => {
                    LaunchHint::PreferredSharedMemoryCarveout(low(v[0]))
                }
                other => {
                    warn_limited!("ctx {ctx_id}: launch attribute {other} refused");
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
            })
        })
        .collect()
}

/// One attribute as [`launch_hints`] checks it.
fn launch_hint(
    attribute: &LaunchAttr,
    handles: &Handles,
    tenant: &Tenant,
    ctx_id: u32,
) -> CuResult<LaunchHint> {
    let hints = launch_hints(std::slice::from_ref(attribute), handles, tenant, ctx_id)?;
    let [hint] = <[LaunchHint; 1]>::try_from(hints).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    Ok(hint)
}

/// The attributes a stream takes (`CUstreamAttrID`).
const STREAM_ATTRIBUTES: [u32; 5] = [
    launch_attribute::ACCESS_POLICY_WINDOW,
    launch_attribute::SYNCHRONIZATION_POLICY,
    launch_attribute::PRIORITY,
    launch_attribute::MEM_SYNC_DOMAIN_MAP,
    launch_attribute::MEM_SYNC_DOMAIN,
];

/// A kernel node's attribute, checked as a launch's: a cluster dimension,
/// cooperativity, or a hint (events are for launches only).
fn kernel_node_attribute(
    attribute: &LaunchAttr,
    handles: &Handles,
    tenant: &Tenant,
    ctx_id: u32,
) -> CuResult<KernelNodeAttribute> {
    let v = attribute.value;
    Ok(match attribute.id {
        launch_attribute::CLUSTER_DIMENSION => {
            KernelNodeAttribute::ClusterDimension([v[0] as u32, (v[0] >> 32) as u32, v[1] as u32])
        }
        launch_attribute::COOPERATIVE => KernelNodeAttribute::Cooperative(v[0] as u32 != 0),
        launch_attribute::PROGRAMMATIC_EVENT | launch_attribute::LAUNCH_COMPLETION_EVENT => {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        _ => KernelNodeAttribute::Hint(launch_hint(attribute, handles, tenant, ctx_id)?),
    })
}

/// Loads a module; its globals (and whatever else the driver took for it)
/// count against the tenant's memory limit, and past the limit the load is
/// undone.
fn load_module(
    ctx: &mut dyn ContextExecutor,
    tenant: &Tenant,
    executor: &dyn Executor,
    counters: &Counters,
    image: &[u8],
) -> CuResult<u64> {
    let loaded = ctx.module_load(image)?;
    if let Err(code) = tenant.account_driver_memory(Refresh::Strict, executor, counters) {
        let _ = ctx.module_unload(loaded);
        return Err(code);
    }
    Ok(loaded)
}

/// Checks that the guest process may name `[ptr, ptr + len)` on the
/// device: one of its allocations or module globals must hold all of it.
/// The driver itself would accept any address this host process can reach
/// (another guest's memory, host memory registered for DMA); for one that
/// is no allocation of the caller's process it answers
/// `CUDA_ERROR_INVALID_VALUE`, and so do we. A zero-length copy names no
/// byte: it is left to the executor, as before.
fn check_device_range(
    tenant: &Tenant,
    ctx_id: u32,
    what: &str,
    ptr: u64,
    len: u64,
) -> CuResult<()> {
    if len == 0 || tenant.device_ranges().contains(ptr, len) {
        return Ok(());
    }
    warn_limited!(
        "ctx {ctx_id}: {what} names device memory {ptr:#x}+{len:#x}, which is none of this \
         process's allocations or globals; refused"
    );
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// A stream memory operation's word: 4 or 8 bytes, aligned to its width,
/// in this process's memory.
fn check_memory_op(tenant: &Tenant, ctx_id: u32, what: &str, op: &MemoryOp) -> CuResult<()> {
    if !matches!(op.width, 4 | 8) || !op.address.is_multiple_of(u64::from(op.width)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_device_range(tenant, ctx_id, what, op.address, op.width.into())
}

/// Checks a node `node` for graph `graph` after `dependencies` (guest
/// handles all): the graph must be the session's, the dependencies nodes
/// of that graph, the node handle new, and the session's nodes (`weight`
/// more) within its limit. The executor's graph and dependencies.
fn prepare_graph_node(
    handles: &Handles,
    limits: &SessionLimits,
    ctx_id: u32,
    graph: u32,
    node: u32,
    dependencies: &[u32],
    weight: usize,
) -> CuResult<(u64, Vec<u64>)> {
    let created_graph = handles.graph(graph)?;
    check_new(&handles.graph_nodes, node)?;
    let total = handles.graph_node_weight().saturating_add(weight);
    check_room(total.saturating_sub(1), limits.graph_nodes)?;
    let deps = handles.dependencies(graph, dependencies).inspect_err(|_| {
        warn_limited!(
            "ctx {ctx_id}: a node of graph {graph} depends on a node that is none of that \
             graph's; refused"
        );
    })?;
    Ok((created_graph, deps))
}

/// Records node `node` (the executor's `created`) of graph `graph`.
fn record_graph_node(handles: &mut Handles, graph: u32, node: u32, created: u64, weight: usize) {
    handles.graph_nodes.insert(node, (graph, created));
    let contents = handles.graph_contents.entry(graph).or_default();
    contents.nodes.push(node);
    contents.weight = contents.weight.saturating_add(weight);
}

/// Adds node `node` to graph `graph` after `dependencies`, checked as
/// [`prepare_graph_node`] says; `spec` was checked by the caller.
#[allow(clippy::too_many_arguments)]
fn add_graph_node(
    ctx: &mut dyn ContextExecutor,
    handles: &mut Handles,
    limits: &SessionLimits,
    ctx_id: u32,
    graph: u32,
    node: u32,
    dependencies: &[u32],
    spec: &GraphNode<'_>,
    weight: usize,
) -> CuResult<Vec<u8>> {
    let (created_graph, deps) =
        prepare_graph_node(handles, limits, ctx_id, graph, node, dependencies, weight)?;
    let created = ctx.graph_add_node(created_graph, &deps, spec)?;
    record_graph_node(handles, graph, node, created, weight);
    Ok(Vec::new())
}

/// Graphs or executable graphs holding the memory-allocation nodes of
/// `ptrs` are gone: memory no one holds any more goes back to the tenant
/// (what the driver still keeps of it, an allocation never freed or
/// memory its pool caches, is then charged as the driver's own).
fn let_go_of_graph_allocations(
    ctx: &mut dyn ContextExecutor,
    handles: &mut Handles,
    tenant: &Tenant,
    executor: &dyn Executor,
    counters: &Counters,
    usage: &Usage,
    ptrs: &[u64],
) {
    let mut freed = false;
    for ptr in ptrs {
        let Some(allocation) = handles.graph_allocations.get_mut(ptr) else {
            continue;
        };
        allocation.holders = allocation.holders.saturating_sub(1);
        if allocation.holders > 0 {
            continue;
        }
        let size = allocation.size;
        handles.graph_allocations.remove(ptr);
        let owner = RangeOwner {
            session: usage.member,
            kind: RangeKind::GraphAllocation,
        };
        tenant.device_ranges_mut().remove(*ptr, owner);
        usage.sub_device_memory(size);
        release_charge(tenant, counters, size);
        freed = true;
    }
    if freed {
        let _ = ctx.graph_mem_trim();
        let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
    }
}

/// Bytes from the first to the last a memset node of `height` rows
/// `pitch` apart, `width` elements of `element_size` each, sets; `None`
/// for a shape the driver refuses (empty, rows overlapping) or overflow.
fn memset_node_span(element_size: u32, width: u64, height: u64, pitch: u64) -> Option<u64> {
    let row = width.checked_mul(u64::from(element_size))?;
    if row == 0 || height == 0 || (height > 1 && pitch < row) {
        return None;
    }
    (height - 1).checked_mul(pitch)?.checked_add(row)
}

/// A kernel node of `function` (the executor's) as `launch` describes it
/// (checked by the caller as a launch is).
fn kernel_node(function: u64, launch: &Launch) -> GraphNode<'_> {
    GraphNode::Kernel {
        function,
        grid: launch.grid,
        block: launch.block,
        shared_mem_bytes: launch.shared_mem_bytes,
        params: &launch.params,
    }
}

/// A memset node, checked as a memset: every byte it sets (`shape`:
/// width, height, pitch) lies in the process's device memory.
fn memset_node(
    tenant: &Tenant,
    ctx_id: u32,
    dst: u64,
    value: u32,
    element_size: u32,
    [width, height, pitch]: [u64; 3],
) -> CuResult<GraphNode<'static>> {
    let span =
        memset_node_span(element_size, width, height, pitch).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    check_device_range(tenant, ctx_id, "a memset node", dst, span)?;
    Ok(GraphNode::Memset {
        dst,
        value,
        element_size,
        width,
        height,
        pitch,
    })
}

/// A memory-operation node's operation as a command gives it (`wait` 1:
/// a wait), checked: its word is the process's own memory.
fn node_memory_op(
    tenant: &Tenant,
    ctx_id: u32,
    wait: u32,
    width: u32,
    address: u64,
    value: u64,
    flags: u32,
) -> CuResult<MemoryOp> {
    let op = MemoryOp {
        wait: wait == 1,
        address,
        value,
        width,
        flags,
    };
    check_memory_op(tenant, ctx_id, "memory-operation node", &op)?;
    Ok(op)
}

/// An event node's parameters: it records (`wait` 0) or waits for (1)
/// the session's event `event`.
fn event_node(handles: &Handles, event: u32, wait: u32) -> CuResult<GraphNode<'static>> {
    let event = handles.event(event)?;
    Ok(if wait != 0 {
        GraphNode::EventWait(event)
    } else {
        GraphNode::EventRecord(event)
    })
}

/// The executor's executable graph `exec` and node `node`, which must be a
/// node of the graph `exec` was instantiated from.
fn exec_node(handles: &Handles, exec: u32, node: u32) -> CuResult<(u64, u64)> {
    let created_exec = handles.graph_exec(exec)?;
    let source = handles.graph_exec_sources.get(&exec).copied();
    let created = source
        .ok_or(CUDA_ERROR_INVALID_VALUE)
        .and_then(|graph| handles.graph_node(node, Some(graph)))?;
    Ok((created_exec, created))
}

/// A physical allocation is gone (released, its last mapping too): its
/// memory goes back to the tenant's budget.
fn forget_physical(
    handles: &mut Handles,
    tenant: &Tenant,
    counters: &Counters,
    usage: &Usage,
    handle: u32,
) {
    if let Some(physical) = handles.physical.remove(&handle) {
        let keys = handles.physical_shares.remove(&handle).unwrap_or_default();
        let ledger = tenant.ledger();
        if physical.imported {
            for key in &keys {
                ledger.let_go(usage.member, key, tenant.budget());
            }
            return;
        }
        // Importers that still hold it keep it charged (the ledger takes
        // the charge over) before this allocation's own charge goes.
        for key in &keys {
            ledger.unshare(usage.member, key, tenant.budget());
        }
        usage.sub_device_memory(physical.size);
        release_charge(tenant, counters, physical.size);
    }
}

/// The ledger's key of a CUDA IPC handle.
fn ipc_key(handle: &crate::ipc::IpcHandle) -> ShareKey {
    let mut key = [0u8; 64];
    for (slot, byte) in key.iter_mut().zip(handle.iter()) {
        *slot = *byte;
    }
    key
}

/// Gives back a freed allocation's charge (its usage the caller settled).
fn release_charge(tenant: &Tenant, counters: &Counters, size: u64) {
    Counters::sub(&counters.device_memory_bytes, size);
    if let Some(budget) = tenant.budget() {
        budget.release(size);
    }
}

/// A memcpy node's copy, checked: well formed, and every byte from each
/// side's first to its last in one range of the process's own (the rows
/// between are its too).
fn copy_node(tenant: &Tenant, ctx_id: u32, copy: &Copy3D) -> CuResult<GraphNode<'static>> {
    if !copy.is_well_formed() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for (what, side) in [
        ("a memcpy node's src", &copy.src),
        ("a memcpy node's dst", &copy.dst),
    ] {
        let span = copy.span(side).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        check_device_range(tenant, ctx_id, what, side.address, span)?;
    }
    Ok(GraphNode::Copy(*copy))
}

fn record_range(
    tenant: &Tenant,
    ctx_id: u32,
    start: u64,
    len: u64,
    owner: RangeOwner,
) -> CuResult<()> {
    match tenant.device_ranges_mut().insert(start, len, owner) {
        Ok(Inserted::Added | Inserted::AlreadyKnown | Inserted::Empty) => Ok(()),
        Ok(Inserted::ReplacedStale(count)) => {
            // The driver reuses an address only once it is free, so a range
            // it overlaps was kept too long (or another context freed it
            // just now).
            warn_limited!(
                "ctx {ctx_id}: device range {start:#x}+{len:#x} replaced {count} stale range(s)"
            );
            Ok(())
        }
        Err(e) => {
            crate::error_limited!("ctx {ctx_id}: the executor returned an impossible {e}");
            Err(CUDA_ERROR_UNKNOWN)
        }
    }
}

impl Worker {
    /// Live device state for NVML: the executor's view of the device and
    /// this tenant's sessions; needs (and creates) no device context.
    fn device_status(&self, device: u32) -> CuResult<Vec<u8>> {
        let status = self.executor.device_status(device)?;
        let (free, total) = clamp_to_budget(status.free, status.total, self.tenant.budget());
        Ok(DeviceStatus {
            free,
            total,
            gpu_utilization: status.gpu_utilization.unwrap_or(UTILIZATION_UNKNOWN),
            memory_utilization: status.memory_utilization.unwrap_or(UTILIZATION_UNKNOWN),
            driver_version: status.driver_version,
            // Every process of the tenant where the budget lists them
            // (`nvidia-smi` has no context of its own).
            sessions: self
                .tenant
                .budget()
                .and_then(|b| b.processes())
                .unwrap_or_else(|| self.tenant.active_sessions()),
        }
        .to_bytes())
    }

    /// Runs one command; the reply payload on success. A launch's
    /// parameter block is taken from `command` (the launch thread keeps it).
    pub(crate) fn execute(&mut self, command: &mut Command, reply_seq: u64) -> CuResult<Vec<u8>> {
        match command {
            Command::Padding => return Ok(Vec::new()),
            Command::DeviceStatus { device } => return self.device_status(*device),
            _ => {}
        }
        let usage = &*self.usage;
        let tenant = &*self.tenant;
        let limits = tenant.limits();
        let ctx_id = self.ctx_id;
        if matches!(self.context, DeviceContext::NotCreated) {
            self.context
                .get(&*self.executor, self.device, self.ctx_id, usage)?;
            // The context's own memory counts against the tenant's limit.
            if let Err(code) =
                tenant.account_driver_memory(Refresh::Strict, &*self.executor, &self.counters)
            {
                warn_limited!(
                    "ctx {ctx_id}: a device context's own memory would pass the tenant's memory \
                     limit; the context is refused"
                );
                usage.set_has_context(false);
                self.context = DeviceContext::Failed(code);
                let _ =
                    tenant.account_driver_memory(Refresh::Settle, &*self.executor, &self.counters);
                return Err(code);
            }
            if let (Some(budget), Some(pid)) = (tenant.budget(), usage.pid()) {
                budget.context_opened(pid);
            }
        }
        let executor = &*self.executor;
        let ctx = self
            .context
            .get(executor, self.device, self.ctx_id, usage)?;
        if !matches!(command, Command::LaunchKernel { .. }) {
            // Everything but a launch comes after the launches before it.
            ctx.fence();
        }
        let mut env = Env {
            reply_seq,
            usage,
            tenant,
            limits,
            ctx_id,
            executor,
            ctx,
            handles: &mut self.handles,
            counters: &self.counters,
            blobs: &self.blobs,
            channel_blob: self.channel.as_ref().map(|c| c.resource_id()),
            module_cache: &self.module_cache,
        };
        match command {
            // Answered above, before the context.
            Command::Padding | Command::DeviceStatus { .. } => Err(CUDA_ERROR_INVALID_VALUE),
            Command::CtxSynchronize => context::ctx_synchronize(&mut env, command),
            Command::CtxGetLimit { .. } => context::ctx_get_limit(&mut env, command),
            Command::CtxSetLimit { .. } => context::ctx_set_limit(&mut env, command),
            Command::MemAlloc { .. } => memory::mem_alloc(&mut env, command),
            Command::MemFree { .. } => memory::mem_free(&mut env, command),
            Command::MemGetInfo => memory::mem_get_info(&mut env, command),
            Command::MemcpyHtoD { .. } => memory::memcpy_htod(&mut env, command),
            Command::MemcpyDtoH { .. } => memory::memcpy_dtoh(&mut env, command),
            Command::HostDevicePointer { .. } => memory::host_device_pointer(&mut env, command),
            Command::MemcpyDtoD { .. } => memory::memcpy_dtod(&mut env, command),
            Command::Memset { .. } => memory::memset(&mut env, command),
            Command::ModuleLoad { .. } => module::module_load(&mut env, command),
            Command::ModuleLoadHashed { .. } => module::module_load_hashed(&mut env, command),
            Command::ModuleLoadCached { .. } => module::module_load_cached(&mut env, command),
            Command::ModuleUnload { .. } => module::module_unload(&mut env, command),
            Command::ModuleGetFunction { .. } => module::module_get_function(&mut env, command),
            Command::ModuleGetGlobal { .. } => module::module_get_global(&mut env, command),
            Command::FuncGetAttribute { .. } => module::func_get_attribute(&mut env, command),
            Command::FuncSetAttribute { .. } => module::func_set_attribute(&mut env, command),
            Command::OccupancyMaxActiveBlocks { .. } => {
                module::occupancy_max_active_blocks(&mut env, command)
            }
            Command::OccupancyAvailableDynamicSmem { .. } => {
                module::occupancy_available_dynamic_smem(&mut env, command)
            }
            Command::OccupancyMaxPotentialClusterSize { .. } => {
                module::occupancy_max_potential_cluster_size(&mut env, command)
            }
            Command::TensorMapEncode { .. } => tensor_map::tensor_map_encode(&mut env, command),
            Command::TensorMapReplaceAddress { .. } => {
                tensor_map::tensor_map_replace_address(&mut env, command)
            }
            Command::OccupancyMaxActiveClusters { .. } => {
                module::occupancy_max_active_clusters(&mut env, command)
            }
            Command::LaunchKernel { .. } => module::launch_kernel(&mut env, command),
            Command::LaunchKernelEx { .. } => module::launch_kernel_ex(&mut env, command),
            Command::StreamCreate { .. } => stream::stream_create(&mut env, command),
            Command::StreamDestroy { .. } => stream::stream_destroy(&mut env, command),
            Command::StreamSynchronize { .. } => stream::stream_synchronize(&mut env, command),
            Command::StreamQuery { .. } => stream::stream_query(&mut env, command),
            Command::StreamWaitEvent { .. } => stream::stream_wait_event(&mut env, command),
            Command::EventCreate { .. } => event::event_create(&mut env, command),
            Command::EventDestroy { .. } => event::event_destroy(&mut env, command),
            Command::EventRecord { .. } => event::event_record(&mut env, command),
            Command::EventSynchronize { .. } => event::event_synchronize(&mut env, command),
            Command::EventQuery { .. } => event::event_query(&mut env, command),
            Command::EventElapsedTime { .. } => event::event_elapsed_time(&mut env, command),
            Command::MemGranularity { .. } => vmm::mem_granularity(&mut env, command),
            Command::MemCreate { .. } => vmm::mem_create(&mut env, command),
            Command::MemRelease { .. } => vmm::mem_release(&mut env, command),
            Command::MemExportShareable { .. } => vmm::mem_export_shareable(&mut env, command),
            Command::MemImportShareable { .. } => vmm::mem_import_shareable(&mut env, command),
            Command::MemAddressReserve { .. } => vmm::mem_address_reserve(&mut env, command),
            Command::MemAddressFree { .. } => vmm::mem_address_free(&mut env, command),
            Command::MemMap { .. } => vmm::mem_map(&mut env, command),
            Command::MemUnmap { .. } => vmm::mem_unmap(&mut env, command),
            Command::MemSetAccess { .. } => vmm::mem_set_access(&mut env, command),
            Command::StreamBeginCapture { .. } => stream::stream_begin_capture(&mut env, command),
            Command::StreamBeginCaptureToGraph { .. } => {
                stream::stream_begin_capture_to_graph(&mut env, command)
            }
            Command::StreamWriteValue { .. } | Command::StreamWaitValue { .. } => {
                stream::stream_write_value(&mut env, command)
            }
            Command::StreamEndCapture { .. } => stream::stream_end_capture(&mut env, command),
            Command::StreamCaptureGraph { .. } => stream::stream_capture_graph(&mut env, command),
            Command::StreamUpdateCaptureDependencies { .. } => {
                stream::stream_update_capture_dependencies(&mut env, command)
            }
            Command::GraphNameNodes { .. } => graph::graph_name_nodes(&mut env, command),
            Command::GraphInstantiate { .. } => graph::graph_instantiate(&mut env, command),
            Command::GraphLaunch { .. } => graph::graph_launch(&mut env, command),
            Command::GraphExecDestroy { .. } => graph::graph_exec_destroy(&mut env, command),
            Command::GraphDestroy { .. } => graph::graph_destroy(&mut env, command),
            Command::GraphCreate { .. } => graph::graph_create(&mut env, command),
            Command::GraphClone { .. } => graph::graph_clone(&mut env, command),
            Command::GraphAddEmptyNode { .. } => graph::graph_add_empty_node(&mut env, command),
            Command::GraphAddKernelNode { .. } => graph::graph_add_kernel_node(&mut env, command),
            Command::GraphAddMemsetNode { .. } => graph::graph_add_memset_node(&mut env, command),
            Command::GraphAddMemcpyNode { .. } => graph::graph_add_memcpy_node(&mut env, command),
            Command::GraphAddMemcpy3DNode { .. } => {
                graph::graph_add_memcpy_3d_node(&mut env, command)
            }
            Command::GraphAddEventRecordNode { .. } | Command::GraphAddEventWaitNode { .. } => {
                graph::graph_add_event_node(&mut env, command)
            }
            Command::GraphAddChildGraphNode { .. } => {
                graph::graph_add_child_graph_node(&mut env, command)
            }
            Command::GraphAddMemAllocNode { .. } => {
                graph::graph_add_mem_alloc_node(&mut env, command)
            }
            Command::GraphAddMemOpNode { .. } => graph::graph_add_mem_op_node(&mut env, command),
            Command::GraphAddMemFreeNode { .. } => {
                graph::graph_add_mem_free_node(&mut env, command)
            }
            Command::GraphKernelNodeSetParams { .. } => {
                graph::graph_kernel_node_set_params(&mut env, command)
            }
            Command::GraphMemsetNodeSetParams { .. } => {
                graph::graph_memset_node_set_params(&mut env, command)
            }
            Command::GraphAddDependencies { .. } | Command::GraphRemoveDependencies { .. } => {
                graph::graph_add_dependencies(&mut env, command)
            }
            Command::GraphDestroyNode { .. } => graph::graph_destroy_node(&mut env, command),
            Command::GraphMemcpyNodeSetParams { .. } => {
                graph::graph_memcpy_node_set_params(&mut env, command)
            }
            Command::GraphExecMemcpyNodeSetParams { .. } => {
                graph::graph_exec_memcpy_node_set_params(&mut env, command)
            }
            Command::GraphExecKernelNodeSetParams { .. } => {
                graph::graph_exec_kernel_node_set_params(&mut env, command)
            }
            Command::GraphExecMemsetNodeSetParams { .. } => {
                graph::graph_exec_memset_node_set_params(&mut env, command)
            }
            Command::GraphEventNodeSetEvent { .. } => {
                graph::graph_event_node_set_event(&mut env, command)
            }
            Command::GraphExecEventNodeSetEvent { .. } => {
                graph::graph_exec_event_node_set_event(&mut env, command)
            }
            Command::GraphExecChildGraphNodeSetParams { .. } => {
                graph::graph_exec_child_graph_node_set_params(&mut env, command)
            }
            Command::GraphMemOpNodeSetParams { .. } => {
                graph::graph_mem_op_node_set_params(&mut env, command)
            }
            Command::GraphExecMemOpNodeSetParams { .. } => {
                graph::graph_exec_mem_op_node_set_params(&mut env, command)
            }
            Command::StreamSetAttribute { .. } => stream::stream_set_attribute(&mut env, command),
            Command::StreamGetAttribute { .. } => stream::stream_get_attribute(&mut env, command),
            Command::StreamCopyAttributes { .. } => {
                stream::stream_copy_attributes(&mut env, command)
            }
            Command::GraphKernelNodeSetAttribute { .. } => {
                graph::graph_kernel_node_set_attribute(&mut env, command)
            }
            Command::GraphKernelNodeGetAttribute { .. } => {
                graph::graph_kernel_node_get_attribute(&mut env, command)
            }
            Command::GraphKernelNodeCopyAttributes { .. } => {
                graph::graph_kernel_node_copy_attributes(&mut env, command)
            }
            Command::GraphExecNodeSetEnabled { .. } => {
                graph::graph_exec_node_set_enabled(&mut env, command)
            }
            Command::GraphExecNodeGetEnabled { .. } => {
                graph::graph_exec_node_get_enabled(&mut env, command)
            }
            Command::GraphExecUpdate { .. } => graph::graph_exec_update(&mut env, command),
            Command::GraphUpload { .. } => graph::graph_upload(&mut env, command),
            Command::GraphGetNodeCount { .. } | Command::GraphGetRootNodeCount { .. } => {
                graph::graph_get_node_count(&mut env, command)
            }
            Command::IpcGetMemHandle { .. } => ipc::ipc_get_mem_handle(&mut env, command),
            Command::IpcOpenMemHandle { .. } => ipc::ipc_open_mem_handle(&mut env, command),
            Command::IpcCloseMemHandle { .. } => ipc::ipc_close_mem_handle(&mut env, command),
            Command::IpcGetEventHandle { .. } => ipc::ipc_get_event_handle(&mut env, command),
            Command::IpcOpenEventHandle { .. } => ipc::ipc_open_event_handle(&mut env, command),
        }
    }
}

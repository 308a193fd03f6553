//! Executing one ring command against the session's device context: guest
//! handles, blob ranges and device pointers are checked and translated
//! here, then handed to the executor; the session's limits are kept here.

use std::os::fd::AsFd;

use rgpu_executor::{
    exec_update, ContextExecutor, Copy3D, CuResult, Executor, GraphNode, HostRun,
    KernelNodeAttribute, LaunchHint, LaunchOptions, MemoryOp,
};
use rgpu_proto::command::launch_attribute;
use rgpu_proto::cuda_result::{
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN,
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
use crate::module_cache::image_hash;
use crate::shareable::{physical_key, SHAREABLE_TOKEN_BYTES};
use crate::shared_ledger::{token_key, ShareKey};
use crate::tenant::Usage;
use crate::worker::{Attached, DeviceContext, Worker};
use crate::{clamp_to_budget, warn_limited, Counters, Tenant};

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

    /// Runs one command; the reply payload on success.
    pub(crate) fn execute(&mut self, command: &Command, reply_seq: u64) -> CuResult<Vec<u8>> {
        match command {
            Command::Padding => return Ok(Vec::new()),
            Command::DeviceStatus { device } => return self.device_status(*device),
            _ => {}
        }
        let usage = &*self.usage;
        let tenant = &*self.tenant;
        let limits = tenant.limits();
        let ctx_id = self.ctx_id;
        let owner = |kind| RangeOwner {
            session: usage.member,
            kind,
        };
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
        let handles = &mut self.handles;
        let counters = &*self.counters;
        let blobs = &self.blobs;
        let channel_blob = self.channel.as_ref().map(|c| c.resource_id());
        let count_copy = |resolved: &Resolved, bytes: u64| {
            let counter = if resolved.staged {
                &counters.staged_bytes
            } else {
                &counters.zero_copy_bytes
            };
            Counters::add(counter, bytes);
            if !resolved.dma_registered {
                Counters::add(&counters.unregistered_copy_bytes, bytes);
            }
        };
        match command {
            // Answered above, before the context.
            Command::Padding | Command::DeviceStatus { .. } => Err(CUDA_ERROR_INVALID_VALUE),
            Command::CtxSynchronize => ctx.synchronize().map(empty),
            Command::CtxGetLimit { limit } => ctx.get_limit(*limit).map(|v| u64_payload(&[v])),
            Command::CtxSetLimit { limit, value } => {
                // A heap or stack size takes device memory: past the
                // tenant's limit, the old size comes back.
                let before = ctx.get_limit(*limit).ok();
                ctx.set_limit(*limit, *value)?;
                if let Err(code) = tenant.account_driver_memory(Refresh::Strict, executor, counters)
                {
                    if let Some(before) = before {
                        let _ = ctx.set_limit(*limit, before);
                    }
                    let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
                    return Err(code);
                }
                Ok(Vec::new())
            }
            Command::MemAlloc { size } => {
                check_room(handles.allocations.len(), limits.allocations)?;
                // The tenant's memory limit first: past it, the driver is
                // not asked at all.
                let budget = tenant.budget();
                if !tenant.reserve_memory(*size, executor, counters) {
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                let release = || {
                    if let Some(budget) = budget {
                        budget.release(*size);
                    }
                };
                let ptr = ctx.mem_alloc(*size).inspect_err(|_| release())?;
                if let Err(code) =
                    record_range(tenant, ctx_id, ptr, *size, owner(RangeKind::Allocation))
                {
                    let _ = ctx.mem_free(ptr);
                    release();
                    return Err(code);
                }
                if let Some(old) = handles.allocations.insert(ptr, *size) {
                    Counters::sub(&counters.device_memory_bytes, old);
                    usage.sub_device_memory(old);
                }
                Counters::add(&counters.device_memory_bytes, *size);
                usage.add_device_memory(*size);
                Ok(u64_payload(&[ptr]))
            }
            Command::MemFree { device_ptr } => {
                let size = *handles
                    .allocations
                    .get(device_ptr)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // Forgotten before the driver frees it: another context of the
                // process may get the address back at once. Its IPC export
                // goes too: nobody opens freed memory through rgpu.
                let exported = tenant.ipc().withdraw(IpcKind::Memory, *device_ptr);
                let forgotten = tenant
                    .device_ranges_mut()
                    .remove(*device_ptr, owner(RangeKind::Allocation));
                if let Err(code) = ctx.mem_free(*device_ptr) {
                    if forgotten {
                        let owner = owner(RangeKind::Allocation);
                        let _ = record_range(tenant, ctx_id, *device_ptr, size, owner);
                    }
                    return Err(code);
                }
                handles.allocations.remove(device_ptr);
                // Another process that opened it keeps it charged.
                if let Some(key) = handles.ipc_shared.remove(device_ptr) {
                    tenant.ledger().unshare(usage.member, &key, tenant.budget());
                }
                usage.sub_device_memory(size);
                release_charge(tenant, counters, size);
                // Another process may still have it open, and the driver
                // keep it for that one: what the driver reports for this
                // process settles what the tenant is charged.
                if exported {
                    let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
                }
                Ok(Vec::new())
            }
            Command::MemGetInfo => ctx.mem_get_info().map(|(free, total)| {
                let (free, total) = clamp_to_budget(free, total, tenant.budget());
                u64_payload(&[free, total])
            }),
            Command::MemcpyHtoD { stream, dst, src } => {
                let stream = handles.stream(*stream)?;
                let source = resolve(blobs, channel_blob, src)?;
                check_device_range(tenant, ctx_id, "MemcpyHtoD dst", *dst, src.length)?;
                let wait = source.staged || reply_seq != 0;
                ctx.memcpy_htod(stream, *dst, &source.runs, wait)?;
                count_copy(&source, src.length);
                Ok(Vec::new())
            }
            Command::MemcpyDtoH { stream, dst, src } => {
                let stream = handles.stream(*stream)?;
                let target = resolve(blobs, channel_blob, dst)?;
                check_device_range(tenant, ctx_id, "MemcpyDtoH src", *src, dst.length)?;
                let wait = target.staged || reply_seq != 0;
                ctx.memcpy_dtoh(stream, &target.runs, *src, wait)?;
                count_copy(&target, dst.length);
                Ok(Vec::new())
            }
            Command::HostDevicePointer { range } => {
                // Pinned memory of the guest process is a blob its worker
                // mapped and registered: kernels reach it where the driver
                // maps that registration (the process's own memory only;
                // the channel's blob is not the guest's to hand out).
                let memory = resolve(blobs, channel_blob, range)?;
                let [run] = memory.runs.as_slice() else {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                };
                if memory.staged || !memory.dma_registered {
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                let device = ctx.host_device_pointer(*run)?;
                // Copies and memsets may name it from now on, by the whole
                // blob's device range.
                let blob_size = blobs
                    .get(&range.resource_id)
                    .map_or(0, |attached| attached.blob.size());
                if let Some(start) = device.checked_sub(range.offset) {
                    let kind = RangeKind::PageLocked {
                        resource_id: range.resource_id,
                    };
                    record_range(tenant, ctx_id, start, blob_size, owner(kind))?;
                }
                Ok(u64_payload(&[device]))
            }
            Command::MemcpyDtoD {
                stream,
                dst,
                src,
                size,
            } => {
                let stream = handles.stream(*stream)?;
                check_device_range(tenant, ctx_id, "MemcpyDtoD src", *src, *size)?;
                check_device_range(tenant, ctx_id, "MemcpyDtoD dst", *dst, *size)?;
                ctx.memcpy_dtod(stream, *dst, *src, *size).map(empty)
            }
            Command::Memset {
                stream,
                dst,
                value,
                element_size,
                count,
            } => {
                let stream = handles.stream(*stream)?;
                let bytes = count
                    .checked_mul(u64::from(*element_size))
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                check_device_range(tenant, ctx_id, "Memset dst", *dst, bytes)?;
                ctx.memset(stream, *dst, *value, *element_size, *count)
                    .map(empty)
            }
            Command::ModuleLoad { module, image } => {
                check_new(&handles.modules, *module)?;
                check_room(handles.modules.len(), limits.modules)?;
                let bytes = read_image(blobs, image, limits.module_image_bytes, ctx_id)?;
                Counters::add(&counters.host_cpu_copy_bytes, image.length);
                let loaded = load_module(ctx, tenant, executor, counters, &bytes)?;
                handles.modules.insert(*module, loaded);
                self.module_cache.insert(bytes.into());
                Ok(Vec::new())
            }
            Command::ModuleLoadHashed {
                module,
                hash,
                image,
            } => {
                check_new(&handles.modules, *module)?;
                check_room(handles.modules.len(), limits.modules)?;
                let bytes = read_image(blobs, image, limits.module_image_bytes, ctx_id)?;
                Counters::add(&counters.host_cpu_copy_bytes, image.length);
                // The guest's hash is checked, never trusted: the cache
                // keys images by the hash of what arrived.
                let computed = image_hash(&bytes);
                if computed != *hash {
                    warn_limited!(
                        "ctx {ctx_id}: module image does not match the hash the guest sent; refused"
                    );
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let loaded = load_module(ctx, tenant, executor, counters, &bytes)?;
                handles.modules.insert(*module, loaded);
                self.module_cache.insert_hashed(computed, bytes.into());
                Ok(Vec::new())
            }
            Command::ModuleLoadCached { module, hash } => {
                check_new(&handles.modules, *module)?;
                check_room(handles.modules.len(), limits.modules)?;
                let image = self.module_cache.get(hash).ok_or(CUDA_ERROR_NOT_FOUND)?;
                let loaded = load_module(ctx, tenant, executor, counters, &image)?;
                handles.modules.insert(*module, loaded);
                Counters::add(&counters.module_cache_hits, 1);
                Ok(Vec::new())
            }
            Command::ModuleUnload { module } => {
                let loaded = handles.module(*module)?;
                let globals = owner(RangeKind::Global { module: *module });
                // Forgotten before the driver frees them, as in MemFree.
                tenant.device_ranges_mut().remove_where(|o| *o == globals);
                if let Err(code) = ctx.module_unload(loaded) {
                    // Still loaded: its globals are still there.
                    for (ptr, size) in handles.globals_of(*module) {
                        let _ = record_range(tenant, ctx_id, ptr, size, globals);
                    }
                    return Err(code);
                }
                handles.remove_module(*module);
                let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
                Ok(Vec::new())
            }
            Command::ModuleGetFunction {
                module,
                function,
                name,
            } => {
                let loaded = handles.module(*module)?;
                if *function == 0 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                if !handles.functions.contains_key(function) {
                    check_room(handles.functions.len(), limits.functions)?;
                }
                let name = std::str::from_utf8(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
                let (handle, info) = ctx.module_get_function(loaded, name)?;
                // Lazy loading may have brought the function's module in.
                let _ = tenant.account_driver_memory(Refresh::Lazy, executor, counters);
                let mut w = WireWriter::new();
                info.encode(&mut w);
                // An existing guest handle is re-pointed: the guest reuses
                // handles of functions it looked up again.
                handles.functions.insert(
                    *function,
                    FunctionEntry {
                        handle,
                        module: *module,
                        info,
                    },
                );
                Ok(w.into_bytes())
            }
            Command::ModuleGetGlobal { module, name } => {
                let loaded = handles.module(*module)?;
                let name = std::str::from_utf8(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
                let (ptr, size) = ctx.module_get_global(loaded, name)?;
                let _ = tenant.account_driver_memory(Refresh::Lazy, executor, counters);
                if !handles.globals.contains_key(&ptr) {
                    check_room(handles.globals.len(), limits.globals)?;
                }
                let kind = RangeKind::Global { module: *module };
                record_range(tenant, ctx_id, ptr, size, owner(kind))?;
                handles.globals.insert(ptr, (*module, size));
                Ok(u64_payload(&[ptr, size]))
            }
            Command::FuncGetAttribute {
                function,
                attribute,
            } => {
                let handle = handles.function(*function)?.handle;
                ctx.func_get_attribute(handle, *attribute)
                    .map(|v| v.to_le_bytes().to_vec())
            }
            Command::FuncSetAttribute {
                function,
                attribute,
                value,
            } => {
                let handle = handles.function(*function)?.handle;
                ctx.func_set_attribute(handle, *attribute, *value)
                    .map(empty)
            }
            Command::OccupancyMaxActiveBlocks {
                function,
                block_size,
                flags,
                dynamic_smem_bytes,
            } => {
                let handle = handles.function(*function)?.handle;
                ctx.occupancy_max_active_blocks(handle, *block_size, *dynamic_smem_bytes, *flags)
                    .map(|v| v.to_le_bytes().to_vec())
            }
            Command::OccupancyAvailableDynamicSmem {
                function,
                num_blocks,
                block_size,
            } => {
                let handle = handles.function(*function)?.handle;
                ctx.occupancy_available_dynamic_smem(handle, *num_blocks, *block_size)
                    .map(|v| u64_payload(&[v]))
            }
            Command::OccupancyMaxPotentialClusterSize { query } => {
                let handle = handles.function(query.function)?.handle;
                ctx.occupancy_max_potential_cluster_size(handle, query)
                    .map(|v| v.to_le_bytes().to_vec())
            }
            Command::TensorMapEncode { spec } => {
                ctx.tensor_map_encode(spec).map(|map| map.to_vec())
            }
            Command::TensorMapReplaceAddress { map, address } => ctx
                .tensor_map_replace_address(map, *address)
                .map(|map| map.to_vec()),
            Command::OccupancyMaxActiveClusters { query } => {
                let handle = handles.function(query.function)?.handle;
                ctx.occupancy_max_active_clusters(handle, query)
                    .map(|v| v.to_le_bytes().to_vec())
            }
            Command::LaunchKernel { launch } => {
                let (function, stream) = handles.launch_target(launch)?;
                ctx.launch_kernel(
                    function,
                    launch.grid,
                    launch.block,
                    launch.shared_mem_bytes,
                    stream,
                    &launch.params,
                )
                .map(empty)
            }
            Command::LaunchKernelEx {
                launch,
                cluster,
                cooperative,
                attributes,
            } => {
                let (function, stream) = handles.launch_target(launch)?;
                let options = LaunchOptions {
                    cluster: *cluster,
                    cooperative: *cooperative != 0,
                    hints: launch_hints(attributes, handles, tenant, ctx_id)?,
                };
                ctx.launch_kernel_ex(
                    function,
                    launch.grid,
                    launch.block,
                    launch.shared_mem_bytes,
                    stream,
                    &launch.params,
                    &options,
                )
                .map(empty)
            }
            Command::StreamCreate {
                stream,
                flags,
                priority,
            } => {
                if *stream == STREAM_PER_THREAD {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                check_new(&handles.streams, *stream)?;
                check_room(handles.streams.len(), limits.streams)?;
                let created = ctx.stream_create(*flags, *priority)?;
                handles.streams.insert(*stream, created);
                Ok(Vec::new())
            }
            Command::StreamDestroy { stream } => {
                // The default streams are not the guest's to destroy.
                let created = *handles
                    .streams
                    .get(stream)
                    .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                ctx.stream_destroy(created)?;
                handles.streams.remove(stream);
                Ok(Vec::new())
            }
            Command::StreamSynchronize { stream } => {
                let stream = handles.stream(*stream)?;
                ctx.stream_synchronize(stream).map(empty)
            }
            Command::StreamQuery { stream } => {
                let stream = handles.stream(*stream)?;
                ctx.stream_query(stream).map(empty)
            }
            Command::StreamWaitEvent {
                stream,
                event,
                flags,
            } => {
                let stream = handles.stream(*stream)?;
                let event = handles.event(*event)?;
                ctx.stream_wait_event(stream, event, *flags).map(empty)
            }
            Command::EventCreate { event, flags } => {
                check_new(&handles.events, *event)?;
                check_room(handles.events.len(), limits.events)?;
                let created = ctx.event_create(*flags)?;
                handles.events.insert(*event, created);
                Ok(Vec::new())
            }
            Command::EventDestroy { event } => {
                let created = handles.event(*event)?;
                tenant
                    .ipc()
                    .withdraw(IpcKind::Event, event_key(usage.member, *event));
                ctx.event_destroy(created)?;
                handles.events.remove(event);
                Ok(Vec::new())
            }
            Command::EventRecord { event, stream } => {
                let event = handles.event(*event)?;
                let stream = handles.stream(*stream)?;
                ctx.event_record(event, stream).map(empty)
            }
            Command::EventSynchronize { event } => {
                let event = handles.event(*event)?;
                ctx.event_synchronize(event).map(empty)
            }
            Command::EventQuery { event } => {
                let event = handles.event(*event)?;
                ctx.event_query(event).map(empty)
            }
            Command::EventElapsedTime { start, end } => {
                let start = handles.event(*start)?;
                let end = handles.event(*end)?;
                ctx.event_elapsed_time(start, end)
                    .map(|ms| ms.to_le_bytes().to_vec())
            }
            Command::MemGranularity { option } => {
                ctx.mem_granularity(*option).map(|g| u64_payload(&[g]))
            }
            Command::MemCreate { handle, size } => {
                check_new(&handles.physical, *handle)?;
                check_room(handles.physical.len(), limits.allocations)?;
                let budget = tenant.budget();
                if !tenant.reserve_memory(*size, executor, counters) {
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                let created = ctx.mem_create(*size).inspect_err(|_| {
                    if let Some(budget) = budget {
                        budget.release(*size);
                    }
                })?;
                handles.physical.insert(
                    *handle,
                    Physical {
                        handle: created,
                        size: *size,
                        mappings: 0,
                        released: false,
                        imported: false,
                    },
                );
                Counters::add(&counters.device_memory_bytes, *size);
                usage.add_device_memory(*size);
                Ok(Vec::new())
            }
            Command::MemRelease { handle } => {
                let physical = handles
                    .physical
                    .get(handle)
                    .copied()
                    .filter(|p| !p.released)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                ctx.mem_release(physical.handle)?;
                // Nobody imports what its exporter released.
                tenant
                    .shareable()
                    .withdraw(physical_key(usage.member, *handle));
                if physical.mappings == 0 {
                    forget_physical(handles, tenant, counters, usage, *handle);
                } else if let Some(p) = handles.physical.get_mut(handle) {
                    p.released = true;
                }
                Ok(Vec::new())
            }
            Command::MemExportShareable { handle } => {
                let physical = handles
                    .physical
                    .get(handle)
                    .copied()
                    .filter(|p| !p.released)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // The session's own allocation exported again answers the
                // token it has: the ledger knows shared memory by token, and
                // a second token of it would be carried twice once the
                // exporter let go while both were held.
                let exported = handles
                    .physical_shares
                    .get(handle)
                    .filter(|_| !physical.imported)
                    .and_then(|keys| keys.first())
                    .and_then(|key| key.get(..SHAREABLE_TOKEN_BYTES));
                if let Some(token) = exported {
                    return Ok(token.to_vec());
                }
                let fd = ctx.mem_export_fd(physical.handle)?;
                let key = physical_key(usage.member, *handle);
                let token = tenant
                    .shareable()
                    .export(ctx_id, key, physical.size, fd.as_fd())?;
                let shared = token_key(&token);
                if !tenant.ledger().share(usage.member, &shared, physical.size) {
                    tenant.shareable().withdraw(key);
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                handles
                    .physical_shares
                    .entry(*handle)
                    .or_default()
                    .push(shared);
                Ok(token.to_vec())
            }
            Command::MemImportShareable { handle, token } => {
                check_new(&handles.physical, *handle)?;
                check_room(handles.physical.len(), limits.allocations)?;
                let (fd, size) = tenant.shareable().import(ctx_id, token)?;
                // Held in the tenant's ledger: charged to its exporter, and
                // to the ledger once the exporter let go while this holds it.
                let shared = token_key(token);
                let ledger = tenant.ledger();
                if !ledger.hold(usage.member, &shared) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let imported = ctx
                    .mem_import_fd(fd.as_fd())
                    .inspect_err(|_| ledger.let_go(usage.member, &shared, tenant.budget()))?;
                handles.physical_shares.insert(*handle, vec![shared]);
                handles.physical.insert(
                    *handle,
                    Physical {
                        handle: imported,
                        size,
                        mappings: 0,
                        released: false,
                        imported: true,
                    },
                );
                Ok(u64_payload(&[size]))
            }
            Command::MemAddressReserve {
                size,
                alignment,
                address,
            } => {
                check_room(handles.reservations.len(), limits.allocations)?;
                let reserved = ctx.mem_address_reserve(*size, *alignment, *address)?;
                let range = owner(RangeKind::Reservation);
                if let Err(code) = record_range(tenant, ctx_id, reserved, *size, range) {
                    let _ = ctx.mem_address_free(reserved, *size);
                    return Err(code);
                }
                handles.reservations.insert(reserved, *size);
                Ok(u64_payload(&[reserved]))
            }
            Command::MemAddressFree { address, size } => {
                if handles.reservations.get(address) != Some(size) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                ctx.mem_address_free(*address, *size)?;
                tenant
                    .device_ranges_mut()
                    .remove(*address, owner(RangeKind::Reservation));
                handles.reservations.remove(address);
                Ok(Vec::new())
            }
            Command::MemMap {
                address,
                size,
                offset,
                handle,
            } => {
                let physical = handles
                    .physical
                    .get(handle)
                    .copied()
                    .filter(|p| !p.released)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // Only inside a reservation of this session.
                let inside = handles.reservations.iter().any(|(base, len)| {
                    *address >= *base
                        && address
                            .checked_add(*size)
                            .is_some_and(|end| end <= base.saturating_add(*len))
                });
                if !inside || handles.mappings.contains_key(address) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                check_room(handles.mappings.len(), limits.allocations)?;
                ctx.mem_map(*address, *size, *offset, physical.handle)?;
                handles.mappings.insert(*address, (*size, *handle));
                if let Some(p) = handles.physical.get_mut(handle) {
                    p.mappings += 1;
                }
                Ok(Vec::new())
            }
            Command::MemUnmap { address, size } => {
                let (mapped, handle) = *handles
                    .mappings
                    .get(address)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                if mapped != *size {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                ctx.mem_unmap(*address, *size)?;
                handles.mappings.remove(address);
                let last_of_released = match handles.physical.get_mut(&handle) {
                    Some(p) => {
                        p.mappings = p.mappings.saturating_sub(1);
                        p.released && p.mappings == 0
                    }
                    None => false,
                };
                if last_of_released {
                    forget_physical(handles, tenant, counters, usage, handle);
                }
                Ok(Vec::new())
            }
            Command::MemSetAccess {
                address,
                size,
                flags,
            } => ctx.mem_set_access(*address, *size, *flags).map(empty),
            Command::StreamBeginCapture { stream, mode } => {
                let stream = handles.stream(*stream)?;
                if *mode > CAPTURE_MODE_RELAXED {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                // Every guest thread's calls run on this one thread, which
                // the guest's cuThreadExchangeStreamCaptureMode (PyTorch's
                // allocator relaxes its thread to allocate during a capture)
                // does not reach: a global or thread-local capture here
                // would refuse calls that the guest thread making them may
                // make. The host's capture prohibits nothing.
                ctx.stream_begin_capture(stream, CAPTURE_MODE_RELAXED)
                    .map(empty)
            }
            Command::StreamBeginCaptureToGraph {
                stream,
                mode,
                graph,
                dependencies,
            } => {
                let stream = handles.stream(*stream)?;
                if *mode > CAPTURE_MODE_RELAXED {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let created_graph = handles.graph(*graph)?;
                let deps = handles.dependencies(*graph, dependencies)?;
                // Relaxed, as StreamBeginCapture says why.
                ctx.stream_begin_capture_to_graph(
                    stream,
                    created_graph,
                    &deps,
                    CAPTURE_MODE_RELAXED,
                )
                .map(empty)
            }
            Command::StreamWriteValue {
                stream,
                width,
                address,
                value,
                flags,
            }
            | Command::StreamWaitValue {
                stream,
                width,
                address,
                value,
                flags,
            } => {
                let stream = handles.stream(*stream)?;
                let op = MemoryOp {
                    wait: matches!(command, Command::StreamWaitValue { .. }),
                    address: *address,
                    value: *value,
                    width: *width,
                    flags: *flags,
                };
                check_memory_op(tenant, ctx_id, "stream memory operation", &op)?;
                ctx.stream_memory_op(stream, op).map(empty)
            }
            Command::StreamEndCapture { stream, graph } => {
                let stream = handles.stream(*stream)?;
                // The capture ends whatever happens to its graph: the
                // stream runs its work again.
                let created = ctx.stream_end_capture(stream)?;
                // Into an existing graph: it now holds the driver's nodes
                // too, counted as the driver counts them.
                let target = handles
                    .graphs
                    .iter()
                    .find(|(_, g)| **g == created)
                    .map(|(guest, _)| *guest);
                if let Some(target) = target {
                    let count = ctx.graph_node_count(created, false).unwrap_or(0);
                    let contents = handles.graph_contents.entry(target).or_default();
                    contents.captured = true;
                    contents.weight = contents.weight.max(count as usize);
                    return Ok(Vec::new());
                }
                let kept = check_new(&handles.graphs, *graph)
                    .and_then(|()| check_room(handles.graphs.len(), limits.graphs));
                if let Err(code) = kept {
                    let _ = ctx.graph_destroy(created);
                    return Err(code);
                }
                handles.graphs.insert(*graph, created);
                handles.graph_contents.insert(
                    *graph,
                    GraphNodes {
                        captured: true,
                        ..GraphNodes::default()
                    },
                );
                Ok(Vec::new())
            }
            Command::GraphInstantiate { graph, exec, flags } => {
                check_new(&handles.graph_execs, *exec)?;
                check_room(handles.graph_execs.len(), limits.graphs)?;
                let source = *graph;
                let graph = handles.graph(*graph)?;
                let created = ctx.graph_instantiate(graph, *flags)?;
                handles.graph_execs.insert(*exec, created);
                handles.graph_exec_sources.insert(*exec, source);
                // It holds its graph's allocations until it is destroyed.
                let held = handles
                    .graph_contents
                    .get(&source)
                    .map(|c| c.allocations.clone())
                    .unwrap_or_default();
                for ptr in &held {
                    if let Some(allocation) = handles.graph_allocations.get_mut(ptr) {
                        allocation.holders = allocation.holders.saturating_add(1);
                    }
                }
                handles.graph_exec_allocations.insert(*exec, held);
                // An instantiated graph may hold device memory of its own.
                let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
                Ok(Vec::new())
            }
            Command::GraphLaunch { exec, stream } => {
                let exec = handles.graph_exec(*exec)?;
                let stream = handles.stream(*stream)?;
                ctx.graph_launch(exec, stream).map(empty)
            }
            Command::GraphExecDestroy { exec } => {
                let created = handles.graph_exec(*exec)?;
                ctx.graph_exec_destroy(created)?;
                handles.graph_execs.remove(exec);
                handles.graph_exec_sources.remove(exec);
                let held = handles
                    .graph_exec_allocations
                    .remove(exec)
                    .unwrap_or_default();
                let_go_of_graph_allocations(ctx, handles, tenant, executor, counters, usage, &held);
                Ok(Vec::new())
            }
            Command::GraphDestroy { graph } => {
                let created = handles.graph(*graph)?;
                ctx.graph_destroy(created)?;
                let held = handles
                    .graph_contents
                    .get(graph)
                    .map(|c| c.allocations.clone())
                    .unwrap_or_default();
                handles.remove_graph(*graph);
                let_go_of_graph_allocations(ctx, handles, tenant, executor, counters, usage, &held);
                Ok(Vec::new())
            }
            Command::GraphCreate { graph, flags } => {
                if *flags != 0 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                check_new(&handles.graphs, *graph)?;
                check_room(handles.graphs.len(), limits.graphs)?;
                let created = ctx.graph_create()?;
                handles.graphs.insert(*graph, created);
                handles.graph_contents.insert(*graph, GraphNodes::default());
                Ok(Vec::new())
            }
            Command::GraphClone {
                graph,
                original,
                first_node,
            } => {
                let created_original = handles.graph(*original)?;
                check_new(&handles.graphs, *graph)?;
                check_room(handles.graphs.len(), limits.graphs)?;
                let contents = handles
                    .graph_contents
                    .get(original)
                    .cloned()
                    .unwrap_or_default();
                // A clone would hold the allocations too: not counted here.
                if contents.memory_nodes {
                    warn_limited!(
                        "ctx {ctx_id}: cuGraphClone of a graph with memory-allocation or free \
                         nodes is not supported"
                    );
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                let total = handles.graph_node_weight().saturating_add(contents.weight);
                if total > limits.graph_nodes {
                    return Err(LIMIT_ERROR);
                }
                // The copies' handles: `first_node` on, each new.
                let count = u32::try_from(contents.nodes.len()).map_err(|_| LIMIT_ERROR)?;
                let copies: Vec<u32> = (0..count)
                    .map(|i| first_node.checked_add(i).ok_or(CUDA_ERROR_INVALID_VALUE))
                    .collect::<CuResult<_>>()?;
                for copy in &copies {
                    check_new(&handles.graph_nodes, *copy)?;
                }
                let nodes = handles.dependencies(*original, &contents.nodes)?;
                let (created, created_nodes) = ctx.graph_clone(created_original, &nodes)?;
                handles.graphs.insert(*graph, created);
                for (copy, node) in copies.iter().zip(created_nodes) {
                    handles.graph_nodes.insert(*copy, (*graph, node));
                }
                handles.graph_contents.insert(
                    *graph,
                    GraphNodes {
                        nodes: copies,
                        ..contents
                    },
                );
                Ok(Vec::new())
            }
            Command::GraphAddEmptyNode {
                graph,
                node,
                dependencies,
            } => add_graph_node(
                ctx,
                handles,
                &limits,
                ctx_id,
                *graph,
                *node,
                dependencies,
                &GraphNode::Empty,
                1,
            ),
            Command::GraphAddKernelNode {
                graph,
                node,
                dependencies,
                launch,
            } => {
                // As a launch: a function of the session, its parameter
                // buffer of the size the function's layout has.
                let (function, _) = handles.launch_target(launch)?;
                let spec = kernel_node(function, launch);
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &spec,
                    1,
                )
            }
            Command::GraphAddMemsetNode {
                graph,
                node,
                dependencies,
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                let spec = memset_node(
                    tenant,
                    ctx_id,
                    *dst,
                    *value,
                    *element_size,
                    [*width, *height, *pitch],
                )?;
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &spec,
                    1,
                )
            }
            Command::GraphAddMemcpyNode {
                graph,
                node,
                dependencies,
                dst,
                src,
                size,
            } => {
                // As a device-to-device copy.
                check_device_range(tenant, ctx_id, "a memcpy node's src", *src, *size)?;
                check_device_range(tenant, ctx_id, "a memcpy node's dst", *dst, *size)?;
                let spec = GraphNode::Copy(Copy3D::linear(*dst, *src, *size));
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &spec,
                    1,
                )
            }
            Command::GraphAddMemcpy3DNode {
                graph,
                node,
                dependencies,
                copy,
            } => {
                let spec = copy_node(tenant, ctx_id, copy)?;
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &spec,
                    1,
                )
            }
            Command::GraphAddEventRecordNode {
                graph,
                node,
                dependencies,
                event,
            } => {
                let spec = GraphNode::EventRecord(handles.event(*event)?);
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &spec,
                    1,
                )
            }
            Command::GraphAddEventWaitNode {
                graph,
                node,
                dependencies,
                event,
            } => {
                let spec = GraphNode::EventWait(handles.event(*event)?);
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &spec,
                    1,
                )
            }
            Command::GraphAddChildGraphNode {
                graph,
                node,
                dependencies,
                child,
            } => {
                let created_child = handles.graph(*child)?;
                // The node holds a copy of the child: counted (a captured
                // graph as the driver counts its nodes; captures hold no
                // memory nodes here, stream-ordered memory being the
                // guest's).
                let contents = handles
                    .graph_contents
                    .get(child)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // As the driver (CUDA 13 answers NOT_SUPPORTED): no memory
                // nodes in a child graph.
                if contents.memory_nodes {
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                let counted = if contents.captured {
                    let driver_count = ctx.graph_node_count(created_child, false)?;
                    contents.weight.max(driver_count as usize)
                } else {
                    contents.weight
                };
                let weight = counted.saturating_add(1);
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &GraphNode::Child(created_child),
                    weight,
                )
            }
            Command::GraphAddMemAllocNode {
                graph,
                node,
                dependencies,
                size,
            } => {
                if *size == 0 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                check_room(handles.graph_allocations.len(), limits.allocations)?;
                let (created_graph, deps) =
                    prepare_graph_node(handles, &limits, ctx_id, *graph, *node, dependencies, 1)?;
                // As MemAlloc: past the tenant's memory limit the driver is
                // not asked; the whole size counts from now (the driver
                // reserves the address now and backs it when the graph
                // runs).
                let budget = tenant.budget();
                if !tenant.reserve_memory(*size, executor, counters) {
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                let (created, ptr) = ctx
                    .graph_add_mem_alloc_node(created_graph, &deps, *size)
                    .inspect_err(|_| {
                        if let Some(budget) = budget {
                            budget.release(*size);
                        }
                    })?;
                record_graph_node(handles, *graph, *node, created, 1);
                let contents = handles.graph_contents.entry(*graph).or_default();
                contents.allocations.push(ptr);
                contents.memory_nodes = true;
                let allocation = GraphAllocation {
                    size: *size,
                    holders: 1,
                };
                if let Some(old) = handles.graph_allocations.insert(ptr, allocation) {
                    Counters::sub(&counters.device_memory_bytes, old.size);
                    usage.sub_device_memory(old.size);
                }
                Counters::add(&counters.device_memory_bytes, *size);
                usage.add_device_memory(*size);
                // Its nodes, and copies of the process, may name it now.
                record_range(
                    tenant,
                    ctx_id,
                    ptr,
                    *size,
                    owner(RangeKind::GraphAllocation),
                )?;
                Ok(u64_payload(&[ptr]))
            }
            Command::GraphAddMemOpNode {
                graph,
                node,
                dependencies,
                wait,
                width,
                address,
                value,
                flags,
            } => {
                if *wait > 1 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let op = node_memory_op(tenant, ctx_id, *wait, *width, *address, *value, *flags)?;
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &GraphNode::MemOp(op),
                    1,
                )
            }
            Command::GraphAddMemFreeNode {
                graph,
                node,
                dependencies,
                dptr,
            } => {
                if !handles.graph_allocations.contains_key(dptr) {
                    warn_limited!(
                        "ctx {ctx_id}: a memory-free node of {dptr:#x}, which is no graph \
                         allocation of this session; refused"
                    );
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                add_graph_node(
                    ctx,
                    handles,
                    &limits,
                    ctx_id,
                    *graph,
                    *node,
                    dependencies,
                    &GraphNode::MemFree(*dptr),
                    1,
                )?;
                handles
                    .graph_contents
                    .entry(*graph)
                    .or_default()
                    .memory_nodes = true;
                Ok(Vec::new())
            }
            Command::GraphKernelNodeSetParams { node, launch } => {
                let created = handles.graph_node(*node, None)?;
                let (function, _) = handles.launch_target(launch)?;
                ctx.graph_node_set_params(created, &kernel_node(function, launch))
                    .map(empty)
            }
            Command::GraphMemsetNodeSetParams {
                node,
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                let created = handles.graph_node(*node, None)?;
                let spec = memset_node(
                    tenant,
                    ctx_id,
                    *dst,
                    *value,
                    *element_size,
                    [*width, *height, *pitch],
                )?;
                ctx.graph_node_set_params(created, &spec).map(empty)
            }
            Command::GraphAddDependencies { graph, from, to }
            | Command::GraphRemoveDependencies { graph, from, to } => {
                if from.len() != to.len() {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let created_graph = handles.graph(*graph)?;
                let (from, to) = (
                    handles.dependencies(*graph, from)?,
                    handles.dependencies(*graph, to)?,
                );
                let add = matches!(command, Command::GraphAddDependencies { .. });
                ctx.graph_edges(created_graph, &from, &to, add).map(empty)
            }
            Command::GraphDestroyNode { node } => {
                let (graph, created) = *handles
                    .graph_nodes
                    .get(node)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // What a memory node holds stays the graph's.
                if handles
                    .graph_contents
                    .get(&graph)
                    .is_some_and(|c| c.memory_nodes)
                {
                    warn_limited!(
                        "ctx {ctx_id}: cuGraphDestroyNode in a graph with memory nodes is not \
                         supported"
                    );
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                ctx.graph_destroy_node(created)?;
                handles.graph_nodes.remove(node);
                Ok(Vec::new())
            }
            Command::GraphMemcpyNodeSetParams { node, copy } => {
                let created = handles.graph_node(*node, None)?;
                let spec = copy_node(tenant, ctx_id, copy)?;
                ctx.graph_node_set_params(created, &spec).map(empty)
            }
            Command::GraphExecMemcpyNodeSetParams { exec, node, copy } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                let spec = copy_node(tenant, ctx_id, copy)?;
                ctx.graph_exec_node_set_params(created_exec, created, &spec)
                    .map(empty)
            }
            Command::GraphExecKernelNodeSetParams { exec, node, launch } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                let (function, _) = handles.launch_target(launch)?;
                let spec = kernel_node(function, launch);
                ctx.graph_exec_node_set_params(created_exec, created, &spec)
                    .map(empty)
            }
            Command::GraphExecMemsetNodeSetParams {
                exec,
                node,
                dst,
                value,
                element_size,
                width,
                height,
                pitch,
            } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                let spec = memset_node(
                    tenant,
                    ctx_id,
                    *dst,
                    *value,
                    *element_size,
                    [*width, *height, *pitch],
                )?;
                ctx.graph_exec_node_set_params(created_exec, created, &spec)
                    .map(empty)
            }
            Command::GraphEventNodeSetEvent { node, event, wait } => {
                let created = handles.graph_node(*node, None)?;
                let spec = event_node(handles, *event, *wait)?;
                ctx.graph_node_set_params(created, &spec).map(empty)
            }
            Command::GraphExecEventNodeSetEvent {
                exec,
                node,
                event,
                wait,
            } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                let spec = event_node(handles, *event, *wait)?;
                ctx.graph_exec_node_set_params(created_exec, created, &spec)
                    .map(empty)
            }
            Command::GraphExecChildGraphNodeSetParams { exec, node, child } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                let created_child = handles.graph(*child)?;
                // As when the node was added: no memory nodes in a child.
                if handles
                    .graph_contents
                    .get(child)
                    .is_some_and(|c| c.memory_nodes)
                {
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                ctx.graph_exec_node_set_params(
                    created_exec,
                    created,
                    &GraphNode::Child(created_child),
                )
                .map(empty)
            }
            Command::GraphMemOpNodeSetParams {
                node,
                wait,
                width,
                address,
                value,
                flags,
            } => {
                let created = handles.graph_node(*node, None)?;
                let op = node_memory_op(tenant, ctx_id, *wait, *width, *address, *value, *flags)?;
                ctx.graph_node_set_params(created, &GraphNode::MemOp(op))
                    .map(empty)
            }
            Command::GraphExecMemOpNodeSetParams {
                exec,
                node,
                wait,
                width,
                address,
                value,
                flags,
            } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                let op = node_memory_op(tenant, ctx_id, *wait, *width, *address, *value, *flags)?;
                ctx.graph_exec_node_set_params(created_exec, created, &GraphNode::MemOp(op))
                    .map(empty)
            }
            Command::StreamSetAttribute { stream, attribute } => {
                let stream = handles.stream(*stream)?;
                let [attribute] = attribute.as_slice() else {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                };
                if !STREAM_ATTRIBUTES.contains(&attribute.id) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let hint = launch_hint(attribute, handles, tenant, ctx_id)?;
                ctx.stream_set_attribute(stream, &hint).map(empty)
            }
            Command::StreamGetAttribute { stream, id } => {
                let stream = handles.stream(*stream)?;
                if !STREAM_ATTRIBUTES.contains(id) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                ctx.stream_get_attribute(stream, *id)
                    .map(|value| value_union_payload(&value))
            }
            Command::StreamCopyAttributes { dst, src } => {
                let (dst, src) = (handles.stream(*dst)?, handles.stream(*src)?);
                ctx.stream_copy_attributes(dst, src).map(empty)
            }
            Command::GraphKernelNodeSetAttribute { node, attribute } => {
                let created = handles.graph_node(*node, None)?;
                let [attribute] = attribute.as_slice() else {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                };
                let spec = kernel_node_attribute(attribute, handles, tenant, ctx_id)?;
                ctx.graph_kernel_node_set_attribute(created, &spec)
                    .map(empty)
            }
            Command::GraphKernelNodeGetAttribute { node, id } => {
                let created = handles.graph_node(*node, None)?;
                // An event's value would be the host's handle of it.
                if matches!(
                    *id,
                    launch_attribute::PROGRAMMATIC_EVENT
                        | launch_attribute::LAUNCH_COMPLETION_EVENT
                ) {
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                ctx.graph_kernel_node_get_attribute(created, *id)
                    .map(|value| value_union_payload(&value))
            }
            Command::GraphKernelNodeCopyAttributes { dst, src } => {
                let (dst, src) = (
                    handles.graph_node(*dst, None)?,
                    handles.graph_node(*src, None)?,
                );
                ctx.graph_kernel_node_copy_attributes(dst, src).map(empty)
            }
            Command::GraphExecNodeSetEnabled {
                exec,
                node,
                enabled,
            } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                ctx.graph_exec_node_set_enabled(created_exec, created, *enabled != 0)
                    .map(empty)
            }
            Command::GraphExecNodeGetEnabled { exec, node } => {
                let (created_exec, created) = exec_node(handles, *exec, *node)?;
                ctx.graph_exec_node_enabled(created_exec, created)
                    .map(|enabled| u64_payload(&[u64::from(enabled)]))
            }
            Command::GraphExecUpdate { exec, graph } => {
                let created_exec = handles.graph_exec(*exec)?;
                let created_graph = handles.graph(*graph)?;
                // The allocations an executable graph holds stay those it
                // was made with.
                let memory_nodes = |g: Option<&u32>| {
                    g.and_then(|g| handles.graph_contents.get(g))
                        .is_some_and(|c| c.memory_nodes)
                };
                if memory_nodes(Some(graph))
                    || memory_nodes(handles.graph_exec_sources.get(exec))
                    || handles
                        .graph_exec_allocations
                        .get(exec)
                        .is_some_and(|held| !held.is_empty())
                {
                    warn_limited!(
                        "ctx {ctx_id}: cuGraphExecUpdate of a graph with memory-allocation or \
                         free nodes is not supported"
                    );
                    return Ok(u64_payload(&[
                        CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE.into(),
                        exec_update::NOT_SUPPORTED.into(),
                        0,
                    ]));
                }
                let update = ctx.graph_exec_update(created_exec, created_graph)?;
                let error_node = handles.guest_node(update.error_node);
                Ok(u64_payload(&[
                    update.result.into(),
                    update.update_result.into(),
                    error_node.into(),
                ]))
            }
            Command::GraphUpload { exec, stream } => {
                let exec = handles.graph_exec(*exec)?;
                let stream = handles.stream(*stream)?;
                ctx.graph_upload(exec, stream).map(empty)
            }
            Command::GraphGetNodeCount { graph } | Command::GraphGetRootNodeCount { graph } => {
                let roots = matches!(command, Command::GraphGetRootNodeCount { .. });
                let graph = handles.graph(*graph)?;
                ctx.graph_node_count(graph, roots)
                    .map(|count| u64_payload(&[count]))
            }
            Command::IpcGetMemHandle { device_ptr } => {
                // Only a `cuMemAlloc` allocation of this process: the driver
                // exports whatever its process holds (registered host
                // memory, another guest's pointer).
                let Some(base) = tenant.device_ranges().allocation_holding(*device_ptr) else {
                    warn_limited!(
                        "ctx {ctx_id}: cuIpcGetMemHandle of {device_ptr:#x}, which is no \
                         allocation of this process; refused"
                    );
                    return Err(CUDA_ERROR_INVALID_VALUE);
                };
                // The session's own (the guest asks through the owning
                // context): its free tells the ledger.
                let size = *handles
                    .allocations
                    .get(&base)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let handle = ctx.ipc_get_mem_handle(*device_ptr)?;
                let shared = ipc_key(&handle);
                if !tenant.ledger().share(usage.member, &shared, size) {
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                handles.ipc_shared.insert(base, shared);
                tenant
                    .ipc()
                    .export(ctx_id, IpcKind::Memory, base, &handle)?;
                Ok(handle.to_vec())
            }
            Command::IpcOpenMemHandle { handle, flags } => {
                tenant.ipc().check_open(ctx_id, IpcKind::Memory, handle)?;
                if *flags & !IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                check_room(handles.ipc_mappings.len(), limits.allocations)?;
                let (ptr, size) = ctx.ipc_open_mem_handle(handle, *flags)?;
                if let Some(mapping) = handles.ipc_mappings.get_mut(&ptr) {
                    mapping.opens = mapping.opens.saturating_add(1);
                } else {
                    // Held in the tenant's ledger while open here (the
                    // driver keeps it for this process); B's kernels and
                    // copies may use it from now on.
                    let shared = ipc_key(handle);
                    let ledger = tenant.ledger();
                    if !ledger.hold(usage.member, &shared) {
                        let _ = ctx.ipc_close_mem_handle(ptr);
                        return Err(CUDA_ERROR_INVALID_HANDLE);
                    }
                    let range = owner(RangeKind::IpcMapping);
                    if let Err(code) = record_range(tenant, ctx_id, ptr, size, range) {
                        let _ = ctx.ipc_close_mem_handle(ptr);
                        ledger.let_go(usage.member, &shared, tenant.budget());
                        return Err(code);
                    }
                    handles.ipc_mappings.insert(
                        ptr,
                        IpcMapping {
                            size,
                            key: shared,
                            opens: 1,
                        },
                    );
                }
                Ok(u64_payload(&[ptr, size]))
            }
            Command::IpcCloseMemHandle { device_ptr } => {
                let mapping = *handles
                    .ipc_mappings
                    .get(device_ptr)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let range = owner(RangeKind::IpcMapping);
                let last = mapping.opens <= 1;
                // The last close unmaps it: forgotten first, as in MemFree.
                if last {
                    tenant.device_ranges_mut().remove(*device_ptr, range);
                }
                if let Err(code) = ctx.ipc_close_mem_handle(*device_ptr) {
                    if last {
                        let _ = record_range(tenant, ctx_id, *device_ptr, mapping.size, range);
                    }
                    return Err(code);
                }
                if last {
                    handles.ipc_mappings.remove(device_ptr);
                    tenant
                        .ledger()
                        .let_go(usage.member, &mapping.key, tenant.budget());
                } else if let Some(m) = handles.ipc_mappings.get_mut(device_ptr) {
                    m.opens -= 1;
                }
                Ok(Vec::new())
            }
            Command::IpcGetEventHandle { event } => {
                let created = handles.event(*event)?;
                let handle = ctx.ipc_get_event_handle(created)?;
                let key = event_key(usage.member, *event);
                tenant.ipc().export(ctx_id, IpcKind::Event, key, &handle)?;
                Ok(handle.to_vec())
            }
            Command::IpcOpenEventHandle { event, handle } => {
                check_new(&handles.events, *event)?;
                check_room(handles.events.len(), limits.events)?;
                tenant.ipc().check_open(ctx_id, IpcKind::Event, handle)?;
                let created = ctx.ipc_open_event_handle(handle)?;
                handles.events.insert(*event, created);
                Ok(Vec::new())
            }
        }
    }
}

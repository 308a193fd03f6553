//! Graphs built node by node, captured graphs, executable graphs.

use super::*;

/// `GraphInstantiate`.
pub(super) fn graph_instantiate(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphInstantiate { graph, exec, flags } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    check_new(&handles.graph_execs, *exec)?;
    check_room(handles.graph_execs.len(), limits.graphs)?;
    let source = *graph;
    let graph = handles.graph(*graph)?;
    let created = ctx.graph_instantiate(graph, *flags)?;
    handles.graph_execs.insert(*exec, created);
    handles.graph_exec_sources.insert(*exec, source);
    // It holds its graph's allocations until it is destroyed.
    handles.graph_exec_allocations.insert(*exec, Vec::new());
    hold_graph_allocations(handles, *exec, source);
    // An instantiated graph may hold device memory of its own.
    let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
    Ok(Vec::new())
}

/// Executable graph `exec` holds the allocations of `graph`'s memory nodes
/// (those it does not hold yet) until it is destroyed.
fn hold_graph_allocations(handles: &mut Handles, exec: u32, graph: u32) {
    let allocations = handles
        .graph_contents
        .get(&graph)
        .map(|c| c.allocations.clone())
        .unwrap_or_default();
    let held = handles.graph_exec_allocations.entry(exec).or_default();
    for ptr in allocations {
        if held.contains(&ptr) {
            continue;
        }
        if let Some(allocation) = handles.graph_allocations.get_mut(&ptr) {
            allocation.holders = allocation.holders.saturating_add(1);
        }
        held.push(ptr);
    }
}

/// `GraphLaunch`.
pub(super) fn graph_launch(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphLaunch { exec, stream } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let exec = handles.graph_exec(*exec)?;
    let stream = handles.stream(*stream)?;
    ctx.graph_launch(exec, stream).map(empty)
}

/// `GraphExecDestroy`.
pub(super) fn graph_exec_destroy(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphExecDestroy { exec } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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

/// `GraphDestroy`.
pub(super) fn graph_destroy(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphDestroy { graph } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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

/// `GraphCreate`.
pub(super) fn graph_create(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphCreate { graph, flags } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphClone`.
pub(super) fn graph_clone(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphClone {
        graph,
        original,
        first_node,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddEmptyNode`.
pub(super) fn graph_add_empty_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddEmptyNode {
        graph,
        node,
        dependencies,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    add_graph_node(
        ctx,
        handles,
        &limits,
        ctx_id,
        *graph,
        *node,
        dependencies,
        &GraphNode::Empty,
        1,
    )
}

/// `GraphAddKernelNode`.
pub(super) fn graph_add_kernel_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddKernelNode {
        graph,
        node,
        dependencies,
        launch,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddMemsetNode`.
pub(super) fn graph_add_memset_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddMemsetNode {
        graph,
        node,
        dependencies,
        dst,
        value,
        element_size,
        width,
        height,
        pitch,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddMemcpyNode`.
pub(super) fn graph_add_memcpy_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddMemcpyNode {
        graph,
        node,
        dependencies,
        dst,
        src,
        size,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddMemcpy3DNode`.
pub(super) fn graph_add_memcpy_3d_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddMemcpy3DNode {
        graph,
        node,
        dependencies,
        copy,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddEventRecordNode`, `GraphAddEventWaitNode`.
pub(super) fn graph_add_event_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let (Command::GraphAddEventRecordNode {
        graph,
        node,
        dependencies,
        event,
    }
    | Command::GraphAddEventWaitNode {
        graph,
        node,
        dependencies,
        event,
    }) = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.event(*event)?;
    let spec = match command {
        Command::GraphAddEventRecordNode { .. } => GraphNode::EventRecord(created),
        _ => GraphNode::EventWait(created),
    };
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

/// `GraphAddChildGraphNode`.
pub(super) fn graph_add_child_graph_node(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphAddChildGraphNode {
        graph,
        node,
        dependencies,
        child,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddMemAllocNode`.
pub(super) fn graph_add_mem_alloc_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddMemAllocNode {
        graph,
        node,
        dependencies,
        size,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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
        range_owner(usage, RangeKind::GraphAllocation),
    )?;
    Ok(u64_payload(&[ptr]))
}

/// `GraphAddMemOpNode`.
pub(super) fn graph_add_mem_op_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddMemOpNode {
        graph,
        node,
        dependencies,
        wait,
        width,
        address,
        value,
        flags,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddMemFreeNode`.
pub(super) fn graph_add_mem_free_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphAddMemFreeNode {
        graph,
        node,
        dependencies,
        dptr,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphKernelNodeSetParams`.
pub(super) fn graph_kernel_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphKernelNodeSetParams { node, launch } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.graph_node(*node, None)?;
    let (function, _) = handles.launch_target(launch)?;
    ctx.graph_node_set_params(created, &kernel_node(function, launch))
        .map(empty)
}

/// `GraphMemsetNodeSetParams`.
pub(super) fn graph_memset_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphMemsetNodeSetParams {
        node,
        dst,
        value,
        element_size,
        width,
        height,
        pitch,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphAddDependencies`, `GraphRemoveDependencies`.
pub(super) fn graph_add_dependencies(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let (Command::GraphAddDependencies { graph, from, to }
    | Command::GraphRemoveDependencies { graph, from, to }) = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphDestroyNode`.
pub(super) fn graph_destroy_node(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphDestroyNode { node } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphMemcpyNodeSetParams`.
pub(super) fn graph_memcpy_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphMemcpyNodeSetParams { node, copy } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.graph_node(*node, None)?;
    let spec = copy_node(tenant, ctx_id, copy)?;
    ctx.graph_node_set_params(created, &spec).map(empty)
}

/// `GraphExecMemcpyNodeSetParams`.
pub(super) fn graph_exec_memcpy_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecMemcpyNodeSetParams { exec, node, copy } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (created_exec, created) = exec_node(handles, *exec, *node)?;
    let spec = copy_node(tenant, ctx_id, copy)?;
    ctx.graph_exec_node_set_params(created_exec, created, &spec)
        .map(empty)
}

/// `GraphExecKernelNodeSetParams`.
pub(super) fn graph_exec_kernel_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecKernelNodeSetParams { exec, node, launch } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (created_exec, created) = exec_node(handles, *exec, *node)?;
    let (function, _) = handles.launch_target(launch)?;
    let spec = kernel_node(function, launch);
    ctx.graph_exec_node_set_params(created_exec, created, &spec)
        .map(empty)
}

/// `GraphExecMemsetNodeSetParams`.
pub(super) fn graph_exec_memset_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecMemsetNodeSetParams {
        exec,
        node,
        dst,
        value,
        element_size,
        width,
        height,
        pitch,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `GraphEventNodeSetEvent`.
pub(super) fn graph_event_node_set_event(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphEventNodeSetEvent { node, event, wait } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.graph_node(*node, None)?;
    let spec = event_node(handles, *event, *wait)?;
    ctx.graph_node_set_params(created, &spec).map(empty)
}

/// `GraphExecEventNodeSetEvent`.
pub(super) fn graph_exec_event_node_set_event(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecEventNodeSetEvent {
        exec,
        node,
        event,
        wait,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (created_exec, created) = exec_node(handles, *exec, *node)?;
    let spec = event_node(handles, *event, *wait)?;
    ctx.graph_exec_node_set_params(created_exec, created, &spec)
        .map(empty)
}

/// `GraphExecChildGraphNodeSetParams`.
pub(super) fn graph_exec_child_graph_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecChildGraphNodeSetParams { exec, node, child } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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
    ctx.graph_exec_node_set_params(created_exec, created, &GraphNode::Child(created_child))
        .map(empty)
}

/// `GraphMemOpNodeSetParams`.
pub(super) fn graph_mem_op_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphMemOpNodeSetParams {
        node,
        wait,
        width,
        address,
        value,
        flags,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.graph_node(*node, None)?;
    let op = node_memory_op(tenant, ctx_id, *wait, *width, *address, *value, *flags)?;
    ctx.graph_node_set_params(created, &GraphNode::MemOp(op))
        .map(empty)
}

/// `GraphExecMemOpNodeSetParams`.
pub(super) fn graph_exec_mem_op_node_set_params(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecMemOpNodeSetParams {
        exec,
        node,
        wait,
        width,
        address,
        value,
        flags,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (created_exec, created) = exec_node(handles, *exec, *node)?;
    let op = node_memory_op(tenant, ctx_id, *wait, *width, *address, *value, *flags)?;
    ctx.graph_exec_node_set_params(created_exec, created, &GraphNode::MemOp(op))
        .map(empty)
}

/// `GraphKernelNodeSetAttribute`.
pub(super) fn graph_kernel_node_set_attribute(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphKernelNodeSetAttribute { node, attribute } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.graph_node(*node, None)?;
    let [attribute] = attribute.as_slice() else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let spec = kernel_node_attribute(attribute, handles, tenant, ctx_id)?;
    ctx.graph_kernel_node_set_attribute(created, &spec)
        .map(empty)
}

/// `GraphKernelNodeGetAttribute`.
pub(super) fn graph_kernel_node_get_attribute(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphKernelNodeGetAttribute { node, id } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.graph_node(*node, None)?;
    // An event's value would be the host's handle of it.
    if matches!(
        *id,
        launch_attribute::PROGRAMMATIC_EVENT | launch_attribute::LAUNCH_COMPLETION_EVENT
    ) {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    ctx.graph_kernel_node_get_attribute(created, *id)
        .map(|value| value_union_payload(&value))
}

/// `GraphKernelNodeCopyAttributes`.
pub(super) fn graph_kernel_node_copy_attributes(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphKernelNodeCopyAttributes { dst, src } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (dst, src) = (
        handles.graph_node(*dst, None)?,
        handles.graph_node(*src, None)?,
    );
    ctx.graph_kernel_node_copy_attributes(dst, src).map(empty)
}

/// `GraphExecNodeSetEnabled`.
pub(super) fn graph_exec_node_set_enabled(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecNodeSetEnabled {
        exec,
        node,
        enabled,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (created_exec, created) = exec_node(handles, *exec, *node)?;
    ctx.graph_exec_node_set_enabled(created_exec, created, *enabled != 0)
        .map(empty)
}

/// `GraphExecNodeGetEnabled`.
pub(super) fn graph_exec_node_get_enabled(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::GraphExecNodeGetEnabled { exec, node } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (created_exec, created) = exec_node(handles, *exec, *node)?;
    ctx.graph_exec_node_enabled(created_exec, created)
        .map(|enabled| u64_payload(&[u64::from(enabled)]))
}

/// `GraphExecUpdate`. Graphs with memory nodes are updated too, as the
/// driver allows (it keeps a graph's allocations with one executable graph
/// at a time); the executable graph then also holds the allocations of
/// the graph it was updated from, so that they stay charged while it may
/// use them.
pub(super) fn graph_exec_update(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphExecUpdate { exec, graph } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created_exec = handles.graph_exec(*exec)?;
    let created_graph = handles.graph(*graph)?;
    let update = ctx.graph_exec_update(created_exec, created_graph)?;
    if update.result == CUDA_SUCCESS {
        hold_graph_allocations(handles, *exec, *graph);
    }
    let error_node = handles.guest_node(update.error_node);
    Ok(u64_payload(&[
        update.result.into(),
        update.update_result.into(),
        error_node.into(),
    ]))
}

/// `GraphUpload`.
pub(super) fn graph_upload(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphUpload { exec, stream } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let exec = handles.graph_exec(*exec)?;
    let stream = handles.stream(*stream)?;
    ctx.graph_upload(exec, stream).map(empty)
}

/// `GraphNameNodes`: nodes as the driver lists them, those without a
/// guest handle named from `first_node` on (at most `room`, and within the
/// session's node limit).
pub(super) fn graph_name_nodes(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::GraphNameNodes {
        which,
        handle,
        first_node,
        room,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (listing, graph) = match *which {
        name_nodes::NODES | name_nodes::ROOTS => (
            DriverNodes::Graph {
                graph: handles.graph(*handle)?,
                roots: *which == name_nodes::ROOTS,
            },
            *handle,
        ),
        name_nodes::CAPTURE_DEPENDENCIES => {
            let stream = handles.stream(*handle)?;
            let created = ctx.stream_capture_graph(stream)?;
            // The guest names the capture's graph first.
            let graph = handles
                .guest_graph(created)
                .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
            (DriverNodes::CaptureDependencies(stream), graph)
        }
        name_nodes::DEPENDENCIES | name_nodes::DEPENDENTS => {
            let (graph, created) = *handles
                .graph_nodes
                .get(handle)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            (
                DriverNodes::Edges {
                    node: created,
                    dependents: *which == name_nodes::DEPENDENTS,
                },
                graph,
            )
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let listed = ctx.graph_driver_nodes(listing)?;
    let mut named: HashMap<u64, u32> = handles
        .graph_nodes
        .iter()
        .map(|(guest, (_, created))| (*created, *guest))
        .collect();
    let mut answer = Vec::with_capacity(1 + 2 * listed.len());
    answer.push(listed.len() as u64);
    let mut used = 0u32;
    for (created, kind) in listed {
        let guest = match named.get(&created) {
            Some(guest) => *guest,
            None if used < *room && handles.graph_nodes.len() < limits.graph_nodes => {
                let guest = first_node
                    .checked_add(used)
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                check_new(&handles.graph_nodes, guest)?;
                used += 1;
                handles.graph_nodes.insert(guest, (graph, created));
                named.insert(created, guest);
                guest
            }
            None => 0,
        };
        answer.push(u64::from(guest));
        answer.push(u64::from(kind));
    }
    Ok(u64_payload(&answer))
}

/// `GraphGetNodeCount`, `GraphGetRootNodeCount`.
pub(super) fn graph_get_node_count(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let (Command::GraphGetNodeCount { graph } | Command::GraphGetRootNodeCount { graph }) = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let roots = matches!(command, Command::GraphGetRootNodeCount { .. });
    let graph = handles.graph(*graph)?;
    ctx.graph_node_count(graph, roots)
        .map(|count| u64_payload(&[count]))
}

//! Streams: creation, synchronization, queries, waits, capture, memory operations and attributes.

use super::*;

/// `StreamCreate`.
pub(super) fn stream_create(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamCreate {
        stream,
        flags,
        priority,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    if *stream == STREAM_PER_THREAD {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_new(&handles.streams, *stream)?;
    check_room(handles.streams.len(), limits.streams)?;
    let created = ctx.stream_create(*flags, *priority)?;
    handles.streams.insert(*stream, created);
    Ok(Vec::new())
}

/// `StreamDestroy`.
pub(super) fn stream_destroy(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamDestroy { stream } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    // The default streams are not the guest's to destroy.
    let created = *handles
        .streams
        .get(stream)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    ctx.stream_destroy(created)?;
    handles.streams.remove(stream);
    Ok(Vec::new())
}

/// `StreamSynchronize`.
pub(super) fn stream_synchronize(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamSynchronize { stream } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    ctx.stream_synchronize(stream).map(empty)
}

/// `StreamQuery`.
pub(super) fn stream_query(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamQuery { stream } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    ctx.stream_query(stream).map(empty)
}

/// `StreamWaitEvent`.
pub(super) fn stream_wait_event(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamWaitEvent {
        stream,
        event,
        flags,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    let event = handles.event(*event)?;
    ctx.stream_wait_event(stream, event, *flags).map(empty)
}

/// `StreamBeginCapture`.
pub(super) fn stream_begin_capture(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamBeginCapture { stream, mode } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `StreamBeginCaptureToGraph`.
pub(super) fn stream_begin_capture_to_graph(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::StreamBeginCaptureToGraph {
        stream,
        mode,
        graph,
        dependencies,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    if *mode > CAPTURE_MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let created_graph = handles.graph(*graph)?;
    let deps = handles.dependencies(*graph, dependencies)?;
    // Relaxed, as StreamBeginCapture says why.
    ctx.stream_begin_capture_to_graph(stream, created_graph, &deps, CAPTURE_MODE_RELAXED)
        .map(empty)
}

/// `StreamWriteValue`, `StreamWaitValue`.
pub(super) fn stream_write_value(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let (Command::StreamWriteValue {
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
    }) = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `StreamEndCapture`.
pub(super) fn stream_end_capture(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamEndCapture { stream, graph } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    // A graph named while capturing goes with a capture that fails.
    let named = ctx
        .stream_capture_graph(stream)
        .ok()
        .and_then(|created| handles.guest_graph(created))
        .filter(|g| {
            handles
                .graph_contents
                .get(g)
                .is_some_and(|c| c.named_while_capturing)
        });
    // The capture ends whatever happens to its graph: the
    // stream runs its work again.
    let created = match ctx.stream_end_capture(stream) {
        Ok(created) => created,
        Err(code) => {
            if let Some(named) = named {
                handles.remove_graph(named);
            }
            return Err(code);
        }
    };
    // Into an existing graph: it now holds the driver's nodes
    // too, counted as the driver counts them.
    if let Some(target) = handles.guest_graph(created) {
        let count = ctx.graph_node_count(created, false).unwrap_or(0);
        let contents = handles.graph_contents.entry(target).or_default();
        contents.captured = true;
        contents.named_while_capturing = false;
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

/// `StreamCaptureGraph`: the graph a capture records into gets a guest
/// handle while the capture goes on (`cuStreamGetCaptureInfo`); the
/// capture then ends in it.
pub(super) fn stream_capture_graph(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamCaptureGraph { stream, graph } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    check_new(&handles.graphs, *graph)?;
    check_room(handles.graphs.len(), limits.graphs)?;
    let created = ctx.stream_capture_graph(stream)?;
    // Named once (a capture into an existing graph has its handle).
    if handles.guest_graph(created).is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    handles.graphs.insert(*graph, created);
    handles.graph_contents.insert(
        *graph,
        GraphNodes {
            captured: true,
            named_while_capturing: true,
            ..GraphNodes::default()
        },
    );
    Ok(Vec::new())
}

/// `StreamUpdateCaptureDependencies`: nodes of the capture's graph.
pub(super) fn stream_update_capture_dependencies(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::StreamUpdateCaptureDependencies {
        stream,
        nodes,
        flags,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    let created = ctx.stream_capture_graph(stream)?;
    let graph = handles
        .guest_graph(created)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let nodes = nodes
        .iter()
        .map(|n| handles.graph_node(*n, Some(graph)))
        .collect::<CuResult<Vec<_>>>()?;
    ctx.stream_update_capture_dependencies(stream, &nodes, *flags)
        .map(empty)
}

/// `StreamSetAttribute`.
pub(super) fn stream_set_attribute(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamSetAttribute { stream, attribute } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `StreamGetAttribute`.
pub(super) fn stream_get_attribute(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamGetAttribute { stream, id } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    if !STREAM_ATTRIBUTES.contains(id) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ctx.stream_get_attribute(stream, *id)
        .map(|value| value_union_payload(&value))
}

/// `StreamCopyAttributes`.
pub(super) fn stream_copy_attributes(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::StreamCopyAttributes { dst, src } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (dst, src) = (handles.stream(*dst)?, handles.stream(*src)?);
    ctx.stream_copy_attributes(dst, src).map(empty)
}

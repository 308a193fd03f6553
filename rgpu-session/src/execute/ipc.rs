//! CUDA IPC of memory and events within a tenant.

use super::*;

/// `IpcGetMemHandle`.
pub(super) fn ipc_get_mem_handle(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::IpcGetMemHandle { device_ptr } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `IpcOpenMemHandle`.
pub(super) fn ipc_open_mem_handle(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::IpcOpenMemHandle { handle, flags } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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
        let range = range_owner(usage, RangeKind::IpcMapping);
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

/// `IpcCloseMemHandle`.
pub(super) fn ipc_close_mem_handle(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::IpcCloseMemHandle { device_ptr } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let mapping = *handles
        .ipc_mappings
        .get(device_ptr)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let range = range_owner(usage, RangeKind::IpcMapping);
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

/// `IpcGetEventHandle`.
pub(super) fn ipc_get_event_handle(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::IpcGetEventHandle { event } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.event(*event)?;
    let handle = ctx.ipc_get_event_handle(created)?;
    let key = event_key(usage.member, *event);
    tenant.ipc().export(ctx_id, IpcKind::Event, key, &handle)?;
    Ok(handle.to_vec())
}

/// `IpcOpenEventHandle`.
pub(super) fn ipc_open_event_handle(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::IpcOpenEventHandle { event, handle } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    check_new(&handles.events, *event)?;
    check_room(handles.events.len(), limits.events)?;
    tenant.ipc().check_open(ctx_id, IpcKind::Event, handle)?;
    let created = ctx.ipc_open_event_handle(handle)?;
    handles.events.insert(*event, created);
    Ok(Vec::new())
}

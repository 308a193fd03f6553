//! The virtual-memory API: physical allocations, reservations, mappings, access, shareable handles.

use super::*;

/// `MemGranularity`.
pub(super) fn mem_granularity(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemGranularity { option } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    ctx.mem_granularity(*option).map(|g| u64_payload(&[g]))
}

/// `MemCreate`.
pub(super) fn mem_create(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemCreate { handle, size } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let limits = env.limits;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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

/// `MemRelease`.
pub(super) fn mem_release(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemRelease { handle } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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

/// `MemExportShareable`.
pub(super) fn mem_export_shareable(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemExportShareable { handle } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `MemImportShareable`.
pub(super) fn mem_import_shareable(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemImportShareable { handle, token } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `MemAddressReserve`.
pub(super) fn mem_address_reserve(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemAddressReserve {
        size,
        alignment,
        address,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    check_room(handles.reservations.len(), limits.allocations)?;
    let reserved = ctx.mem_address_reserve(*size, *alignment, *address)?;
    let range = range_owner(usage, RangeKind::Reservation);
    if let Err(code) = record_range(tenant, ctx_id, reserved, *size, range) {
        let _ = ctx.mem_address_free(reserved, *size);
        return Err(code);
    }
    handles.reservations.insert(reserved, *size);
    Ok(u64_payload(&[reserved]))
}

/// `MemAddressFree`.
pub(super) fn mem_address_free(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemAddressFree { address, size } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    if handles.reservations.get(address) != Some(size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ctx.mem_address_free(*address, *size)?;
    tenant
        .device_ranges_mut()
        .remove(*address, range_owner(usage, RangeKind::Reservation));
    handles.reservations.remove(address);
    Ok(Vec::new())
}

/// `MemMap`.
pub(super) fn mem_map(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemMap {
        address,
        size,
        offset,
        handle,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

/// `MemUnmap`.
pub(super) fn mem_unmap(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemUnmap { address, size } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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

/// `MemSetAccess`.
pub(super) fn mem_set_access(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemSetAccess {
        address,
        size,
        flags,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    ctx.mem_set_access(*address, *size, *flags).map(empty)
}

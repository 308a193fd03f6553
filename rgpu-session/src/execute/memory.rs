//! Memory commands: allocations, copies between blobs and device memory, memsets.

use super::*;

/// `MemAlloc`.
pub(super) fn mem_alloc(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemAlloc { size } = command else {
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
    if let Err(code) = record_range(
        tenant,
        ctx_id,
        ptr,
        *size,
        range_owner(usage, RangeKind::Allocation),
    ) {
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

/// `MemFree`.
pub(super) fn mem_free(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemFree { device_ptr } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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
        .remove(*device_ptr, range_owner(usage, RangeKind::Allocation));
    if let Err(code) = ctx.mem_free(*device_ptr) {
        if forgotten {
            let owner = range_owner(usage, RangeKind::Allocation);
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

/// `MemGetInfo`.
pub(super) fn mem_get_info(env: &mut Env<'_>, _command: &Command) -> CuResult<Vec<u8>> {
    let tenant = env.tenant;
    let ctx = &mut *env.ctx;
    ctx.mem_get_info().map(|(free, total)| {
        let (free, total) = clamp_to_budget(free, total, tenant.budget());
        u64_payload(&[free, total])
    })
}

/// `MemcpyHtoD`.
pub(super) fn memcpy_htod(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemcpyHtoD { stream, dst, src } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let reply_seq = env.reply_seq;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    let blobs = env.blobs;
    let channel_blob = env.channel_blob;
    let stream = handles.stream(*stream)?;
    let source = resolve(blobs, channel_blob, src)?;
    check_device_range(tenant, ctx_id, "MemcpyHtoD dst", *dst, src.length)?;
    let wait = source.staged || reply_seq != 0;
    ctx.memcpy_htod(stream, *dst, &source.runs, wait)?;
    count_copy(counters, &source, src.length);
    Ok(Vec::new())
}

/// `MemcpyDtoH`.
pub(super) fn memcpy_dtoh(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemcpyDtoH { stream, dst, src } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let reply_seq = env.reply_seq;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    let blobs = env.blobs;
    let channel_blob = env.channel_blob;
    let stream = handles.stream(*stream)?;
    let target = resolve(blobs, channel_blob, dst)?;
    check_device_range(tenant, ctx_id, "MemcpyDtoH src", *src, dst.length)?;
    let wait = target.staged || reply_seq != 0;
    ctx.memcpy_dtoh(stream, &target.runs, *src, wait)?;
    count_copy(counters, &target, dst.length);
    Ok(Vec::new())
}

/// `HostDevicePointer`.
pub(super) fn host_device_pointer(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::HostDevicePointer { range } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let blobs = env.blobs;
    let channel_blob = env.channel_blob;
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
        record_range(tenant, ctx_id, start, blob_size, range_owner(usage, kind))?;
    }
    Ok(u64_payload(&[device]))
}

/// `MemcpyDtoD`.
pub(super) fn memcpy_dtod(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::MemcpyDtoD {
        stream,
        dst,
        src,
        size,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    check_device_range(tenant, ctx_id, "MemcpyDtoD src", *src, *size)?;
    check_device_range(tenant, ctx_id, "MemcpyDtoD dst", *dst, *size)?;
    ctx.memcpy_dtod(stream, *dst, *src, *size).map(empty)
}

/// `Memset`.
pub(super) fn memset(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::Memset {
        stream,
        dst,
        value,
        element_size,
        count,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let stream = handles.stream(*stream)?;
    let bytes = count
        .checked_mul(u64::from(*element_size))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    check_device_range(tenant, ctx_id, "Memset dst", *dst, bytes)?;
    ctx.memset(stream, *dst, *value, *element_size, *count)
        .map(empty)
}

//! Modules, functions, globals, occupancy and kernel launches.

use super::*;

/// `ModuleLoad`.
pub(super) fn module_load(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::ModuleLoad { module, image } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    let blobs = env.blobs;
    let module_cache = env.module_cache;
    check_new(&handles.modules, *module)?;
    check_room(handles.modules.len(), limits.modules)?;
    let bytes = read_image(blobs, image, limits.module_image_bytes, ctx_id)?;
    Counters::add(&counters.host_cpu_copy_bytes, image.length);
    let loaded = load_module(ctx, tenant, executor, counters, &bytes)?;
    handles.modules.insert(*module, loaded);
    module_cache.insert(bytes.into());
    Ok(Vec::new())
}

/// `ModuleLoadHashed`.
pub(super) fn module_load_hashed(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::ModuleLoadHashed {
        module,
        hash,
        image,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let ctx_id = env.ctx_id;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    let blobs = env.blobs;
    let module_cache = env.module_cache;
    check_new(&handles.modules, *module)?;
    check_room(handles.modules.len(), limits.modules)?;
    let bytes = read_image(blobs, image, limits.module_image_bytes, ctx_id)?;
    Counters::add(&counters.host_cpu_copy_bytes, image.length);
    // The guest's hash is checked, never trusted: the cache
    // keys images by the hash of what arrived.
    let computed = image_hash(&bytes);
    if computed != *hash {
        warn_limited!("ctx {ctx_id}: module image does not match the hash the guest sent; refused");
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let loaded = load_module(ctx, tenant, executor, counters, &bytes)?;
    handles.modules.insert(*module, loaded);
    module_cache.insert_hashed(computed, bytes.into());
    Ok(Vec::new())
}

/// `ModuleLoadCached`.
pub(super) fn module_load_cached(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::ModuleLoadCached { module, hash } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    let module_cache = env.module_cache;
    check_new(&handles.modules, *module)?;
    check_room(handles.modules.len(), limits.modules)?;
    let image = module_cache.get(hash).ok_or(CUDA_ERROR_NOT_FOUND)?;
    let loaded = load_module(ctx, tenant, executor, counters, &image)?;
    handles.modules.insert(*module, loaded);
    Counters::add(&counters.module_cache_hits, 1);
    Ok(Vec::new())
}

/// `ModuleUnload`.
pub(super) fn module_unload(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::ModuleUnload { module } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
    let loaded = handles.module(*module)?;
    let globals = range_owner(usage, RangeKind::Global { module: *module });
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

/// `ModuleGetFunction`.
pub(super) fn module_get_function(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::ModuleGetFunction {
        module,
        function,
        name,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let limits = env.limits;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let counters = env.counters;
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

/// `ModuleGetGlobal`.
pub(super) fn module_get_global(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::ModuleGetGlobal { module, name } = command else {
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
    let loaded = handles.module(*module)?;
    let name = std::str::from_utf8(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let (ptr, size) = ctx.module_get_global(loaded, name)?;
    let _ = tenant.account_driver_memory(Refresh::Lazy, executor, counters);
    if !handles.globals.contains_key(&ptr) {
        check_room(handles.globals.len(), limits.globals)?;
    }
    let kind = RangeKind::Global { module: *module };
    record_range(tenant, ctx_id, ptr, size, range_owner(usage, kind))?;
    handles.globals.insert(ptr, (*module, size));
    Ok(u64_payload(&[ptr, size]))
}

/// `FuncGetAttribute`.
pub(super) fn func_get_attribute(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::FuncGetAttribute {
        function,
        attribute,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let handle = handles.function(*function)?.handle;
    ctx.func_get_attribute(handle, *attribute)
        .map(|v| v.to_le_bytes().to_vec())
}

/// `FuncSetAttribute`.
pub(super) fn func_set_attribute(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::FuncSetAttribute {
        function,
        attribute,
        value,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let handle = handles.function(*function)?.handle;
    ctx.func_set_attribute(handle, *attribute, *value)
        .map(empty)
}

/// `OccupancyMaxActiveBlocks`.
pub(super) fn occupancy_max_active_blocks(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::OccupancyMaxActiveBlocks {
        function,
        block_size,
        flags,
        dynamic_smem_bytes,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let handle = handles.function(*function)?.handle;
    ctx.occupancy_max_active_blocks(handle, *block_size, *dynamic_smem_bytes, *flags)
        .map(|v| v.to_le_bytes().to_vec())
}

/// `OccupancyAvailableDynamicSmem`.
pub(super) fn occupancy_available_dynamic_smem(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::OccupancyAvailableDynamicSmem {
        function,
        num_blocks,
        block_size,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let handle = handles.function(*function)?.handle;
    ctx.occupancy_available_dynamic_smem(handle, *num_blocks, *block_size)
        .map(|v| u64_payload(&[v]))
}

/// `OccupancyMaxPotentialClusterSize`.
pub(super) fn occupancy_max_potential_cluster_size(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::OccupancyMaxPotentialClusterSize { query } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let handle = handles.function(query.function)?.handle;
    ctx.occupancy_max_potential_cluster_size(handle, query)
        .map(|v| v.to_le_bytes().to_vec())
}

/// `OccupancyMaxActiveClusters`.
pub(super) fn occupancy_max_active_clusters(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::OccupancyMaxActiveClusters { query } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let handle = handles.function(query.function)?.handle;
    ctx.occupancy_max_active_clusters(handle, query)
        .map(|v| v.to_le_bytes().to_vec())
}

/// `LaunchKernel`: its parameter block moves to the executor, uncopied.
pub(super) fn launch_kernel(env: &mut Env<'_>, command: &mut Command) -> CuResult<Vec<u8>> {
    let Command::LaunchKernel { launch } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let (function, stream) = handles.launch_target(launch)?;
    ctx.launch_kernel(
        function,
        launch.grid,
        launch.block,
        launch.shared_mem_bytes,
        stream,
        std::mem::take(&mut launch.params),
    )
    .map(empty)
}

/// `LaunchKernelEx`.
pub(super) fn launch_kernel_ex(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::LaunchKernelEx {
        launch,
        cluster,
        cooperative,
        attributes,
    } = command
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let ctx_id = env.ctx_id;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
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

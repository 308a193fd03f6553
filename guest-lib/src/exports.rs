//! THE list of hand-written driver entry points: one line per exported
//! symbol, with its C signature and the function that implements it.
//!
//! build.rs reads the `fn cuName(` lines of this file: every other symbol of
//! NVIDIA's export list gets a NOT_SUPPORTED stub, and the symbol table
//! behind `cuGetProcAddress` points here for these names. Adding a line here
//! is all it takes to implement a symbol everywhere.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use crate::abi::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream};
use crate::api::context::CtxCreateParams;
use crate::api::copy_2d::Memcpy2D;
use crate::api::graph::{
    CUgraph, CUgraphExec, CUgraphNode, KernelNodeParams, KernelNodeParamsV1, Memcpy3D,
    MemsetNodeParams,
};
use crate::api::ipc::IpcHandle;
use crate::api::launch::LaunchConfig;
use crate::api::library::{CUkernel, CUlibrary};
use crate::api::memory_pool::{CUmemoryPool, PoolProps};
use crate::api::occupancy::BlockToDynamicSmem;
use crate::api::stream_ordered::HostFn;
use crate::api::vmm::{AccessDesc, AllocationProp, MemLocation};
use crate::api::{
    context, copy_2d, device, error, event, export_table, function, graph, host_register, init,
    ipc, launch, library, memory, memory_pool, module, occupancy, peer, pointer, primary_context,
    proc_address, stream, stream_ordered, unified_copy, vmm,
};

rgpu_shim::exported_api! {
    crate::entry::API;
    fn cuInit(flags: c_uint) => init::init;
    fn cuDriverGetVersion(version: *mut c_int) => init::driver_get_version;
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) => proc_address::get_proc_address;
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_int) => proc_address::get_proc_address_v2;
    fn cuGetExportTable(table: *mut *const c_void, id: *const [u8; 16]) => export_table::get;
    fn cuGetErrorName(error: u32, pstr: *mut *const c_char) => error::get_error_name;
    fn cuGetErrorString(error: u32, pstr: *mut *const c_char) => error::get_error_string;

    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) => device::get;
    fn cuDeviceGetCount(count: *mut c_int) => device::get_count;
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) => device::get_name;
    fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) => device::get_uuid;
    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) => device::get_uuid;
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) => device::total_mem_v1;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => device::total_mem;
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) => device::get_attribute;
    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) => device::compute_capability;
    fn cuDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: c_int, dev: CUdevice) => device::get_pci_bus_id;
    fn cuDeviceCanAccessPeer(can_access_peer: *mut c_int, dev: CUdevice, peer_dev: CUdevice) => device::can_access_peer;
    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, pci_bus_id: *const c_char) => device::get_by_pci_bus_id;

    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) => primary_context::retain;
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) => primary_context::release;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => primary_context::release;
    fn cuDevicePrimaryCtxReset(dev: CUdevice) => primary_context::reset;
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => primary_context::reset;
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) => primary_context::get_state;
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) => primary_context::set_flags;
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) => primary_context::set_flags;

    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::create;
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::create;
    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) => context::create_v3;
    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CtxCreateParams, flags: c_uint, dev: CUdevice) => context::create_v4;
    fn cuCtxDestroy(ctx: CUcontext) => context::destroy;
    fn cuCtxDestroy_v2(ctx: CUcontext) => context::destroy;
    fn cuCtxPushCurrent(ctx: CUcontext) => context::push_current;
    fn cuCtxPushCurrent_v2(ctx: CUcontext) => context::push_current;
    fn cuCtxPopCurrent(pctx: *mut CUcontext) => context::pop_current;
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) => context::pop_current;
    fn cuCtxSetCurrent(ctx: CUcontext) => context::set_current;
    fn cuCtxGetCurrent(pctx: *mut CUcontext) => context::get_current;
    fn cuCtxGetDevice(device: *mut CUdevice) => context::get_device;
    fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) => context::get_device_v2;
    fn cuCtxSynchronize() => context::synchronize;
    fn cuCtxSynchronize_v2(ctx: CUcontext) => context::synchronize_v2;
    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) => context::get_api_version;
    fn cuCtxGetFlags(flags: *mut c_uint) => context::get_flags;
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) => context::get_stream_priority_range;
    fn cuCtxGetLimit(pvalue: *mut usize, limit: c_int) => context::get_limit;
    fn cuCtxSetLimit(limit: c_int, value: usize) => context::set_limit;
    fn cuCtxGetCacheConfig(pconfig: *mut c_int) => context::get_cache_config;
    fn cuCtxSetCacheConfig(config: c_int) => context::set_cache_config;
    fn cuCtxGetSharedMemConfig(pconfig: *mut c_int) => context::get_shared_mem_config;
    fn cuCtxSetSharedMemConfig(config: c_int) => context::set_shared_mem_config;
    fn cuCtxGetId(ctx: CUcontext, ctx_id: *mut u64) => context::get_id;
    fn cuCtxResetPersistingL2Cache() => context::reset_persisting_l2_cache;
    fn cuCtxEnablePeerAccess(peer_context: CUcontext, flags: c_uint) => peer::enable_peer_access;
    fn cuCtxDisablePeerAccess(peer_context: CUcontext) => peer::disable_peer_access;

    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => memory::alloc;
    fn cuMemFree_v2(dptr: CUdeviceptr) => memory::free;
    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) => memory::get_address_range;
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) => pointer::get_attribute;
    fn cuPointerGetAttributes(num_attributes: c_uint, attributes: *const c_int, data: *const *mut c_void, ptr: CUdeviceptr) => pointer::get_attributes;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => memory::get_info;
    fn cuMemAllocHost(pp: *mut *mut c_void, bytesize: c_uint) => memory::alloc_host_v1;
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) => memory::alloc_host;
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) => memory::host_alloc;
    fn cuMemFreeHost(p: *mut c_void) => memory::free_host;
    fn cuMemHostRegister(p: *mut c_void, bytesize: c_uint, flags: c_uint) => host_register::register_v1;
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) => host_register::register;
    fn cuMemHostUnregister(p: *mut c_void) => host_register::unregister;
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width_in_bytes: usize, height: usize, element_size_bytes: c_uint) => copy_2d::alloc_pitch;
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, count: usize) => unified_copy::memcpy;
    fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, count: usize) => unified_copy::memcpy_ptds;
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: CUstream) => unified_copy::memcpy_async;
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: CUstream) => unified_copy::memcpy_async_ptsz;
    fn cuMemcpy2D_v2(p: *const Memcpy2D) => copy_2d::memcpy_2d;
    fn cuMemcpy2D_v2_ptds(p: *const Memcpy2D) => copy_2d::memcpy_2d_ptds;
    fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) => copy_2d::memcpy_2d;
    fn cuMemcpy2DUnaligned_v2_ptds(p: *const Memcpy2D) => copy_2d::memcpy_2d_ptds;
    fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, stream: CUstream) => copy_2d::memcpy_2d_async;
    fn cuMemcpy2DAsync_v2_ptsz(p: *const Memcpy2D, stream: CUstream) => copy_2d::memcpy_2d_async_ptsz;
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => stream_ordered::alloc_async;
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => stream_ordered::alloc_async_ptsz;
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => stream_ordered::free_async;
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => memory_pool::alloc_from_pool_async;
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => memory_pool::alloc_from_pool_async_ptsz;
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) => memory_pool::device_get_default_mem_pool;
    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) => memory_pool::device_get_mem_pool;
    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) => memory_pool::device_set_mem_pool;
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const PoolProps) => memory_pool::create;
    fn cuMemPoolDestroy(pool: CUmemoryPool) => memory_pool::destroy;
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) => memory_pool::set_attribute;
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) => memory_pool::get_attribute;
    fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) => memory_pool::trim_to;
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => stream_ordered::free_async_ptsz;
    fn cuLaunchHostFunc(stream: CUstream, function: HostFn, user_data: *mut c_void) => stream_ordered::launch_host_func;
    fn cuLaunchHostFunc_ptsz(stream: CUstream, function: HostFn, user_data: *mut c_void) => stream_ordered::launch_host_func_ptsz;
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, count: usize) => memory::htod_sync;
    fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, count: usize) => memory::htod_sync_ptds;
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, count: usize, stream: CUstream) => memory::htod_async;
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, count: usize, stream: CUstream) => memory::htod_async_ptsz;
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, count: usize) => memory::dtoh_sync;
    fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, count: usize) => memory::dtoh_sync_ptds;
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, count: usize, stream: CUstream) => memory::dtoh_async;
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, count: usize, stream: CUstream) => memory::dtoh_async_ptsz;
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, count: usize) => memory::dtod_sync;
    fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, count: usize) => memory::dtod_sync_ptds;
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: CUstream) => memory::dtod_async;
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: CUstream) => memory::dtod_async_ptsz;
    fn cuMemcpyPeer(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, count: usize) => peer::memcpy_peer_sync;
    fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, count: usize) => peer::memcpy_peer_sync_ptds;
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, count: usize, stream: CUstream) => peer::memcpy_peer_async;
    fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, count: usize, stream: CUstream) => peer::memcpy_peer_async_ptsz;
    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) => memory::memset_d8;
    fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, count: usize) => memory::memset_d8_ptds;
    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream) => memory::memset_d8_async;
    fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream) => memory::memset_d8_async_ptsz;
    fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, count: usize) => memory::memset_d16;
    fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, count: usize) => memory::memset_d16_ptds;
    fn cuMemsetD16Async(dst: CUdeviceptr, value: u16, count: usize, stream: CUstream) => memory::memset_d16_async;
    fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, count: usize, stream: CUstream) => memory::memset_d16_async_ptsz;
    fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, count: usize) => memory::memset_d32;
    fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: u32, count: usize) => memory::memset_d32_ptds;
    fn cuMemsetD32Async(dst: CUdeviceptr, value: u32, count: usize, stream: CUstream) => memory::memset_d32_async;
    fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: u32, count: usize, stream: CUstream) => memory::memset_d32_async_ptsz;

    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) => module::load_data;
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, num_options: c_uint, options: *mut c_int, option_values: *mut *mut c_void) => module::load_data_ex;
    fn cuModuleLoadFatBinary(module: *mut CUmodule, fat_cubin: *const c_void) => module::load_fat_binary;
    fn cuModuleUnload(hmod: CUmodule) => module::unload;
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) => module::get_function;
    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, hmod: CUmodule, name: *const c_char) => module::get_global;
    fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, hfunc: CUfunction) => function::func_get_attribute;
    fn cuFuncSetAttribute(hfunc: CUfunction, attrib: c_int, value: c_int) => function::func_set_attribute;
    fn cuFuncSetCacheConfig(hfunc: CUfunction, config: c_int) => function::func_set_cache_config;
    fn cuFuncSetSharedMemConfig(hfunc: CUfunction, config: c_int) => function::func_set_shared_mem_config;
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks: *mut c_int, func: CUfunction, block_size: c_int, dynamic_smem_size: usize) => occupancy::max_active_blocks_default;
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks: *mut c_int, func: CUfunction, block_size: c_int, dynamic_smem_size: usize, flags: c_uint) => occupancy::max_active_blocks_with_flags;
    fn cuOccupancyAvailableDynamicSMemPerBlock(dynamic_smem_size: *mut usize, func: CUfunction, num_blocks: c_int, block_size: c_int) => occupancy::available_dynamic_smem;
    fn cuOccupancyMaxActiveClusters(num_clusters: *mut c_int, func: CUfunction, config: *const LaunchConfig) => occupancy::max_active_clusters;
    fn cuOccupancyMaxPotentialClusterSize(cluster_size: *mut c_int, func: CUfunction, config: *const LaunchConfig) => occupancy::max_potential_cluster_size;
    fn cuOccupancyMaxPotentialBlockSize(min_grid_size: *mut c_int, block_size: *mut c_int, func: CUfunction, block_size_to_dynamic_smem: BlockToDynamicSmem, dynamic_smem_size: usize, block_size_limit: c_int) => occupancy::max_potential_block_size;
    fn cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid_size: *mut c_int, block_size: *mut c_int, func: CUfunction, block_size_to_dynamic_smem: BlockToDynamicSmem, dynamic_smem_size: usize, block_size_limit: c_int, flags: c_uint) => occupancy::max_potential_block_size_with_flags;
    fn cuLaunchKernel(f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream, kernel_params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel;
    fn cuLaunchKernel_ptsz(f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream, kernel_params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ptsz;
    fn cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, kernel_params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex;
    fn cuLaunchCooperativeKernel(f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream, kernel_params: *mut *mut c_void) => launch::launch_cooperative_kernel;
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream, kernel_params: *mut *mut c_void) => launch::launch_cooperative_kernel_ptsz;
    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: CUfunction, kernel_params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex_ptsz;
    fn cuFuncGetParamInfo(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) => module::func_get_param_info;
    fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) => module::func_get_name;
    fn cuModuleGetLoadingMode(mode: *mut c_int) => module::get_loading_mode;

    fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit_options: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, num_library_options: c_uint) => library::load_data;
    fn cuLibraryLoadFromFile(library: *mut CUlibrary, file_name: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit_options: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, num_library_options: c_uint) => library::load_from_file;
    fn cuLibraryUnload(library: CUlibrary) => library::unload;
    fn cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char) => library::get_kernel;
    fn cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary) => library::get_module;
    fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) => library::get_global;
    fn cuKernelGetFunction(function: *mut CUfunction, kernel: CUkernel) => library::kernel_get_function;
    fn cuKernelGetLibrary(library: *mut CUlibrary, kernel: CUkernel) => library::kernel_get_library;
    fn cuKernelGetAttribute(value: *mut c_int, attribute: c_int, kernel: CUkernel, dev: CUdevice) => library::kernel_get_attribute;
    fn cuKernelSetAttribute(attribute: c_int, value: c_int, kernel: CUkernel, dev: CUdevice) => library::kernel_set_attribute;
    fn cuKernelSetCacheConfig(kernel: CUkernel, config: c_int, dev: CUdevice) => library::kernel_set_cache_config;
    fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) => library::kernel_get_name;
    fn cuKernelGetParamInfo(kernel: CUkernel, index: usize, offset: *mut usize, size: *mut usize) => library::kernel_get_param_info;

    fn cuStreamCreate(phstream: *mut CUstream, flags: c_uint) => stream::create;
    fn cuStreamCreateWithPriority(phstream: *mut CUstream, flags: c_uint, priority: c_int) => stream::create_with_priority;
    fn cuStreamDestroy(hstream: CUstream) => stream::destroy;
    fn cuStreamDestroy_v2(hstream: CUstream) => stream::destroy;
    fn cuStreamSynchronize(hstream: CUstream) => stream::synchronize;
    fn cuStreamSynchronize_ptsz(hstream: CUstream) => stream::synchronize_ptsz;
    fn cuStreamQuery(hstream: CUstream) => stream::query;
    fn cuStreamQuery_ptsz(hstream: CUstream) => stream::query_ptsz;
    fn cuStreamWaitEvent(hstream: CUstream, hevent: CUevent, flags: c_uint) => stream::wait_event;
    fn cuStreamWaitEvent_ptsz(hstream: CUstream, hevent: CUevent, flags: c_uint) => stream::wait_event_ptsz;
    fn cuStreamGetPriority(hstream: CUstream, priority: *mut c_int) => stream::get_priority;
    fn cuStreamGetPriority_ptsz(hstream: CUstream, priority: *mut c_int) => stream::get_priority_ptsz;
    fn cuStreamGetFlags(hstream: CUstream, flags: *mut c_uint) => stream::get_flags;
    fn cuStreamGetFlags_ptsz(hstream: CUstream, flags: *mut c_uint) => stream::get_flags_ptsz;
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const AllocationProp, option: c_int) => vmm::get_granularity;
    fn cuMemCreate(handle: *mut c_ulonglong, size: usize, prop: *const AllocationProp, flags: c_ulonglong) => vmm::create;
    fn cuMemRelease(handle: c_ulonglong) => vmm::release;
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) => vmm::address_reserve;
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) => vmm::address_free;
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: c_ulonglong, flags: c_ulonglong) => vmm::map;
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => vmm::unmap;
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const AccessDesc, count: usize) => vmm::set_access;
    fn cuMemGetAccess(flags: *mut c_ulonglong, location: *const MemLocation, ptr: CUdeviceptr) => vmm::get_access;
    fn cuMemRetainAllocationHandle(handle: *mut c_ulonglong, addr: *mut c_void) => vmm::retain_allocation_handle;
    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut AllocationProp, handle: c_ulonglong) => vmm::get_properties_from_handle;
    fn cuStreamBeginCapture(hstream: CUstream) => graph::begin_capture;
    fn cuStreamBeginCapture_ptsz(hstream: CUstream) => graph::begin_capture_ptsz;
    fn cuStreamBeginCapture_v2(hstream: CUstream, mode: c_int) => graph::begin_capture_v2;
    fn cuStreamBeginCapture_v2_ptsz(hstream: CUstream, mode: c_int) => graph::begin_capture_v2_ptsz;
    fn cuStreamEndCapture(hstream: CUstream, phgraph: *mut CUgraph) => graph::end_capture;
    fn cuStreamEndCapture_ptsz(hstream: CUstream, phgraph: *mut CUgraph) => graph::end_capture_ptsz;
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) => graph::exchange_capture_mode;
    fn cuGraphInstantiate(phexec: *mut CUgraphExec, hgraph: CUgraph, pherror_node: *mut *mut c_void, log_buffer: *mut c_char, buffer_size: usize) => graph::instantiate;
    fn cuGraphInstantiate_v2(phexec: *mut CUgraphExec, hgraph: CUgraph, pherror_node: *mut *mut c_void, log_buffer: *mut c_char, buffer_size: usize) => graph::instantiate;
    fn cuGraphInstantiateWithFlags(phexec: *mut CUgraphExec, hgraph: CUgraph, flags: c_ulonglong) => graph::instantiate_with_flags;
    fn cuGraphLaunch(hexec: CUgraphExec, hstream: CUstream) => graph::launch;
    fn cuGraphLaunch_ptsz(hexec: CUgraphExec, hstream: CUstream) => graph::launch_ptsz;
    fn cuGraphExecDestroy(hexec: CUgraphExec) => graph::exec_destroy;
    fn cuGraphDestroy(hgraph: CUgraph) => graph::destroy;
    fn cuGraphCreate(phgraph: *mut CUgraph, flags: c_uint) => graph::create;
    fn cuGraphClone(phgraph_clone: *mut CUgraph, original_graph: CUgraph) => graph::clone;
    fn cuGraphAddEmptyNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize) => graph::add_empty_node;
    fn cuGraphAddKernelNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, node_params: *const KernelNodeParamsV1) => graph::add_kernel_node_v1;
    fn cuGraphAddKernelNode_v2(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, node_params: *const KernelNodeParams) => graph::add_kernel_node;
    fn cuGraphAddMemsetNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, memset_params: *const MemsetNodeParams, ctx: *mut c_void) => graph::add_memset_node;
    fn cuGraphAddMemcpyNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, copy_params: *const Memcpy3D, ctx: *mut c_void) => graph::add_memcpy_node;
    fn cuGraphAddEventRecordNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, event: CUevent) => graph::add_event_record_node;
    fn cuGraphAddEventWaitNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, event: CUevent) => graph::add_event_wait_node;
    fn cuGraphAddChildGraphNode(phgraph_node: *mut CUgraphNode, hgraph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, child_graph: CUgraph) => graph::add_child_graph_node;
    fn cuGraphGetNodes(hgraph: CUgraph, nodes: *mut CUgraphNode, num_nodes: *mut usize) => graph::get_nodes;
    fn cuGraphNodeGetType(hnode: CUgraphNode, node_type: *mut c_int) => graph::node_get_type;
    fn cuStreamIsCapturing(hstream: CUstream, capture_status: *mut c_int) => stream::is_capturing;
    fn cuStreamIsCapturing_ptsz(hstream: CUstream, capture_status: *mut c_int) => stream::is_capturing_ptsz;
    fn cuStreamGetCaptureInfo(hstream: CUstream, capture_status: *mut c_int, id: *mut u64) => stream::capture_info;
    fn cuStreamGetCaptureInfo_ptsz(hstream: CUstream, capture_status: *mut c_int, id: *mut u64) => stream::capture_info_ptsz;
    fn cuStreamGetCaptureInfo_v2(hstream: CUstream, capture_status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, dependencies: *mut *const c_void, num_dependencies: *mut usize) => stream::capture_info_v2;
    fn cuStreamGetCaptureInfo_v2_ptsz(hstream: CUstream, capture_status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, dependencies: *mut *const c_void, num_dependencies: *mut usize) => stream::capture_info_v2_ptsz;
    fn cuStreamGetCaptureInfo_v3(hstream: CUstream, capture_status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, dependencies: *mut *const c_void, edge_data: *mut *const c_void, num_dependencies: *mut usize) => stream::capture_info_v3;
    fn cuStreamGetCaptureInfo_v3_ptsz(hstream: CUstream, capture_status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, dependencies: *mut *const c_void, edge_data: *mut *const c_void, num_dependencies: *mut usize) => stream::capture_info_v3_ptsz;
    fn cuStreamGetCtx(hstream: CUstream, pctx: *mut CUcontext) => stream::get_ctx;
    fn cuStreamGetCtx_ptsz(hstream: CUstream, pctx: *mut CUcontext) => stream::get_ctx_ptsz;
    fn cuStreamGetCtx_v2(hstream: CUstream, pctx: *mut CUcontext, pgreen_ctx: *mut *mut c_void) => stream::get_ctx_v2;
    fn cuStreamGetCtx_v2_ptsz(hstream: CUstream, pctx: *mut CUcontext, pgreen_ctx: *mut *mut c_void) => stream::get_ctx_v2_ptsz;
    fn cuStreamGetId(hstream: CUstream, stream_id: *mut u64) => stream::get_id;
    fn cuStreamGetId_ptsz(hstream: CUstream, stream_id: *mut u64) => stream::get_id_ptsz;
    fn cuStreamGetDevice(hstream: CUstream, device: *mut CUdevice) => stream::get_device;
    fn cuStreamGetDevice_ptsz(hstream: CUstream, device: *mut CUdevice) => stream::get_device_ptsz;

    fn cuEventCreate(phevent: *mut CUevent, flags: c_uint) => event::create;
    fn cuEventRecord(hevent: CUevent, hstream: CUstream) => event::record;
    fn cuEventRecord_ptsz(hevent: CUevent, hstream: CUstream) => event::record_ptsz;
    fn cuEventRecordWithFlags(hevent: CUevent, hstream: CUstream, flags: c_uint) => event::record_with_flags;
    fn cuEventRecordWithFlags_ptsz(hevent: CUevent, hstream: CUstream, flags: c_uint) => event::record_with_flags_ptsz;
    fn cuEventSynchronize(hevent: CUevent) => event::synchronize;
    fn cuEventQuery(hevent: CUevent) => event::query;
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) => event::elapsed_time;
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) => event::elapsed_time;
    fn cuEventDestroy(hevent: CUevent) => event::destroy;
    fn cuEventDestroy_v2(hevent: CUevent) => event::destroy;

    fn cuIpcGetMemHandle(handle: *mut IpcHandle, dptr: CUdeviceptr) => ipc::get_mem_handle;
    fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: IpcHandle, flags: c_uint) => ipc::open_mem_handle;
    fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: IpcHandle, flags: c_uint) => ipc::open_mem_handle;
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) => ipc::close_mem_handle;
    fn cuIpcGetEventHandle(handle: *mut IpcHandle, event: CUevent) => ipc::get_event_handle;
    fn cuIpcOpenEventHandle(phevent: *mut CUevent, handle: IpcHandle) => ipc::open_event_handle;
}

//! THE list of hand-written NVML entry points: one line per exported
//! symbol, with its C signature and the function that implements it.
//!
//! build.rs reads the `fn nvmlName(` lines of this file: every other symbol
//! of NVIDIA's export list gets a NOT_SUPPORTED stub. Adding a line here is
//! all it takes to implement a symbol.

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::{
    Memory, MemoryV2, NvmlDevice, PciInfo, PciInfoExt, ProcessInfo, ProcessInfoV1, Utilization,
};
use crate::{device, error, system};

rgpu_shim::exported_api! {
    crate::entry::API;
    fn nvmlInit() => system::init;
    fn nvmlInit_v2() => system::init;
    fn nvmlInitWithFlags(flags: c_uint) => system::init_with_flags;
    fn nvmlShutdown() => system::shutdown;
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) => system::driver_version;
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) => system::nvml_version;
    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) => system::cuda_driver_version;
    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) => system::cuda_driver_version;

    fn nvmlDeviceGetCount(count: *mut c_uint) => device::get_count;
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) => device::get_count;
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut NvmlDevice) => device::get_handle_by_index;
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut NvmlDevice) => device::get_handle_by_index;
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) => device::get_handle_by_uuid;
    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut NvmlDevice) => device::get_handle_by_pci_bus_id;
    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut NvmlDevice) => device::get_handle_by_pci_bus_id;
    fn nvmlDeviceGetName(device: NvmlDevice, name: *mut c_char, length: c_uint) => device::get_name;
    fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, length: c_uint) => device::get_uuid;
    fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) => device::get_index;
    fn nvmlDeviceGetMinorNumber(device: NvmlDevice, minor: *mut c_uint) => device::get_minor_number;
    fn nvmlDeviceGetPciInfo(device: NvmlDevice, pci: *mut PciInfo) => device::get_pci_info_legacy;
    fn nvmlDeviceGetPciInfo_v2(device: NvmlDevice, pci: *mut PciInfo) => device::get_pci_info_legacy;
    fn nvmlDeviceGetPciInfo_v3(device: NvmlDevice, pci: *mut PciInfo) => device::get_pci_info_v3;
    fn nvmlDeviceGetPciInfoExt(device: NvmlDevice, pci: *mut PciInfoExt) => device::get_pci_info_ext;
    fn nvmlDeviceGetCudaComputeCapability(device: NvmlDevice, major: *mut c_int, minor: *mut c_int) => device::get_cuda_compute_capability;
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) => device::get_memory_info;
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut MemoryV2) => device::get_memory_info_v2;
    fn nvmlDeviceGetUtilizationRates(device: NvmlDevice, utilization: *mut Utilization) => device::get_utilization_rates;
    fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfoV1) => device::get_compute_running_processes_v1;
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) => device::get_compute_running_processes;
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) => device::get_compute_running_processes;
}

/// `const char *nvmlErrorString(nvmlReturn_t)`: the one entry point that
/// returns no `nvmlReturn_t`; needs no init.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: u32) -> *const c_char {
    error::error_string_ptr(result)
}

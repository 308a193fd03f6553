//! NVML's C types and constants as nvml.h (public NVML API reference)
//! defines them; `nvmlReturn_t` travels as a plain `u32`.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

/// `nvmlDevice_t`: an opaque pointer, validated on every use.
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: u32 = 0;
pub const NVML_ERROR_UNINITIALIZED: u32 = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: u32 = 2;
pub const NVML_ERROR_NOT_SUPPORTED: u32 = 3;
pub const NVML_ERROR_NO_PERMISSION: u32 = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: u32 = 5;
pub const NVML_ERROR_NOT_FOUND: u32 = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: u32 = 7;
pub const NVML_ERROR_INSUFFICIENT_POWER: u32 = 8;
pub const NVML_ERROR_DRIVER_NOT_LOADED: u32 = 9;
pub const NVML_ERROR_TIMEOUT: u32 = 10;
pub const NVML_ERROR_IRQ_ISSUE: u32 = 11;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: u32 = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: u32 = 13;
pub const NVML_ERROR_CORRUPTED_INFOROM: u32 = 14;
pub const NVML_ERROR_GPU_IS_LOST: u32 = 15;
pub const NVML_ERROR_RESET_REQUIRED: u32 = 16;
pub const NVML_ERROR_OPERATING_SYSTEM: u32 = 17;
pub const NVML_ERROR_LIB_RM_VERSION_MISMATCH: u32 = 18;
pub const NVML_ERROR_IN_USE: u32 = 19;
pub const NVML_ERROR_MEMORY: u32 = 20;
pub const NVML_ERROR_NO_DATA: u32 = 21;
pub const NVML_ERROR_VGPU_ECC_NOT_ENABLED: u32 = 22;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
pub const NVML_ERROR_FREQ_NOT_SUPPORTED: u32 = 24;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: u32 = 25;
pub const NVML_ERROR_DEPRECATED: u32 = 26;
pub const NVML_ERROR_NOT_READY: u32 = 27;
pub const NVML_ERROR_GPU_NOT_FOUND: u32 = 28;
pub const NVML_ERROR_INVALID_STATE: u32 = 29;
pub const NVML_ERROR_UNKNOWN: u32 = 999;

/// `nvmlInitWithFlags`: initialise even when there is no GPU.
pub const NVML_INIT_FLAG_NO_GPUS: c_uint = 1;
/// `NVML_VALUE_NOT_AVAILABLE` for `usedGpuMemory`.
pub const NVML_VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;
/// Instance ids of a process not in a MIG partition.
pub const NO_INSTANCE: c_uint = c_uint::MAX;
/// PCI vendor id of NVIDIA.
pub const PCI_VENDOR_NVIDIA: c_uint = 0x10de;

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE` / `_V2_SIZE`.
pub const PCI_BUS_ID_BYTES: usize = 32;
pub const PCI_BUS_ID_LEGACY_BYTES: usize = 16;

/// `nvmlPciInfo_t` (the `_v3` layout; `_v1` and `_v2` callers get the
/// fields up to `pciSubSystemId` only).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; PCI_BUS_ID_LEGACY_BYTES],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; PCI_BUS_ID_BYTES],
}

/// `nvmlPciInfoExt_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfoExt {
    pub version: c_uint,
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub base_class: c_uint,
    pub sub_class: c_uint,
    pub bus_id: [c_char; PCI_BUS_ID_BYTES],
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` and `nvmlProcessInfo_t` (`_v3` entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `NVML_STRUCT_VERSION(name, ver)`: the struct's size with the version in
/// the top byte.
pub const fn struct_version<T>(version: u32) -> c_uint {
    std::mem::size_of::<T>() as c_uint | (version << 24)
}

/// `nvmlMemory_v2`.
pub const MEMORY_V2: c_uint = struct_version::<MemoryV2>(2);
/// `nvmlPciInfoExt_v1`.
pub const PCI_INFO_EXT_V1: c_uint = struct_version::<PciInfoExt>(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<PciInfo>(), 68);
        assert_eq!(std::mem::size_of::<PciInfoExt>(), 64);
        assert_eq!(std::mem::size_of::<Memory>(), 24);
        assert_eq!(std::mem::size_of::<MemoryV2>(), 40);
        assert_eq!(std::mem::size_of::<ProcessInfoV1>(), 16);
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
        assert_eq!(MEMORY_V2, 0x0200_0028);
        assert_eq!(PCI_INFO_EXT_V1, 0x0100_0040);
    }
}

//! Device queries, answered from the capset with no round trip.

use std::ffi::{c_char, c_int, c_uint};

use rgpu_proto::cuda_result::*;

use crate::abi::{write_c_string, write_out, CUdevice};
use crate::state::driver;

const ATTRIBUTE_PCI_BUS_ID: c_int = 33;
const ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
const ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
const ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

pub(crate) fn get(device: *mut CUdevice, ordinal: c_int) -> Result<(), u32> {
    if device.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?.device(ordinal)?;
    write_out(device, ordinal)
}

pub(crate) fn get_count(count: *mut c_int) -> Result<(), u32> {
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = driver()?.capset().devices.len();
    write_out(count, c_int::try_from(n).unwrap_or(c_int::MAX))
}

pub(crate) fn get_name(name: *mut c_char, len: c_int, device: CUdevice) -> Result<(), u32> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let info = driver()?.device(device)?;
    write_c_string(name, len, &info.name)
}

/// `CUuuid` is 16 bytes.
pub(crate) fn get_uuid(uuid: *mut [u8; 16], device: CUdevice) -> Result<(), u32> {
    if uuid.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let info = driver()?.device(device)?;
    write_out(uuid, info.uuid)
}

pub(crate) fn total_mem(bytes: *mut usize, device: CUdevice) -> Result<(), u32> {
    if bytes.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let info = driver()?.device(device)?;
    write_out(bytes, usize::try_from(info.total_mem).unwrap_or(usize::MAX))
}

/// The 32-bit form saturates, as a 32-bit count cannot say more.
pub(crate) fn total_mem_v1(bytes: *mut c_uint, device: CUdevice) -> Result<(), u32> {
    if bytes.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let info = driver()?.device(device)?;
    write_out(
        bytes,
        c_uint::try_from(info.total_mem).unwrap_or(c_uint::MAX),
    )
}

fn attribute(device: CUdevice, attribute: c_int) -> Result<c_int, u32> {
    driver()?
        .device(device)?
        .attribute(attribute)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

pub(crate) fn get_attribute(value: *mut c_int, attrib: c_int, device: CUdevice) -> Result<(), u32> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(value, attribute(device, attrib)?)
}

pub(crate) fn compute_capability(
    major: *mut c_int,
    minor: *mut c_int,
    device: CUdevice,
) -> Result<(), u32> {
    if major.is_null() || minor.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(
        major,
        attribute(device, ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
    )?;
    write_out(
        minor,
        attribute(device, ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    )
}

pub(crate) fn get_pci_bus_id(bus_id: *mut c_char, len: c_int, device: CUdevice) -> Result<(), u32> {
    if bus_id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let text = format!(
        "{:04X}:{:02X}:{:02X}.0",
        attribute(device, ATTRIBUTE_PCI_DOMAIN_ID)?,
        attribute(device, ATTRIBUTE_PCI_BUS_ID)?,
        attribute(device, ATTRIBUTE_PCI_DEVICE_ID)?
    );
    write_c_string(bus_id, len, &text)
}

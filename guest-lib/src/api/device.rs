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
    let n = driver()?.device_count();
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

pub(crate) fn attribute(device: CUdevice, attribute: c_int) -> Result<c_int, u32> {
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

/// The device whose PCI bus id is `bus_id` ("domain:bus:device.function",
/// domain optional, hexadecimal, any case).
pub(crate) fn get_by_pci_bus_id(device: *mut CUdevice, bus_id: *const c_char) -> Result<(), u32> {
    if device.is_null() || bus_id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated string from the caller (the API contract).
    let text = unsafe { std::ffi::CStr::from_ptr(bus_id) }
        .to_str()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let wanted = parse_pci_bus_id(text).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let count = driver()?.device_count();
    for ordinal in 0..count {
        let ordinal = CUdevice::try_from(ordinal).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        let id = (
            attribute(ordinal, ATTRIBUTE_PCI_DOMAIN_ID)?,
            attribute(ordinal, ATTRIBUTE_PCI_BUS_ID)?,
            attribute(ordinal, ATTRIBUTE_PCI_DEVICE_ID)?,
        );
        if id == wanted {
            return write_out(device, ordinal);
        }
    }
    Err(CUDA_ERROR_INVALID_DEVICE)
}

/// "0000:17:00.0" or "17:00.0" -> (domain, bus, device).
fn parse_pci_bus_id(text: &str) -> Option<(c_int, c_int, c_int)> {
    let mut parts: Vec<&str> = text.trim().split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [domain, bus, rest] = parts.as_slice() else {
        return None;
    };
    let device = rest.split('.').next()?;
    let hex = |s: &str| c_int::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?))
}

/// Never: each device is one GPU behind its own carrier (a daemon of its
/// own with `RGPU_DEVICES`), and neither the host nor the network lets one
/// daemon's kernels reach another's memory. Copies between devices are
/// staged through this process instead ([`crate::api::peer`]).
pub(crate) fn can_access_peer(
    can_access: *mut c_int,
    device: CUdevice,
    peer: CUdevice,
) -> Result<(), u32> {
    if can_access.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let driver = driver()?;
    driver.device(device)?;
    driver.device(peer)?;
    write_out(can_access, 0)
}

#[cfg(test)]
mod pci_bus_id_tests {
    use super::parse_pci_bus_id;

    #[test]
    fn parses_with_and_without_domain() {
        assert_eq!(parse_pci_bus_id("0000:1a:00.0"), Some((0, 0x1a, 0)));
        assert_eq!(parse_pci_bus_id("1A:03.0"), Some((0, 0x1a, 3)));
        assert_eq!(parse_pci_bus_id("garbage"), None);
        assert_eq!(parse_pci_bus_id("0:zz:00.0"), None);
    }
}

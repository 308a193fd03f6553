//! Init, shutdown and the system queries: versions come from the capset
//! (CUDA) and from the host's `DeviceStatus` (the NVIDIA driver).

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::*;
use crate::{out, state};

pub fn init() -> Result<(), u32> {
    state::init(0)
}

pub fn init_with_flags(flags: c_uint) -> Result<(), u32> {
    state::init(flags)
}

pub fn shutdown() -> Result<(), u32> {
    state::shutdown()
}

/// The NVIDIA driver version string of the host ("580.95.05").
fn driver_version_string() -> Result<String, u32> {
    let connection = state::connection()?;
    if connection.device_count() == 0 {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    let version = connection.status(0)?.driver_version;
    if version.is_empty() {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    Ok(version)
}

pub fn driver_version(version: *mut c_char, length: c_uint) -> Result<(), u32> {
    out::string(version, length, &driver_version_string()?)
}

/// "13.580.95.05": the CUDA major version, then the driver's.
pub fn nvml_version(version: *mut c_char, length: c_uint) -> Result<(), u32> {
    let cuda_major = state::connection()?.capset().driver_version / 1000;
    let text = format!("{cuda_major}.{}", driver_version_string()?);
    out::string(version, length, &text)
}

pub fn cuda_driver_version(version: *mut c_int) -> Result<(), u32> {
    out::value(version, state::connection()?.capset().driver_version)
}

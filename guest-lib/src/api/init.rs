//! `cuInit` and `cuDriverGetVersion`.

use rgpu_proto::cuda_result::*;
use rgpu_transport::CarrierError;
use std::ffi::{c_int, c_uint};

use crate::abi::write_out;
use crate::state::{self, Driver};

/// The CUDA version this library's proc-address table was recorded at;
/// `cuDriverGetVersion` answers it before `cuInit` (NVIDIA's driver answers
/// without initialising too).
pub const RECORDED_DRIVER_VERSION: c_int = 13000;

pub(crate) fn init(flags: c_uint) -> Result<(), u32> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    state::init_driver(open).map(|_| ())
}

fn open() -> Result<Driver, u32> {
    let carriers = rgpu_transport::carrier::open_list_from_env().map_err(|e| {
        log::error!("rgpu: cuInit: cannot reach the rgpu device: {e}");
        match e.root() {
            CarrierError::NotConfigured
            | CarrierError::NoDevice(_)
            | CarrierError::Connect { .. }
            | CarrierError::NoCapset => CUDA_ERROR_NO_DEVICE,
            _ => CUDA_ERROR_NOT_INITIALIZED,
        }
    })?;
    let several = carriers.len() > 1;
    let driver = Driver::new(carriers).map_err(|index| {
        if several {
            log::error!("rgpu: cuInit: RGPU_DEVICES entry {index}: the host offers no GPU");
        } else {
            log::error!("rgpu: cuInit: the host offers no GPU");
        }
        CUDA_ERROR_NO_DEVICE
    })?;
    for (index, carrier) in driver.carriers.iter().enumerate() {
        let capset = carrier.capset();
        let entry = if several {
            format!("RGPU_DEVICES entry {index}: ")
        } else {
            String::new()
        };
        log::info!(
            "rgpu: {entry}{} device(s), host driver {}, executor {}",
            capset.devices.len(),
            capset.driver_version,
            capset.executor
        );
    }
    Ok(driver)
}

pub(crate) fn driver_get_version(version: *mut c_int) -> Result<(), u32> {
    let value = match state::driver() {
        Ok(driver) => driver.driver_version(),
        Err(_) => RECORDED_DRIVER_VERSION,
    };
    write_out(version, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exports::*;

    #[test]
    fn without_a_device_everything_reports_its_state() {
        let configured = ["RGPU_SOCKET", "RGPU_SERVER", "RGPU_DEVICES"];
        if configured.iter().any(|v| std::env::var_os(v).is_some()) {
            return;
        }
        assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuInit(0), CUDA_ERROR_NO_DEVICE);
        // The failure is remembered, as NVIDIA's driver does.
        assert_eq!(cuInit(0), CUDA_ERROR_NO_DEVICE);

        let mut count = -1;
        assert_eq!(cuDeviceGetCount(&mut count), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(
            cuDeviceGetCount(std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut ptr = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut ptr, 16), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_NOT_INITIALIZED);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(cuCtxGetCurrent(&mut ctx), CUDA_ERROR_NOT_INITIALIZED);

        let mut version = 0;
        assert_eq!(cuDriverGetVersion(&mut version), CUDA_SUCCESS);
        assert_eq!(version, RECORDED_DRIVER_VERSION);
    }

    #[test]
    fn unsupported_symbols_answer_not_supported() {
        assert_eq!(
            crate::unsupported::cuGraphAddBatchMemOpNode(),
            CUDA_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            crate::unsupported::cuGraphAddBatchMemOpNode(),
            CUDA_ERROR_NOT_SUPPORTED
        );
    }
}

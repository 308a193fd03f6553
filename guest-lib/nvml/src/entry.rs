//! The NVML API's result codes for `rgpu_shim`, which does what every
//! exported entry point does around its implementation (logging, no
//! unwinding across the C ABI, tracing, stubs).

use crate::abi::{NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN, NVML_SUCCESS};

pub(crate) const API: rgpu_shim::Api = rgpu_shim::Api {
    name: "NVML",
    success: NVML_SUCCESS,
    unknown: NVML_ERROR_UNKNOWN,
    not_supported: NVML_ERROR_NOT_SUPPORTED,
    capture_logs: cfg!(test),
};

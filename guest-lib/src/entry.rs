//! The CUDA API's result codes for `rgpu_shim`, which does what every
//! exported entry point does around its implementation (logging, no
//! unwinding across the C ABI, tracing, stubs).

use rgpu_proto::cuda_result::{CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};

pub(crate) const API: rgpu_shim::Api = rgpu_shim::Api {
    name: "CUDA",
    success: CUDA_SUCCESS,
    unknown: CUDA_ERROR_UNKNOWN,
    not_supported: CUDA_ERROR_NOT_SUPPORTED,
    capture_logs: cfg!(test),
};

/// Runs one API call: a panic becomes `CUDA_ERROR_UNKNOWN`.
pub(crate) fn run(name: &'static str, call: impl FnOnce() -> Result<(), u32>) -> u32 {
    rgpu_shim::run(&API, name, call)
}

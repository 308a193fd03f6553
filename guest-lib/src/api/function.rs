//! The driver calls that take a `CUfunction` where NVIDIA's runtimes may
//! pass a `CUkernel` too (a library's kernel, resolved in the current
//! context): above both `module` and `library`, which do not know each
//! other's handles.

use std::ffi::c_int;
use std::sync::Arc;

use rgpu_proto::cuda_result::*;

use crate::abi::{write_out, CUfunction};
use crate::api::library::{function_or_kernel, KERNELS};
use crate::api::module::{
    check_cache_config, check_shared_mem_config, function_attribute, set_function_attribute,
};
use crate::state::{current, driver, Function, FUNCTIONS};

/// A `CUfunction` argument: a function, or a `CUkernel` resolved in the
/// current context (NVIDIA's runtimes pass either).
fn function_argument(function: CUfunction) -> Result<Arc<Function>, u32> {
    driver()?;
    if let Some(f) = FUNCTIONS.get(function) {
        return Ok(f);
    }
    if KERNELS.get(function).is_none() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    function_or_kernel(function, &current()?)
}

pub(crate) fn func_get_attribute(
    value: *mut c_int,
    attribute: c_int,
    function: CUfunction,
) -> Result<(), u32> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let f = function_argument(function)?;
    write_out(value, function_attribute(&f, attribute)?)
}

pub(crate) fn func_set_attribute(
    function: CUfunction,
    attribute: c_int,
    value: c_int,
) -> Result<(), u32> {
    driver()?;
    if let Some(kernel) = KERNELS.get(function) {
        // A kernel's attribute holds in every context of the device.
        return kernel.set_attribute(attribute, value, current()?.device);
    }
    let f = FUNCTIONS.get(function).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    set_function_attribute(&f, attribute, value)
}

/// A cache preference is a hint for the host driver: checked, accepted.
pub(crate) fn func_set_cache_config(function: CUfunction, config: c_int) -> Result<(), u32> {
    driver()?;
    if FUNCTIONS.get(function).is_none() && KERNELS.get(function).is_none() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    check_cache_config(config)
}

/// Shared memory bank sizes are fixed on the GPUs rgpu serves: checked,
/// accepted (cuda.h: no effect on such devices).
pub(crate) fn func_set_shared_mem_config(function: CUfunction, config: c_int) -> Result<(), u32> {
    driver()?;
    if FUNCTIONS.get(function).is_none() && KERNELS.get(function).is_none() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    check_shared_mem_config(config)
}

//! The runtime interface (6BD5FB6C, 13 slots with CUDA 13): how a static
//! cudart loads its fatbins into modules and gets a device's primary
//! context. Slot meanings from ZLUDA's `dark_api` (slots 1, 2, 6, 7, 8) and
//! its later `driver.rs` (slot 12, "load compilers"); the module slots go
//! through the same path as `cuModuleLoadData`, the primary context through
//! `cuDevicePrimaryCtxRetain`. CUDA 12+ runtimes load code with
//! `cuLibraryLoadData` instead, so the module slots may never be called.

use std::ffi::{c_uint, c_void};

use super::{run, trace_slot, unknown_slot, Slot, RUNTIME};
use crate::abi::{CUcontext, CUdevice, CUmodule};
use crate::api::{module, primary_context};

pub static TABLE: [Slot; 13] = [
    Slot::size(13),
    Slot::function(module_from_fatbin as *const c_void),
    Slot::function(primary_context as *const c_void),
    unknown_slot!(RUNTIME, 3),
    unknown_slot!(RUNTIME, 4),
    unknown_slot!(RUNTIME, 5),
    Slot::function(module_from_fatbin_ext as *const c_void),
    Slot::function(notify as *const c_void),
    Slot::function(module_from_fatbin_header as *const c_void),
    unknown_slot!(RUNTIME, 9),
    unknown_slot!(RUNTIME, 10),
    unknown_slot!(RUNTIME, 11),
    Slot::function(load_compilers as *const c_void),
];

/// Slot 1: a module from a fatbin wrapper (`__fatBinC_Wrapper_t`).
extern "C" fn module_from_fatbin(module: *mut CUmodule, wrapper: *const c_void) -> u32 {
    run(RUNTIME, 1, || module::load_data(module, wrapper))
}

/// Slot 2: the primary context of a device, retained.
extern "C" fn primary_context(pctx: *mut CUcontext, device: CUdevice) -> u32 {
    run(RUNTIME, 2, || primary_context::retain(pctx, device))
}

/// Slot 6: slot 1 with three more arguments, seen NULL/0 so far (ZLUDA
/// relates the pointers to host-variable registration). They are logged
/// and the module is loaded.
extern "C" fn module_from_fatbin_ext(
    module: *mut CUmodule,
    wrapper: *const c_void,
    arg3: *mut c_void,
    arg4: *mut c_void,
    arg5: c_uint,
) -> u32 {
    log_extra_arguments(6, arg3, arg4, arg5);
    run(RUNTIME, 6, || module::load_data(module, wrapper))
}

/// Slot 7: takes one integer and returns nothing useful; a notification.
extern "C" fn notify(value: usize) -> u32 {
    trace_slot(RUNTIME, 7, format_args!("notify({value:#x})"));
    rgpu_proto::cuda_result::CUDA_SUCCESS
}

/// Slot 8: like slot 6 but from the fatbin header itself, arguments swapped.
extern "C" fn module_from_fatbin_header(
    header: *const c_void,
    module: *mut CUmodule,
    arg3: *mut c_void,
    arg4: *mut c_void,
    arg5: c_uint,
) -> u32 {
    log_extra_arguments(8, arg3, arg4, arg5);
    run(RUNTIME, 8, || module::load_data(module, header))
}

/// Slot 12: asks the driver to get its JIT compilers ready; the host's
/// driver does that when it needs them.
extern "C" fn load_compilers() -> u32 {
    run(RUNTIME, 12, || Ok(()))
}

fn log_extra_arguments(slot: usize, arg3: *mut c_void, arg4: *mut c_void, arg5: c_uint) {
    if !arg3.is_null() || !arg4.is_null() || arg5 != 0 {
        rgpu_shim::init_logging(crate::entry::API.capture_logs);
        log::warn!(
            "rgpu: export table runtime interface slot {slot}: ignoring arguments \
             {arg3:?}, {arg4:?}, {arg5}"
        );
    }
}

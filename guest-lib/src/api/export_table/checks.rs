//! Context checks (263E8860, 15 slots with driver 580). Slot 2 asks
//! whether a context is special (one out-flag, written 0 by NVIDIA's driver
//! for ordinary contexts, and an out-pointer it leaves untouched: clearing
//! it makes `cublasCreate` fail); slot 3 returns a flag that is always 0.
//! From ZLUDA's `dark_api` and `driver.rs` and a cuBLAS bring-up note that
//! compared the outputs with NVIDIA's driver. The other slots are unknown.

use std::ffi::c_void;

use super::{run, trace_slot, unknown_slot, Slot, CONTEXT_CHECKS};
use crate::abi::{write_optional, CUcontext};

pub static TABLE: [Slot; 15] = [
    Slot::size(15),
    unknown_slot!(CONTEXT_CHECKS, 1),
    Slot::function(context_check as *const c_void),
    Slot::function(check_flag as *const c_void),
    unknown_slot!(CONTEXT_CHECKS, 4),
    unknown_slot!(CONTEXT_CHECKS, 5),
    unknown_slot!(CONTEXT_CHECKS, 6),
    unknown_slot!(CONTEXT_CHECKS, 7),
    unknown_slot!(CONTEXT_CHECKS, 8),
    unknown_slot!(CONTEXT_CHECKS, 9),
    unknown_slot!(CONTEXT_CHECKS, 10),
    unknown_slot!(CONTEXT_CHECKS, 11),
    unknown_slot!(CONTEXT_CHECKS, 12),
    unknown_slot!(CONTEXT_CHECKS, 13),
    unknown_slot!(CONTEXT_CHECKS, 14),
];

/// Slot 2: `*flag = 0` (an ordinary context); `other` is left as it is.
extern "C" fn context_check(ctx: CUcontext, flag: *mut u32, other: *mut *const c_void) -> u32 {
    run(CONTEXT_CHECKS, 2, || {
        log::trace!("rgpu: context check of {ctx:?} (second output {other:?} untouched)");
        write_optional(flag, 0);
        Ok(())
    })
}

/// Slot 3: always 0.
extern "C" fn check_flag() -> u32 {
    trace_slot(CONTEXT_CHECKS, 3, format_args!("-> 0"));
    0
}

//! The tools tables: thread-local storage for profilers (42D85A81, 3 slots
//! with driver 580) and the runtime callback hooks (A094798C, 7 slots).
//!
//! The runtime reads its tool-callback state from two driver-owned
//! buffers it asks for through hook slots 2 and 6 (ZLUDA's `dark_api` and
//! `driver.rs`: a 1024-entry buffer of u32 and a 14-entry one). Zeroed
//! buffers mean "no tool attached"; nothing here ever writes them.
//!
//! TLS slot 2 answers the calling thread's current context through its one
//! out-parameter (the GX emulator, checked against NVIDIA's driver, and a
//! CXL GPU-sharing shim's cuBLAS test agree). cuBLAS calls it on every
//! handle it creates (seen on the H200 with a pointer first) and
//! cuBLASLt keys its kernel registry by that context, through the context
//! and stream table: a context left unwritten disables every GEMM kernel.
//! With no current context it writes NULL and still succeeds, as
//! `cuCtxGetCurrent` does (cuBLAS fails on an error here). Slot 1 is only
//! used with a tool in the picture: it answers success with nothing.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::Arc;

use rgpu_proto::cuda_result::CUDA_SUCCESS;

use super::{trace_slot, unknown_slot, Slot, TOOLS_HOOKS, TOOLS_TLS};
use crate::abi::{write_optional, CUcontext};

pub static TLS_TABLE: [Slot; 3] = [
    Slot::size(3),
    Slot::function(tls_no_tool_1 as *const c_void),
    Slot::function(current_context as *const c_void),
];

extern "C" fn tls_no_tool_1(a: usize, b: usize, c: usize, d: usize) -> u32 {
    trace_slot(
        TOOLS_TLS,
        1,
        format_args!("({a:#x}, {b:#x}, {c:#x}, {d:#x}) -> 0 (no tool)"),
    );
    0
}

/// Slot 2: the current context, NULL when there is none.
extern "C" fn current_context(out: *mut CUcontext) -> u32 {
    let current = crate::state::current_or_none()
        .ok()
        .flatten()
        .map_or(std::ptr::null_mut(), |c| Arc::as_ptr(&c) as CUcontext);
    write_optional(out, current);
    trace_slot(TOOLS_TLS, 2, format_args!("({out:?}) -> {current:?}"));
    CUDA_SUCCESS
}

pub static HOOKS_TABLE: [Slot; 7] = [
    Slot::size(7),
    unknown_slot!(TOOLS_HOOKS, 1),
    Slot::function(callback_buffer as *const c_void),
    unknown_slot!(TOOLS_HOOKS, 3),
    unknown_slot!(TOOLS_HOOKS, 4),
    unknown_slot!(TOOLS_HOOKS, 5),
    Slot::function(flags_buffer as *const c_void),
];

/// Memory the runtime reads and writes through the pointer handed out.
/// `N` entries are reported; the backing store is `M` entries, so a
/// runtime that counts the size in bytes, or in wider words, stays inside.
/// Aligned to a cache line, as the driver's own buffers are: a runtime that
/// reads it in 64-bit words must not find it 4-aligned only (it was, in
/// one build, by where the linker put it).
#[repr(C, align(64))]
pub struct HookBuffer<const N: usize, const M: usize>(UnsafeCell<[u32; M]>);

// SAFETY: only the application's runtime touches the contents, through the
// pointer; this library never reads or writes them.
unsafe impl<const N: usize, const M: usize> Sync for HookBuffer<N, M> {}

impl<const N: usize, const M: usize> HookBuffer<N, M> {
    const fn new() -> Self {
        Self(UnsafeCell::new([0; M]))
    }

    pub fn pointer(&self) -> *mut c_void {
        self.0.get().cast()
    }

    pub const fn reported_len(&self) -> usize {
        N
    }
}

pub static CALLBACK_BUFFER: HookBuffer<1024, 2048> = HookBuffer::new();
pub static FLAGS_BUFFER: HookBuffer<14, 64> = HookBuffer::new();

fn hand_out<const N: usize, const M: usize>(
    slot: usize,
    buffer: &HookBuffer<N, M>,
    ptr: *mut *mut c_void,
    size: *mut usize,
) {
    write_optional(ptr, buffer.pointer());
    write_optional(size, buffer.reported_len());
    trace_slot(
        TOOLS_HOOKS,
        slot,
        format_args!("buffer {:?}, {} entries", buffer.pointer(), N),
    );
}

/// Slot 2: the tool-callback buffer and its length.
extern "C" fn callback_buffer(ptr: *mut *mut c_void, size: *mut usize) {
    hand_out(2, &CALLBACK_BUFFER, ptr, size);
}

/// Slot 6: a small buffer of tool flags and its length.
extern "C" fn flags_buffer(ptr: *mut *mut c_void, size: *mut usize) {
    hand_out(6, &FLAGS_BUFFER, ptr, size);
}

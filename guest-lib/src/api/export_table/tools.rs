//! The tools tables: thread-local storage for profilers (42D85A81, 3 slots
//! with driver 580) and the runtime callback hooks (A094798C, 7 slots).
//!
//! The runtime reads its tool-callback state from two driver-owned
//! buffers it asks for through hook slots 2 and 6 (ZLUDA's `dark_api` and
//! `driver.rs`: a 1024-entry buffer of u32 and a 14-entry one). Zeroed
//! buffers mean "no tool attached"; nothing here ever writes them. The TLS
//! slots are only used with a tool in the picture (ZLUDA leaves them empty);
//! cuBLAS calls slot 2 on every handle it creates (seen on the H200 with
//! arguments (pointer, 1 << 63, pointer, 2)) and fails when it gets an
//! error, so both answer success, with no tool state to report, and log
//! their arguments at debug level.

use std::cell::UnsafeCell;
use std::ffi::c_void;

use super::{trace_slot, unknown_slot, Slot, TOOLS_HOOKS, TOOLS_TLS};
use crate::abi::write_optional;

pub static TLS_TABLE: [Slot; 3] = [
    Slot::size(3),
    Slot::function(tls_no_tool_1 as *const c_void),
    Slot::function(tls_no_tool_2 as *const c_void),
];

extern "C" fn tls_no_tool_1(a: usize, b: usize, c: usize, d: usize) -> u32 {
    trace_slot(
        TOOLS_TLS,
        1,
        format_args!("({a:#x}, {b:#x}, {c:#x}, {d:#x}) -> 0 (no tool)"),
    );
    0
}

extern "C" fn tls_no_tool_2(a: usize, b: usize, c: usize, d: usize) -> u32 {
    trace_slot(
        TOOLS_TLS,
        2,
        format_args!("({a:#x}, {b:#x}, {c:#x}, {d:#x}) -> 0 (no tool)"),
    );
    0
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

//! The context and stream table (21318C60, 93 slots with driver 580):
//! cuBLAS and cuBLASLt key their per-context and per-stream state (kernel
//! registry, workspaces) by what these slots answer, and report
//! `CUBLAS_STATUS_NOT_SUPPORTED` / `INTERNAL_ERROR` from every GEMM when
//! they fail.
//!
//! Sources (independent reimplementations; nothing of NVIDIA's):
//! - slot 4, the context's unique id, as `cuCtxGetId` answers it: the GX
//!   emulator's `cuGetExportTable` (checked there against NVIDIA's driver),
//!   a CXL GPU-sharing shim's cuBLAS test and its implementation, and a
//!   dark-API dump tool that names byte offset 0x20 of this table
//!   "getContextNumber".
//! - slot 51, a public `CUstream` turned into the driver's own stream
//!   object, and slot 39, an identity of such a stream: the CXL shim only
//!   (its test calls 4, 39 and 51; the dump tool lists offset 0x138 = slot
//!   39 as used, unnamed). The arguments seen on the H200 for slot 51
//!   (a context, a stream, a stack out-pointer, 0) fit its signature.
//!
//! rgpu has no private stream objects: slot 51 answers a public handle
//! that names the same stream (the default streams as `CU_STREAM_LEGACY` /
//! `CU_STREAM_PER_THREAD`, never NULL), so whatever cuBLAS does with it,
//! slot 39 or a public entry point, resolves it again. Slot 39 answers
//! `cuStreamGetId`'s id, unique per stream like the driver's.

use std::ffi::{c_int, c_void};

use rgpu_proto::cuda_result::*;

use super::{run, unknown_slot, Slot, CONTEXT_STREAM};
use crate::abi::{write_out, CUcontext, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::api::{context, stream};
use crate::state::{context_or_current, resolve_stream, STREAMS};

pub static TABLE: [Slot; 93] = [
    Slot::size(93),
    unknown_slot!(CONTEXT_STREAM, 1),
    unknown_slot!(CONTEXT_STREAM, 2),
    unknown_slot!(CONTEXT_STREAM, 3),
    Slot::function(context_id as *const c_void),
    unknown_slot!(CONTEXT_STREAM, 5),
    unknown_slot!(CONTEXT_STREAM, 6),
    unknown_slot!(CONTEXT_STREAM, 7),
    unknown_slot!(CONTEXT_STREAM, 8),
    unknown_slot!(CONTEXT_STREAM, 9),
    unknown_slot!(CONTEXT_STREAM, 10),
    unknown_slot!(CONTEXT_STREAM, 11),
    unknown_slot!(CONTEXT_STREAM, 12),
    unknown_slot!(CONTEXT_STREAM, 13),
    unknown_slot!(CONTEXT_STREAM, 14),
    unknown_slot!(CONTEXT_STREAM, 15),
    unknown_slot!(CONTEXT_STREAM, 16),
    unknown_slot!(CONTEXT_STREAM, 17),
    unknown_slot!(CONTEXT_STREAM, 18),
    unknown_slot!(CONTEXT_STREAM, 19),
    unknown_slot!(CONTEXT_STREAM, 20),
    unknown_slot!(CONTEXT_STREAM, 21),
    unknown_slot!(CONTEXT_STREAM, 22),
    unknown_slot!(CONTEXT_STREAM, 23),
    unknown_slot!(CONTEXT_STREAM, 24),
    unknown_slot!(CONTEXT_STREAM, 25),
    unknown_slot!(CONTEXT_STREAM, 26),
    unknown_slot!(CONTEXT_STREAM, 27),
    unknown_slot!(CONTEXT_STREAM, 28),
    unknown_slot!(CONTEXT_STREAM, 29),
    unknown_slot!(CONTEXT_STREAM, 30),
    unknown_slot!(CONTEXT_STREAM, 31),
    unknown_slot!(CONTEXT_STREAM, 32),
    unknown_slot!(CONTEXT_STREAM, 33),
    unknown_slot!(CONTEXT_STREAM, 34),
    unknown_slot!(CONTEXT_STREAM, 35),
    unknown_slot!(CONTEXT_STREAM, 36),
    unknown_slot!(CONTEXT_STREAM, 37),
    unknown_slot!(CONTEXT_STREAM, 38),
    Slot::function(stream_id as *const c_void),
    unknown_slot!(CONTEXT_STREAM, 40),
    unknown_slot!(CONTEXT_STREAM, 41),
    unknown_slot!(CONTEXT_STREAM, 42),
    unknown_slot!(CONTEXT_STREAM, 43),
    unknown_slot!(CONTEXT_STREAM, 44),
    unknown_slot!(CONTEXT_STREAM, 45),
    unknown_slot!(CONTEXT_STREAM, 46),
    unknown_slot!(CONTEXT_STREAM, 47),
    unknown_slot!(CONTEXT_STREAM, 48),
    unknown_slot!(CONTEXT_STREAM, 49),
    unknown_slot!(CONTEXT_STREAM, 50),
    Slot::function(private_stream as *const c_void),
    unknown_slot!(CONTEXT_STREAM, 52),
    unknown_slot!(CONTEXT_STREAM, 53),
    unknown_slot!(CONTEXT_STREAM, 54),
    unknown_slot!(CONTEXT_STREAM, 55),
    unknown_slot!(CONTEXT_STREAM, 56),
    unknown_slot!(CONTEXT_STREAM, 57),
    unknown_slot!(CONTEXT_STREAM, 58),
    unknown_slot!(CONTEXT_STREAM, 59),
    unknown_slot!(CONTEXT_STREAM, 60),
    unknown_slot!(CONTEXT_STREAM, 61),
    unknown_slot!(CONTEXT_STREAM, 62),
    unknown_slot!(CONTEXT_STREAM, 63),
    unknown_slot!(CONTEXT_STREAM, 64),
    unknown_slot!(CONTEXT_STREAM, 65),
    unknown_slot!(CONTEXT_STREAM, 66),
    unknown_slot!(CONTEXT_STREAM, 67),
    unknown_slot!(CONTEXT_STREAM, 68),
    unknown_slot!(CONTEXT_STREAM, 69),
    unknown_slot!(CONTEXT_STREAM, 70),
    unknown_slot!(CONTEXT_STREAM, 71),
    unknown_slot!(CONTEXT_STREAM, 72),
    unknown_slot!(CONTEXT_STREAM, 73),
    unknown_slot!(CONTEXT_STREAM, 74),
    unknown_slot!(CONTEXT_STREAM, 75),
    unknown_slot!(CONTEXT_STREAM, 76),
    unknown_slot!(CONTEXT_STREAM, 77),
    unknown_slot!(CONTEXT_STREAM, 78),
    unknown_slot!(CONTEXT_STREAM, 79),
    unknown_slot!(CONTEXT_STREAM, 80),
    unknown_slot!(CONTEXT_STREAM, 81),
    unknown_slot!(CONTEXT_STREAM, 82),
    unknown_slot!(CONTEXT_STREAM, 83),
    unknown_slot!(CONTEXT_STREAM, 84),
    unknown_slot!(CONTEXT_STREAM, 85),
    unknown_slot!(CONTEXT_STREAM, 86),
    unknown_slot!(CONTEXT_STREAM, 87),
    unknown_slot!(CONTEXT_STREAM, 88),
    unknown_slot!(CONTEXT_STREAM, 89),
    unknown_slot!(CONTEXT_STREAM, 90),
    unknown_slot!(CONTEXT_STREAM, 91),
    unknown_slot!(CONTEXT_STREAM, 92),
];

/// Slot 4: the unique id of a context (NULL: the current one).
extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> u32 {
    run(CONTEXT_STREAM, 4, || context::get_id(ctx, id))
}

/// What slot 51 answers for `stream`: the default streams by their
/// explicit handles (NULL follows `per_thread`), any other stream as
/// itself.
pub fn private_handle(stream: CUstream, per_thread: bool) -> usize {
    match stream as usize {
        0 if per_thread => CU_STREAM_PER_THREAD,
        0 => CU_STREAM_LEGACY,
        other => other,
    }
}

/// Slot 51: the driver's stream object for `stream` in context `ctx`;
/// `per_thread` says what a NULL stream means.
extern "C" fn private_stream(
    ctx: CUcontext,
    stream: CUstream,
    out: *mut *mut c_void,
    per_thread: c_int,
) -> u32 {
    run(CONTEXT_STREAM, 51, || {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = context_or_current(ctx)?;
        let per_thread = per_thread != 0;
        resolve_stream(stream, per_thread)?;
        if let Some(s) = STREAMS.get(stream) {
            context::same_context(&s.context, &ctx)?;
        }
        write_out(out, private_handle(stream, per_thread) as *mut c_void)
    })
}

/// Slot 39: the identity of a stream slot 51 handed out.
extern "C" fn stream_id(ctx: CUcontext, private: *mut c_void, id: *mut u64) -> u32 {
    run(CONTEXT_STREAM, 39, || {
        if private.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        context_or_current(ctx)?;
        stream::get_id(private, id)
    })
}

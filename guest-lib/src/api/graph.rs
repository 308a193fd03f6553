//! CUDA graphs by stream capture: the capture happens on the host, where
//! NVIDIA's driver records what the session's stream is given between
//! `cuStreamBeginCapture` and `cuStreamEndCapture` into a real graph; the
//! guest holds handles (chosen by it, as for streams and events) to that
//! graph and its executable form, and `cuGraphLaunch` replays it with one
//! command. Begin, end and instantiate wait for the host (their errors are
//! the driver's); launch and destroy are queued.
//!
//! The guest also remembers which of its streams capture, for
//! `cuStreamIsCapturing` and `cuStreamGetCaptureInfo` (answered locally):
//! the stream a capture began on, until it ends. A stream that joins a
//! capture by waiting on a captured event is not tracked (the host driver
//! captures its work all the same).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{write_optional, write_out, CUstream};
use crate::api::context::same_context;
use crate::state::{driver, resolve_stream, Context, Registry};

pub(crate) type CUgraph = *mut c_void;
pub(crate) type CUgraphExec = *mut c_void;

/// `CU_STREAM_CAPTURE_STATUS_*`.
pub(crate) const CAPTURE_STATUS_NONE: c_int = 0;
pub(crate) const CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`, the mode of `cuStreamBeginCapture`
/// without one; modes go up to `RELAXED` (2).
const MODE_GLOBAL: c_int = 0;
const MODE_RELAXED: c_int = 2;

pub(crate) struct Graph {
    context: Arc<Context>,
    handle: u32,
}

pub(crate) struct GraphExec {
    context: Arc<Context>,
    handle: u32,
}

static GRAPHS: Registry<Graph> = Registry::new();
static GRAPH_EXECS: Registry<GraphExec> = Registry::new();

/// Streams capturing now, by (context id, stream handle): the capture's id.
static CAPTURES: Mutex<Option<HashMap<(u64, u32), u64>>> = Mutex::new(None);
static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// `cuThreadExchangeStreamCaptureMode`'s per-thread mode.
    static THREAD_CAPTURE_MODE: Cell<c_int> = const { Cell::new(MODE_GLOBAL) };
}

fn captures<R>(f: impl FnOnce(&mut HashMap<(u64, u32), u64>) -> R) -> R {
    let mut guard = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
}

/// The id of the capture `stream` of `context` is in, if any.
pub(crate) fn capture_of(context: &Context, stream: u32) -> Option<u64> {
    captures(|c| c.get(&(context.id, stream)).copied())
}

fn begin_on(stream: CUstream, mode: c_int, per_thread: bool) -> Result<(), u32> {
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&mode) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if capture_of(&ctx, handle).is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    ctx.call(&Command::StreamBeginCapture {
        stream: handle,
        mode: mode as u32,
    })?;
    let id = NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed);
    captures(|c| c.insert((ctx.id, handle), id));
    Ok(())
}

pub(crate) fn begin_capture(stream: CUstream) -> Result<(), u32> {
    begin_on(stream, MODE_GLOBAL, false)
}

pub(crate) fn begin_capture_ptsz(stream: CUstream) -> Result<(), u32> {
    begin_on(stream, MODE_GLOBAL, true)
}

pub(crate) fn begin_capture_v2(stream: CUstream, mode: c_int) -> Result<(), u32> {
    begin_on(stream, mode, false)
}

pub(crate) fn begin_capture_v2_ptsz(stream: CUstream, mode: c_int) -> Result<(), u32> {
    begin_on(stream, mode, true)
}

fn end_on(stream: CUstream, graph: *mut CUgraph, per_thread: bool) -> Result<(), u32> {
    if graph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    // The capture ends whatever the host says (as the driver's does).
    let was_capturing = captures(|c| c.remove(&(ctx.id, handle))).is_some();
    if !was_capturing {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let graph_handle = ctx.new_handle()?;
    ctx.call(&Command::StreamEndCapture {
        stream: handle,
        graph: graph_handle,
    })?;
    write_out(
        graph,
        GRAPHS.insert(Arc::new(Graph {
            context: ctx,
            handle: graph_handle,
        })),
    )
}

pub(crate) fn end_capture(stream: CUstream, graph: *mut CUgraph) -> Result<(), u32> {
    end_on(stream, graph, false)
}

pub(crate) fn end_capture_ptsz(stream: CUstream, graph: *mut CUgraph) -> Result<(), u32> {
    end_on(stream, graph, true)
}

pub(crate) fn instantiate_with_flags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> Result<(), u32> {
    driver()?;
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let graph = GRAPHS.get(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx = graph.context.clone();
    let exec_handle = ctx.new_handle()?;
    ctx.call(&Command::GraphInstantiate {
        graph: graph.handle,
        exec: exec_handle,
        flags,
    })?;
    write_out(
        exec,
        GRAPH_EXECS.insert(Arc::new(GraphExec {
            context: ctx,
            handle: exec_handle,
        })),
    )
}

/// The older form (`cuGraphInstantiate`, `_v2`): no error node and an
/// empty log on success.
pub(crate) fn instantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> Result<(), u32> {
    write_optional(error_node, std::ptr::null_mut());
    if !log.is_null() && log_size > 0 {
        // SAFETY: the caller gave `log_size` (> 0) writable bytes at `log`.
        unsafe { log.write(0) };
    }
    instantiate_with_flags(exec, graph, 0)
}

fn launch_on(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Result<(), u32> {
    let exec = GRAPH_EXECS.get(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    same_context(&ctx, &exec.context)?;
    ctx.send(&Command::GraphLaunch {
        exec: exec.handle,
        stream: handle,
    })
}

pub(crate) fn launch(exec: CUgraphExec, stream: CUstream) -> Result<(), u32> {
    launch_on(exec, stream, false)
}

pub(crate) fn launch_ptsz(exec: CUgraphExec, stream: CUstream) -> Result<(), u32> {
    launch_on(exec, stream, true)
}

pub(crate) fn exec_destroy(exec: CUgraphExec) -> Result<(), u32> {
    driver()?;
    let exec = GRAPH_EXECS.remove(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    exec.context
        .send(&Command::GraphExecDestroy { exec: exec.handle })
}

pub(crate) fn destroy(graph: CUgraph) -> Result<(), u32> {
    driver()?;
    let graph = GRAPHS.remove(graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    graph.context.send(&Command::GraphDestroy {
        graph: graph.handle,
    })
}

/// `cuThreadExchangeStreamCaptureMode`: the calling thread's mode is
/// swapped with `*mode`. (The host's driver enforces capture rules on its
/// own thread; this keeps the value the runtime asks back.)
pub(crate) fn exchange_capture_mode(mode: *mut c_int) -> Result<(), u32> {
    if mode.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the caller passes a readable, writable int.
    let wanted = unsafe { mode.read() };
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&wanted) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let previous = THREAD_CAPTURE_MODE.with(|m| m.replace(wanted));
    write_out(mode, previous)
}

/// `CU_STREAM_CAPTURE_STATUS_*` of a stream in capture `capture` (or none).
pub(crate) fn status_of(capture: Option<u64>) -> c_int {
    match capture {
        Some(_) => CAPTURE_STATUS_ACTIVE,
        None => CAPTURE_STATUS_NONE,
    }
}

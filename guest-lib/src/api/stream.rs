//! Streams: guest-chosen handles, created without waiting; flags and
//! priority are answered locally.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{write_out, CUevent, CUstream};
use crate::api::context::same_context;
use crate::state::{current, driver, resolve_stream, Stream, EVENTS, STREAMS};

pub(crate) fn create(stream: *mut CUstream, flags: c_uint) -> Result<(), u32> {
    create_with_priority(stream, flags, 0)
}

pub(crate) fn create_with_priority(
    stream: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> Result<(), u32> {
    if stream.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let handle = ctx.new_handle()?;
    ctx.send(&Command::StreamCreate {
        stream: handle,
        flags,
        priority,
    })?;
    let object = Arc::new(Stream {
        context: ctx,
        handle,
        flags,
        priority,
    });
    write_out(stream, STREAMS.insert(object))
}

pub(crate) fn destroy(stream: CUstream) -> Result<(), u32> {
    driver()?;
    let object = STREAMS.remove(stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    object.context.send(&Command::StreamDestroy {
        stream: object.handle,
    })
}

fn synchronize_on(stream: CUstream, per_thread: bool) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    ctx.call(&Command::StreamSynchronize { stream: handle })
        .map(|_| ())
}

pub(crate) fn synchronize(stream: CUstream) -> Result<(), u32> {
    synchronize_on(stream, false)
}

pub(crate) fn synchronize_ptsz(stream: CUstream) -> Result<(), u32> {
    synchronize_on(stream, true)
}

fn query_on(stream: CUstream, per_thread: bool) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    ctx.call(&Command::StreamQuery { stream: handle })
        .map(|_| ())
}

pub(crate) fn query(stream: CUstream) -> Result<(), u32> {
    query_on(stream, false)
}

pub(crate) fn query_ptsz(stream: CUstream) -> Result<(), u32> {
    query_on(stream, true)
}

fn wait_event_on(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
    per_thread: bool,
) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    let event = EVENTS.get(event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    same_context(&ctx, &event.context)?;
    ctx.send(&Command::StreamWaitEvent {
        stream: handle,
        event: event.handle,
        flags,
    })
}

pub(crate) fn wait_event(stream: CUstream, event: CUevent, flags: c_uint) -> Result<(), u32> {
    wait_event_on(stream, event, flags, false)
}

pub(crate) fn wait_event_ptsz(stream: CUstream, event: CUevent, flags: c_uint) -> Result<(), u32> {
    wait_event_on(stream, event, flags, true)
}

/// The default streams have flags 0 and priority 0.
fn local(stream: CUstream, per_thread: bool) -> Result<(c_uint, c_int), u32> {
    resolve_stream(stream, per_thread)?;
    Ok(STREAMS
        .get(stream)
        .map_or((0, 0), |s| (s.flags, s.priority)))
}

pub(crate) fn get_priority(stream: CUstream, priority: *mut c_int) -> Result<(), u32> {
    if priority.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(priority, local(stream, false)?.1)
}

pub(crate) fn get_priority_ptsz(stream: CUstream, priority: *mut c_int) -> Result<(), u32> {
    if priority.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(priority, local(stream, true)?.1)
}

pub(crate) fn get_flags(stream: CUstream, flags: *mut c_uint) -> Result<(), u32> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(flags, local(stream, false)?.0)
}

pub(crate) fn get_flags_ptsz(stream: CUstream, flags: *mut c_uint) -> Result<(), u32> {
    if flags.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_out(flags, local(stream, true)?.0)
}

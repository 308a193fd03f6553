//! Streams: guest-chosen handles, created without waiting; flags and
//! priority are answered locally.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use rgpu_proto::channel::CompletionKind;
use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use std::ffi::c_void;

use crate::abi::{write_optional, write_out, CUcontext, CUdevice, CUevent, CUstream};
use crate::api::context::same_context;
use crate::api::graph;
use crate::state::{
    current, driver, resolve_stream, Stream, EVENTS, LEGACY_STREAM_ID, PER_THREAD_STREAM_ID,
    STREAMS,
};

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
        id: crate::state::new_id(),
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

/// Answered from the host's completion table: never waits behind queued
/// commands.
fn query_on(stream: CUstream, per_thread: bool) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    ctx.query(CompletionKind::Stream, handle)
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
    })?;
    crate::api::graph::note_stream_wait(&ctx, handle, event.handle);
    Ok(())
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

pub(crate) fn is_capturing(stream: CUstream, status: *mut c_int) -> Result<(), u32> {
    is_capturing_on(stream, status, false)
}

pub(crate) fn is_capturing_ptsz(stream: CUstream, status: *mut c_int) -> Result<(), u32> {
    is_capturing_on(stream, status, true)
}

fn is_capturing_on(stream: CUstream, status: *mut c_int, per_thread: bool) -> Result<(), u32> {
    if status.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    write_out(status, graph::status_of(graph::capture_of(&ctx, handle)))
}

/// Every form of `cuStreamGetCaptureInfo`: the status and capture id the
/// guest tracks (`api::graph`); asked for, the graph the capture records
/// into and the nodes the next captured node will depend on, which the
/// host's driver holds (named here the first time: `graph::capture_details`).
#[allow(clippy::too_many_arguments)]
fn capture_info_on(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const c_void,
    edge_data: *mut *const c_void,
    count: *mut usize,
    per_thread: bool,
) -> Result<(), u32> {
    if status.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    let capture = graph::capture_of(&ctx, handle);
    let with_dependencies = !dependencies.is_null() || !count.is_null();
    let details = match capture {
        Some(_) if !graph.is_null() || with_dependencies => {
            graph::capture_details(&ctx, handle, with_dependencies)?
        }
        _ => None,
    };
    write_optional(id, capture.unwrap_or(0));
    write_optional(
        graph,
        details.as_ref().map_or(std::ptr::null_mut(), |d| d.graph),
    );
    write_optional(
        dependencies,
        details
            .as_ref()
            .map_or(std::ptr::null(), |d| d.dependencies.cast()),
    );
    write_optional(
        edge_data,
        details
            .as_ref()
            .map_or(std::ptr::null(), |d| d.edges.cast()),
    );
    write_optional(count, details.as_ref().map_or(0, |d| d.count));
    write_out(status, graph::status_of(capture))
}

pub(crate) fn capture_info(stream: CUstream, status: *mut c_int, id: *mut u64) -> Result<(), u32> {
    use std::ptr::null_mut;
    capture_info_on(
        stream,
        status,
        id,
        null_mut(),
        null_mut(),
        null_mut(),
        null_mut(),
        false,
    )
}

pub(crate) fn capture_info_ptsz(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
) -> Result<(), u32> {
    use std::ptr::null_mut;
    capture_info_on(
        stream,
        status,
        id,
        null_mut(),
        null_mut(),
        null_mut(),
        null_mut(),
        true,
    )
}

pub(crate) fn capture_info_v2(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const c_void,
    count: *mut usize,
) -> Result<(), u32> {
    let none = std::ptr::null_mut();
    capture_info_on(stream, status, id, graph, dependencies, none, count, false)
}

pub(crate) fn capture_info_v2_ptsz(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const c_void,
    count: *mut usize,
) -> Result<(), u32> {
    let none = std::ptr::null_mut();
    capture_info_on(stream, status, id, graph, dependencies, none, count, true)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn capture_info_v3(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const c_void,
    edge_data: *mut *const c_void,
    count: *mut usize,
) -> Result<(), u32> {
    capture_info_on(
        stream,
        status,
        id,
        graph,
        dependencies,
        edge_data,
        count,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn capture_info_v3_ptsz(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const c_void,
    edge_data: *mut *const c_void,
    count: *mut usize,
) -> Result<(), u32> {
    capture_info_on(
        stream,
        status,
        id,
        graph,
        dependencies,
        edge_data,
        count,
        true,
    )
}

fn get_ctx_on(
    stream: CUstream,
    ctx: *mut CUcontext,
    green_ctx: *mut *mut c_void,
    per_thread: bool,
) -> Result<(), u32> {
    if ctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (context, _) = resolve_stream(stream, per_thread)?;
    // No green contexts: every stream belongs to a plain context.
    write_optional(green_ctx, std::ptr::null_mut());
    write_out(ctx, Arc::as_ptr(&context) as CUcontext)
}

pub(crate) fn get_ctx(stream: CUstream, ctx: *mut CUcontext) -> Result<(), u32> {
    get_ctx_on(stream, ctx, std::ptr::null_mut(), false)
}

pub(crate) fn get_ctx_ptsz(stream: CUstream, ctx: *mut CUcontext) -> Result<(), u32> {
    get_ctx_on(stream, ctx, std::ptr::null_mut(), true)
}

pub(crate) fn get_ctx_v2(
    stream: CUstream,
    ctx: *mut CUcontext,
    green_ctx: *mut *mut c_void,
) -> Result<(), u32> {
    get_ctx_on(stream, ctx, green_ctx, false)
}

pub(crate) fn get_ctx_v2_ptsz(
    stream: CUstream,
    ctx: *mut CUcontext,
    green_ctx: *mut *mut c_void,
) -> Result<(), u32> {
    get_ctx_on(stream, ctx, green_ctx, true)
}

fn get_id_on(stream: CUstream, id: *mut u64, per_thread: bool) -> Result<(), u32> {
    if id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, handle) = resolve_stream(stream, per_thread)?;
    let value = match STREAMS.get(stream) {
        Some(s) => s.id,
        None if handle == rgpu_proto::STREAM_PER_THREAD => PER_THREAD_STREAM_ID,
        None => LEGACY_STREAM_ID,
    };
    write_out(id, value)
}

pub(crate) fn get_id(stream: CUstream, id: *mut u64) -> Result<(), u32> {
    get_id_on(stream, id, false)
}

pub(crate) fn get_id_ptsz(stream: CUstream, id: *mut u64) -> Result<(), u32> {
    get_id_on(stream, id, true)
}

fn get_device_on(stream: CUstream, device: *mut CUdevice, per_thread: bool) -> Result<(), u32> {
    if device.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, _) = resolve_stream(stream, per_thread)?;
    write_out(device, ctx.device)
}

pub(crate) fn get_device(stream: CUstream, device: *mut CUdevice) -> Result<(), u32> {
    get_device_on(stream, device, false)
}

pub(crate) fn get_device_ptsz(stream: CUstream, device: *mut CUdevice) -> Result<(), u32> {
    get_device_on(stream, device, true)
}

/// `CUstreamAttrValue` (the launch attribute value union).
pub type StreamAttributeValue = [u32; 16];

/// `cuStreamSetAttribute`: the host's driver sets it (an access policy
/// window, a synchronization policy, a priority, memory sync domains).
fn set_attribute_on(
    stream: CUstream,
    id: c_int,
    value: *const StreamAttributeValue,
    per_thread: bool,
) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUstreamAttrValue.
    let w = unsafe { value.read() };
    let id = u32::try_from(id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    ctx.call(&Command::StreamSetAttribute {
        stream: handle,
        attribute: vec![rgpu_proto::command::LaunchAttr::from_union(id, &w)],
    })
    .map(|_| ())
}

pub(crate) fn set_attribute(
    stream: CUstream,
    id: c_int,
    value: *const StreamAttributeValue,
) -> Result<(), u32> {
    set_attribute_on(stream, id, value, false)
}

pub(crate) fn set_attribute_ptsz(
    stream: CUstream,
    id: c_int,
    value: *const StreamAttributeValue,
) -> Result<(), u32> {
    set_attribute_on(stream, id, value, true)
}

/// `cuStreamGetAttribute`: as the host's driver holds it.
fn get_attribute_on(
    stream: CUstream,
    id: c_int,
    value: *mut StreamAttributeValue,
    per_thread: bool,
) -> Result<(), u32> {
    let (ctx, handle) = resolve_stream(stream, per_thread)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let id = u32::try_from(id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let answer = ctx.call(&Command::StreamGetAttribute { stream: handle, id })?;
    let words = rgpu_proto::reply::decode_value_union(&answer).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(value, words)
}

pub(crate) fn get_attribute(
    stream: CUstream,
    id: c_int,
    value: *mut StreamAttributeValue,
) -> Result<(), u32> {
    get_attribute_on(stream, id, value, false)
}

pub(crate) fn get_attribute_ptsz(
    stream: CUstream,
    id: c_int,
    value: *mut StreamAttributeValue,
) -> Result<(), u32> {
    get_attribute_on(stream, id, value, true)
}

/// `cuStreamCopyAttributes`: two streams of one context.
fn copy_attributes_on(dst: CUstream, src: CUstream, per_thread: bool) -> Result<(), u32> {
    let (ctx, dst) = resolve_stream(dst, per_thread)?;
    let (src_ctx, src) = resolve_stream(src, per_thread)?;
    same_context(&ctx, &src_ctx)?;
    ctx.call(&Command::StreamCopyAttributes { dst, src })
        .map(|_| ())
}

pub(crate) fn copy_attributes(dst: CUstream, src: CUstream) -> Result<(), u32> {
    copy_attributes_on(dst, src, false)
}

pub(crate) fn copy_attributes_ptsz(dst: CUstream, src: CUstream) -> Result<(), u32> {
    copy_attributes_on(dst, src, true)
}

//! Events: guest-chosen handles; create, record and destroy are queued,
//! synchronize and elapsed time wait for the host, a query is answered from
//! the host's completion table.

use std::ffi::c_uint;
use std::sync::Arc;

use rgpu_proto::channel::CompletionKind;
use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{write_out, CUevent, CUstream};
use crate::api::context::same_context;
use crate::state::{current, driver, resolve_stream, Event, EVENTS};

fn event(handle: CUevent) -> Result<Arc<Event>, u32> {
    driver()?;
    EVENTS.get(handle).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// The event a launch attribute names: the host knows it by its handle,
/// and it must belong to the launch's context.
pub(crate) fn named(event_ptr: CUevent) -> Result<Arc<Event>, u32> {
    event(event_ptr)
}

pub(crate) fn create(phevent: *mut CUevent, flags: c_uint) -> Result<(), u32> {
    if phevent.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let handle = ctx.new_handle()?;
    ctx.send(&Command::EventCreate {
        event: handle,
        flags,
    })?;
    write_out(
        phevent,
        EVENTS.insert(Arc::new(Event {
            context: ctx,
            handle,
            ipc: false,
        })),
    )
}

fn record_on(hevent: CUevent, stream: CUstream, per_thread: bool) -> Result<(), u32> {
    let e = event(hevent)?;
    let (ctx, stream) = resolve_stream(stream, per_thread)?;
    same_context(&ctx, &e.context)?;
    ctx.send(&Command::EventRecord {
        event: e.handle,
        stream,
    })?;
    crate::api::graph::note_event_record(&ctx, e.handle, stream);
    Ok(())
}

pub(crate) fn record(hevent: CUevent, stream: CUstream) -> Result<(), u32> {
    record_on(hevent, stream, false)
}

pub(crate) fn record_ptsz(hevent: CUevent, stream: CUstream) -> Result<(), u32> {
    record_on(hevent, stream, true)
}

pub(crate) fn synchronize(hevent: CUevent) -> Result<(), u32> {
    let e = event(hevent)?;
    e.context
        .call(&Command::EventSynchronize { event: e.handle })
        .map(|_| ())
}

/// Answered from the host's completion table: never waits behind queued
/// commands. An event opened from another process's IPC handle is recorded
/// there, out of this channel's sight: the host is asked.
pub(crate) fn query(hevent: CUevent) -> Result<(), u32> {
    let e = event(hevent)?;
    if e.ipc {
        return e
            .context
            .call(&Command::EventQuery { event: e.handle })
            .map(|_| ());
    }
    e.context.query(CompletionKind::Event, e.handle)
}

pub(crate) fn elapsed_time(ms: *mut f32, start: CUevent, end: CUevent) -> Result<(), u32> {
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (start, end) = (event(start)?, event(end)?);
    same_context(&start.context, &end.context)?;
    let payload = start.context.call(&Command::EventElapsedTime {
        start: start.handle,
        end: end.handle,
    })?;
    let bytes: [u8; 4] = payload
        .as_slice()
        .try_into()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(ms, f32::from_le_bytes(bytes))
}

pub(crate) fn destroy(hevent: CUevent) -> Result<(), u32> {
    driver()?;
    let e = EVENTS.remove(hevent).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    e.context.send(&Command::EventDestroy { event: e.handle })
}

/// `CU_EVENT_RECORD_DEFAULT` and `CU_EVENT_RECORD_EXTERNAL`. The host
/// records either as a plain record: during a capture an external record
/// is a join point there, not an event-record node.
const RECORD_FLAGS: c_uint = 0x1;

pub(crate) fn record_with_flags(
    hevent: CUevent,
    stream: CUstream,
    flags: c_uint,
) -> Result<(), u32> {
    if flags & !RECORD_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    record_on(hevent, stream, false)
}

pub(crate) fn record_with_flags_ptsz(
    hevent: CUevent,
    stream: CUstream,
    flags: c_uint,
) -> Result<(), u32> {
    if flags & !RECORD_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    record_on(hevent, stream, true)
}

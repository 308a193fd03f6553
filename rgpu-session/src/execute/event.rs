//! Events: creation, record, synchronization, queries, elapsed time.

use super::*;

/// `EventCreate`.
pub(super) fn event_create(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::EventCreate { event, flags } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let limits = env.limits;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    check_new(&handles.events, *event)?;
    check_room(handles.events.len(), limits.events)?;
    let created = ctx.event_create(*flags)?;
    handles.events.insert(*event, created);
    Ok(Vec::new())
}

/// `EventDestroy`.
pub(super) fn event_destroy(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::EventDestroy { event } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let usage = env.usage;
    let tenant = env.tenant;
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let created = handles.event(*event)?;
    tenant
        .ipc()
        .withdraw(IpcKind::Event, event_key(usage.member, *event));
    ctx.event_destroy(created)?;
    handles.events.remove(event);
    Ok(Vec::new())
}

/// `EventRecord`.
pub(super) fn event_record(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::EventRecord { event, stream } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let event = handles.event(*event)?;
    let stream = handles.stream(*stream)?;
    ctx.event_record(event, stream).map(empty)
}

/// `EventSynchronize`.
pub(super) fn event_synchronize(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::EventSynchronize { event } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let event = handles.event(*event)?;
    ctx.event_synchronize(event).map(empty)
}

/// `EventQuery`.
pub(super) fn event_query(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::EventQuery { event } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let event = handles.event(*event)?;
    ctx.event_query(event).map(empty)
}

/// `EventElapsedTime`.
pub(super) fn event_elapsed_time(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::EventElapsedTime { start, end } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    let handles = &mut *env.handles;
    let start = handles.event(*start)?;
    let end = handles.event(*end)?;
    ctx.event_elapsed_time(start, end)
        .map(|ms| ms.to_le_bytes().to_vec())
}

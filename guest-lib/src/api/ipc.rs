//! CUDA IPC between processes of one tenant (`cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`, `cuIpcGetEventHandle`,
//! `cuIpcOpenEventHandle`): what PyTorch's multiprocessing uses, through
//! cudart, to share CUDA tensors and the events that order their use.
//!
//! The handles are the host driver's own, 64 bytes each: the exporting
//! process's worker takes one, the application passes it to another
//! process however it likes, and that process's worker opens it. The
//! daemon opens only handles that a process of the same tenant exported
//! (its registry); anything else fails with `CUDA_ERROR_INVALID_HANDLE`.
//!
//! An opened mapping is recorded as the opening context's memory (pointer
//! queries and `cuMemGetAddressRange` answer for it, copies and memsets
//! may name it), counted per open as the driver counts them, and forgotten
//! at the last `cuIpcCloseMemHandle`. An opened event is one of the
//! context's events; another process records it, so its queries always
//! ask the host.

use std::ffi::{c_char, c_uint};
use std::sync::Arc;

use rgpu_proto::command::{IpcHandle as WireHandle, IPC_HANDLE_BYTES};
use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;

use crate::abi::{write_out, CUdeviceptr, CUevent};
use crate::device_ranges;
use crate::state::{current, driver, new_id, Context, DeviceAllocation, Event, CONTEXTS, EVENTS};

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes, passed by
/// value to the open calls.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcHandle {
    reserved: [c_char; IPC_HANDLE_BYTES],
}

impl IpcHandle {
    fn wire(&self) -> WireHandle {
        self.reserved.map(|b| b as u8)
    }

    /// The handle in a reply payload (exactly 64 bytes).
    fn from_payload(payload: &[u8]) -> Result<Self, u32> {
        let bytes: WireHandle = payload.try_into().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        Ok(Self {
            reserved: bytes.map(|b| b as c_char),
        })
    }
}

/// The live context (the current one first) whose record holds `ptr` as
/// `wanted` accepts it.
fn context_holding(
    current: Arc<Context>,
    ptr: u64,
    wanted: impl Fn(u64, &DeviceAllocation) -> bool,
) -> Option<Arc<Context>> {
    let holds = |c: &Context| {
        c.allocation_at(ptr)
            .is_some_and(|(base, allocation)| wanted(base, &allocation))
    };
    if holds(&current) {
        return Some(current);
    }
    CONTEXTS
        .values()
        .into_iter()
        .find(|c| c.is_alive() && holds(c))
}

pub(crate) fn get_mem_handle(handle: *mut IpcHandle, dptr: CUdeviceptr) -> Result<(), u32> {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let current = current()?;
    // The allocation's own context asks (its daemon made it); memory this
    // process opened is not its to export. Anything else: the host says.
    let ctx = context_holding(current.clone(), dptr, |_, a| a.ipc_opens == 0).unwrap_or(current);
    if ctx
        .allocation_at(dptr)
        .is_some_and(|(_, a)| a.ipc_opens > 0)
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let payload = ctx.call(&Command::IpcGetMemHandle { device_ptr: dptr })?;
    write_out(handle, IpcHandle::from_payload(&payload)?)
}

pub(crate) fn open_mem_handle(
    pdptr: *mut CUdeviceptr,
    handle: IpcHandle,
    flags: c_uint,
) -> Result<(), u32> {
    if pdptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let payload = ctx.call(&Command::IpcOpenMemHandle {
        handle: handle.wire(),
        flags,
    })?;
    let [ptr, size] = decode_u64s::<2>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if size == 0 {
        return Err(CUDA_ERROR_UNKNOWN);
    }
    {
        let mut allocations = ctx.allocations.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        match allocations.get_mut(&ptr) {
            // Opened again: the driver answered the same mapping.
            Some(open) if open.ipc_opens > 0 => open.ipc_opens = open.ipc_opens.saturating_add(1),
            _ => {
                allocations.insert(
                    ptr,
                    DeviceAllocation {
                        size,
                        buffer_id: new_id(),
                        ipc_opens: 1,
                    },
                );
                device_ranges::add_allocation(ctx.space, ctx.id, ptr, size);
            }
        }
    }
    write_out(pdptr, ptr)
}

pub(crate) fn close_mem_handle(dptr: CUdeviceptr) -> Result<(), u32> {
    let current = current()?;
    let ctx = context_holding(current, dptr, |base, a| base == dptr && a.ipc_opens > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    ctx.call(&Command::IpcCloseMemHandle { device_ptr: dptr })?;
    let mut allocations = ctx.allocations.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let last = match allocations.get_mut(&dptr) {
        Some(open) if open.ipc_opens > 1 => {
            open.ipc_opens -= 1;
            false
        }
        _ => true,
    };
    if last {
        allocations.remove(&dptr);
        device_ranges::remove_allocation(ctx.space, dptr);
    }
    Ok(())
}

pub(crate) fn get_event_handle(handle: *mut IpcHandle, event: CUevent) -> Result<(), u32> {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let e = EVENTS.get(event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let payload = e
        .context
        .call(&Command::IpcGetEventHandle { event: e.handle })?;
    write_out(handle, IpcHandle::from_payload(&payload)?)
}

pub(crate) fn open_event_handle(phevent: *mut CUevent, handle: IpcHandle) -> Result<(), u32> {
    if phevent.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let event = ctx.new_handle()?;
    ctx.call(&Command::IpcOpenEventHandle {
        event,
        handle: handle.wire(),
    })?;
    write_out(
        phevent,
        EVENTS.insert(Arc::new(Event {
            context: ctx,
            handle: event,
            ipc: true,
        })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_64_bytes_as_cuda_h_lays_it_out() {
        assert_eq!(std::mem::size_of::<IpcHandle>(), 64);
        assert_eq!(std::mem::align_of::<IpcHandle>(), 1);
        let mut bytes = [0u8; 64];
        bytes[0] = 0xff;
        bytes[63] = 7;
        let handle = IpcHandle::from_payload(&bytes).unwrap();
        assert_eq!(handle.wire(), bytes);
        assert_eq!(
            IpcHandle::from_payload(&bytes[..63]).map(|h| h.wire()),
            Err(CUDA_ERROR_UNKNOWN)
        );
    }

    #[test]
    fn calls_before_init_fail_cleanly() {
        let mut ptr = 0u64;
        let handle = IpcHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        assert_eq!(
            open_mem_handle(&mut ptr, handle, 1),
            Err(CUDA_ERROR_NOT_INITIALIZED)
        );
        assert_eq!(close_mem_handle(0x1000), Err(CUDA_ERROR_NOT_INITIALIZED));
        assert_eq!(
            get_mem_handle(std::ptr::null_mut(), 0x1000),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }
}

//! Device memory, page-locked host memory, copies and memsets.
//!
//! A copy whose host side lies entirely in page-locked (blob) memory names
//! that blob range and costs no guest copy; any other host memory is staged
//! through the channel. Synchronous forms wait for the host's result;
//! asynchronous forms only queue (their errors surface later), except a
//! device-to-host copy into pageable memory, which must complete before the
//! data can be handed back.
//!
//! Every device range a copy or memset names is checked against
//! `device_ranges` first: the host refuses the others, and an
//! asynchronous refusal would surface only later, as a sticky error.
//! Memory of another carrier's device (`RGPU_DEVICES`) is reached through a
//! context of that device ([`peer`]).

use std::ffi::{c_uint, c_void};

use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;

use crate::abi::{bytes, bytes_mut, write_optional, write_out, CUdeviceptr, CUstream};
use crate::api::peer;
use crate::device_ranges::{self, Location};
use crate::pinned;
use crate::state::{
    current, driver, new_id, resolve_stream, sync_stream, Context, DeviceAllocation, CONTEXTS,
};

pub(crate) fn alloc(dptr: *mut CUdeviceptr, size: usize) -> Result<(), u32> {
    if dptr.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let payload = ctx.call(&Command::MemAlloc { size: size as u64 })?;
    let [ptr] = decode_u64s::<1>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    ctx.allocations
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(
            ptr,
            DeviceAllocation {
                size: size as u64,
                buffer_id: new_id(),
                ipc_opens: 0,
            },
        );
    device_ranges::add_allocation(ctx.space, ctx.id, ptr, size as u64);
    write_out(dptr, ptr)
}

pub(crate) fn free(dptr: CUdeviceptr) -> Result<(), u32> {
    let current = current()?;
    if dptr == 0 {
        return Ok(());
    }
    // The allocation's own context frees it: natively any context may, and
    // with several carriers (`RGPU_DEVICES`) only the owner's daemon can.
    // The current context first, as addresses of two daemons may coincide.
    let is_base = |c: &Context| c.allocation_at(dptr).is_some_and(|(base, _)| base == dptr);
    // Memory imported into a pool is closed; memory of another process
    // opened through IPC otherwise is closed, not freed.
    if crate::api::memory_pool::forget_imported(dptr) {
        return crate::api::ipc::close_mem_handle(dptr);
    }
    if current
        .allocation_at(dptr)
        .is_some_and(|(base, a)| base == dptr && a.ipc_opens > 0)
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = if is_base(&current) {
        current
    } else {
        CONTEXTS
            .values()
            .into_iter()
            .find(|c| c.is_alive() && is_base(c))
            .unwrap_or(current)
    };
    ctx.call(&Command::MemFree { device_ptr: dptr })?;
    device_ranges::remove_allocation(ctx.space, dptr);
    ctx.allocations
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .remove(&dptr);
    Ok(())
}

/// `cuMemGetAddressRange_v2`: the allocation of the current context that
/// holds `dptr`, answered from the guest's own record.
pub(crate) fn get_address_range(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> Result<(), u32> {
    let (start, allocation) = current()?.allocation_at(dptr).ok_or(CUDA_ERROR_NOT_FOUND)?;
    write_optional(base, start);
    write_optional(size, usize::try_from(allocation.size).unwrap_or(usize::MAX));
    Ok(())
}

pub(crate) fn get_info(free: *mut usize, total: *mut usize) -> Result<(), u32> {
    if free.is_null() || total.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let payload = current()?.call(&Command::MemGetInfo)?;
    let [f, t] = decode_u64s::<2>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(free, usize::try_from(f).unwrap_or(usize::MAX))?;
    write_out(total, usize::try_from(t).unwrap_or(usize::MAX))
}

pub(crate) fn alloc_host(pp: *mut *mut c_void, size: usize) -> Result<(), u32> {
    if pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    let (ptr, _) = alloc_page_locked(&ctx, size)?;
    write_out(pp, ptr.cast())
}

/// `size` bytes of page-locked memory of `ctx`: its address, and the device
/// address kernels and stream operations reach it at (`None` where the
/// host's GPU does not see it: the network carrier).
pub(crate) fn alloc_page_locked(
    ctx: &std::sync::Arc<Context>,
    size: usize,
) -> Result<(*mut u8, Option<u64>), u32> {
    let owner = pinned::Owner {
        ctx_id: ctx.ctx_id(),
        device: ctx.device,
        space: ctx.space,
        context: std::sync::Arc::as_ptr(ctx) as usize,
    };
    let carrier = driver()?.carrier(ctx.space)?;
    let ptr = pinned::alloc(carrier.as_ref(), owner, crate::state::new_id(), size as u64)?;
    let mut device_address = None;
    // With unified addressing, kernels, copies and memsets reach
    // page-locked memory by its host pointer (XLA relies on it). The host
    // maps the blob for its GPU at this very address where it can: asking
    // where registers it now, as the driver pins at allocation.
    if carrier.remote().is_none() {
        let mapped = map_for_kernels(ctx, ptr.cast(), size);
        device_address = mapped.ok();
        match mapped {
            Ok(device) if device == ptr as u64 => {}
            Ok(device) => log::info!(
                "rgpu: page-locked memory at {ptr:p} is mapped for kernels at {device:#x}, not at \
                 its own address (the host had that range in use): kernels must be given \
                 cuMemHostGetDevicePointer's address"
            ),
            // The host could not map the blob at all (its pages were
            // too scattered for its worker): the memory is unusable, and
            // the allocation fails as the driver's does when it cannot pin.
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                log::warn!(
                    "rgpu: the host cannot map {size} bytes of page-locked memory (too many \
                     scattered pages: see the daemon's log); CUDA_ERROR_OUT_OF_MEMORY"
                );
                free_host(ptr.cast())?;
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            Err(code) => log::debug!(
                "rgpu: page-locked memory at {ptr:p} is not mapped for kernels (error {code})"
            ),
        }
    }
    Ok((ptr, device_address))
}

/// Asks the host where kernels reach page-locked memory at `p` (`len`
/// bytes of one block), and records that device range as this process's.
fn map_for_kernels(ctx: &Context, p: *mut c_void, len: usize) -> Result<u64, u32> {
    let range = blob_range(ctx, p, len)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let payload = ctx.call(&Command::HostDevicePointer { range })?;
    let [device] = decode_u64s::<1>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    pinned::note_device_address(p as usize, device);
    if let Some(block) = pinned::lookup(p as usize) {
        if let Some(start) = block.device_address {
            device_ranges::add_page_locked(ctx.space, ctx.id, start, block.size);
        }
    }
    Ok(device)
}

pub(crate) fn alloc_host_v1(pp: *mut *mut c_void, size: c_uint) -> Result<(), u32> {
    alloc_host(pp, size as usize)
}

/// Portable, device-mapped and write-combined memory are all the same blob
/// memory here: the flags need no action.
pub(crate) fn host_alloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> Result<(), u32> {
    log::debug!("rgpu: cuMemHostAlloc flags {flags:#x}");
    alloc_host(pp, size)
}

/// `cuMemHostGetDevicePointer`: where kernels reach page-locked memory.
/// The host maps the blob's pages for its GPU, so a kernel reads and
/// writes this very memory; the address differs from `p` (the host's
/// mapping, not this process's). Memory of `cuMemHostRegister` has none.
pub(crate) fn host_get_device_pointer(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> Result<(), u32> {
    if pdptr.is_null() || p.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    if blob_range(&ctx, p, 1)?.is_none() {
        // Known memory the host does not see: registered with
        // cuMemHostRegister, or page-locked over the network carrier (or
        // on another carrier's daemon).
        let known = crate::api::host_register::lookup(p as usize).is_some()
            || pinned::lookup(p as usize).is_some();
        if known {
            log::warn!(
                "rgpu: cuMemHostGetDevicePointer of {p:p} is not supported: the host's GPU does \
                 not see that memory"
            );
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let known = pinned::lookup(p as usize).and_then(|b| Some((b.base, b.device_address?)));
    let device = match known {
        // Known since the allocation.
        Some((base, start)) => start + (p as usize - base) as u64,
        None => map_for_kernels(&ctx, p, 1)?,
    };
    write_out(pdptr, device)
}

pub(crate) fn free_host(p: *mut c_void) -> Result<(), u32> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let driver = driver()?;
    if let Some(block) = pinned::lookup(p as usize).filter(|b| b.base == p as usize) {
        if let Some(start) = block.device_address {
            device_ranges::remove_page_locked(block.space, start);
        }
    }
    pinned::free(|space| Ok(driver.carrier(space)?.as_ref()), p.cast())
}

fn blob_range(
    ctx: &Context,
    host: *const c_void,
    len: usize,
) -> Result<Option<rgpu_proto::BlobRange>, u32> {
    pinned::blob_range(
        driver()?.carrier(ctx.space)?.as_ref(),
        ctx.space,
        ctx.ctx_id(),
        host as usize,
        len as u64,
    )
}

pub(crate) fn htod(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    if pinned::process_only_as_device("cuMemcpyHtoD", dst, len as u64)? {
        refuse_captured_over_network(ctx, stream, "cuMemcpyHtoD")?;
        // SAFETY: `dst` is `len` bytes of this process's page-locked memory
        // (checked), `src` the caller's `len` bytes (the API contract);
        // `copy` allows them to overlap.
        unsafe { std::ptr::copy(src.cast::<u8>(), dst as usize as *mut u8, len) };
        return Ok(());
    }
    match device_ranges::locate(ctx.space, [(dst, len as u64)])? {
        [Location::Here] => htod_unchecked(ctx, stream, dst, src, len, sync),
        [elsewhere @ Location::Elsewhere { .. }] => {
            let owner = peer::owner(elsewhere)?;
            let target = owner.as_deref().unwrap_or(ctx);
            peer::run_on(ctx, stream, target, sync, |c, s, sync| {
                htod_unchecked(c, s, dst, src, len, sync)
            })
        }
        [Location::Nowhere] => Err(not_device_memory(dst, len)),
    }
}

fn not_device_memory(ptr: CUdeviceptr, len: usize) -> u32 {
    log::debug!("rgpu: device range {ptr:#x}+{len:#x} is not this process's memory");
    CUDA_ERROR_INVALID_VALUE
}

/// [`htod`] for a caller that has checked the device range itself.
pub(crate) fn htod_unchecked(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match blob_range(ctx, src, len)? {
        Some(range) => {
            let command = Command::MemcpyHtoD {
                stream,
                dst,
                src: range,
            };
            if sync {
                ctx.call(&command).map(|_| ())
            } else {
                ctx.send(&command)
            }
        }
        None => {
            refuse_captured_over_network(ctx, stream, "cuMemcpyHtoDAsync")?;
            let data = bytes(src, len)?;
            match ctx.with_channel(|c| c.copy_to_device(stream, dst, data, sync))? {
                CUDA_SUCCESS => Ok(()),
                code => Err(code),
            }
        }
    }
}

/// Over the network carrier a copy from or to host memory is made now,
/// through the connection: captured into a graph, the host would record a
/// copy of its staging buffer, which no replay reaches the program through.
/// Refused at the call instead (`call` names it in the log).
pub(crate) fn refuse_captured_over_network(
    ctx: &Context,
    stream: u32,
    call: &'static str,
) -> Result<(), u32> {
    if crate::api::graph::is_capturing(ctx, stream) && ctx.over_network() {
        return Err(pinned::unreachable(call, pinned::Unreachable::Graph));
    }
    Ok(())
}

pub(crate) fn dtoh(
    ctx: &Context,
    stream: u32,
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    if pinned::process_only_as_device("cuMemcpyDtoH", src, len as u64)? {
        refuse_captured_over_network(ctx, stream, "cuMemcpyDtoH")?;
        // SAFETY: `src` is `len` bytes of this process's page-locked memory
        // (checked), `dst` the caller's `len` bytes (the API contract);
        // `copy` allows them to overlap.
        unsafe { std::ptr::copy(src as usize as *const u8, dst.cast::<u8>(), len) };
        return Ok(());
    }
    match device_ranges::locate(ctx.space, [(src, len as u64)])? {
        [Location::Here] => dtoh_unchecked(ctx, stream, dst, src, len, sync),
        [elsewhere @ Location::Elsewhere { .. }] => {
            let owner = peer::owner(elsewhere)?;
            let target = owner.as_deref().unwrap_or(ctx);
            peer::run_on(ctx, stream, target, sync, |c, s, sync| {
                dtoh_unchecked(c, s, dst, src, len, sync)
            })
        }
        [Location::Nowhere] => Err(not_device_memory(src, len)),
    }
}

/// [`dtoh`] for a caller that has checked the device range itself.
pub(crate) fn dtoh_unchecked(
    ctx: &Context,
    stream: u32,
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match blob_range(ctx, dst, len)? {
        Some(range) => {
            let command = Command::MemcpyDtoH {
                stream,
                dst: range,
                src,
            };
            if sync {
                ctx.call(&command).map(|_| ())
            } else {
                ctx.send(&command)
            }
        }
        None => {
            refuse_captured_over_network(ctx, stream, "cuMemcpyDtoHAsync")?;
            let data = bytes_mut(dst, len)?;
            match ctx.with_channel(|c| c.copy_from_device(stream, data, src))? {
                CUDA_SUCCESS => Ok(()),
                code => Err(code),
            }
        }
    }
}

pub(crate) fn dtod(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    // Page-locked memory of this process only (network carrier) is the
    // program's own: a copy from it uploads it, one into it downloads.
    let dst_own = pinned::process_only_as_device("cuMemcpyDtoD", dst, len as u64)?;
    let src_own = pinned::process_only_as_device("cuMemcpyDtoD", src, len as u64)?;
    match (dst_own, src_own) {
        (true, _) => return dtoh(ctx, stream, dst as usize as *mut c_void, src, len, true),
        (false, true) => return htod(ctx, stream, dst, src as usize as *const c_void, len, sync),
        (false, false) => {}
    }
    match device_ranges::locate(ctx.space, [(dst, len as u64), (src, len as u64)])? {
        [Location::Here, Location::Here] => dtod_unchecked(ctx, stream, dst, src, len, sync),
        [Location::Nowhere, _] => Err(not_device_memory(dst, len)),
        [_, Location::Nowhere] => Err(not_device_memory(src, len)),
        [to, from] => {
            let (dst_owner, src_owner) = (peer::owner(to)?, peer::owner(from)?);
            let dst_ctx = dst_owner.as_deref().unwrap_or(ctx);
            let src_ctx = src_owner.as_deref().unwrap_or(ctx);
            peer::device_to_device(ctx, stream, (dst_ctx, dst), (src_ctx, src), len, sync)
        }
    }
}

/// [`dtod`] for a caller that has checked both device ranges itself.
pub(crate) fn dtod_unchecked(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    sync: bool,
) -> Result<(), u32> {
    if len == 0 {
        return Ok(());
    }
    let command = Command::MemcpyDtoD {
        stream,
        dst,
        src,
        size: len as u64,
    };
    if sync {
        ctx.call(&command).map(|_| ())
    } else {
        ctx.send(&command)
    }
}

pub(crate) fn htod_sync(dst: CUdeviceptr, src: *const c_void, len: usize) -> Result<(), u32> {
    htod(current()?.as_ref(), sync_stream(false), dst, src, len, true)
}

pub(crate) fn htod_sync_ptds(dst: CUdeviceptr, src: *const c_void, len: usize) -> Result<(), u32> {
    htod(current()?.as_ref(), sync_stream(true), dst, src, len, true)
}

pub(crate) fn htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, false)?;
    htod(&ctx, stream, dst, src, len, false)
}

pub(crate) fn htod_async_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, true)?;
    htod(&ctx, stream, dst, src, len, false)
}

pub(crate) fn dtoh_sync(dst: *mut c_void, src: CUdeviceptr, len: usize) -> Result<(), u32> {
    dtoh(current()?.as_ref(), sync_stream(false), dst, src, len, true)
}

pub(crate) fn dtoh_sync_ptds(dst: *mut c_void, src: CUdeviceptr, len: usize) -> Result<(), u32> {
    dtoh(current()?.as_ref(), sync_stream(true), dst, src, len, true)
}

pub(crate) fn dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, false)?;
    dtoh(&ctx, stream, dst, src, len, false)
}

pub(crate) fn dtoh_async_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, true)?;
    dtoh(&ctx, stream, dst, src, len, false)
}

pub(crate) fn dtod_sync(dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<(), u32> {
    dtod(current()?.as_ref(), sync_stream(false), dst, src, len, true)
}

pub(crate) fn dtod_sync_ptds(dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<(), u32> {
    dtod(current()?.as_ref(), sync_stream(true), dst, src, len, true)
}

pub(crate) fn dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, false)?;
    dtod(&ctx, stream, dst, src, len, false)
}

pub(crate) fn dtod_async_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, true)?;
    dtod(&ctx, stream, dst, src, len, false)
}

/// Memsets never wait: an error of the host's would surface only at the
/// next synchronising call, so the guest checks what it can first.
fn memset(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    value: u32,
    element_size: u32,
    count: usize,
) -> Result<(), u32> {
    if count == 0 {
        return Ok(());
    }
    let len = (count as u64)
        .checked_mul(u64::from(element_size))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if pinned::host_cannot_reach(dst, len) {
        return memset_process_only(ctx, stream, dst, value, element_size, count, len);
    }
    let owner = match device_ranges::locate(ctx.space, [(dst, len)])? {
        [Location::Nowhere] => {
            log::debug!("rgpu: device range {dst:#x}+{len:#x} is not this process's memory");
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        [location] => peer::owner(location)?,
    };
    let target = owner.as_deref().unwrap_or(ctx);
    peer::run_on(ctx, stream, target, false, |c, stream, _| {
        c.send(&Command::Memset {
            stream,
            dst,
            value,
            element_size,
            count: count as u64,
        })
    })
}

/// A memset of page-locked memory named as device memory over the network
/// carrier, which shares no memory with the host: the program's own bytes,
/// filled here and now. That keeps the stream's order, as nothing the host
/// runs reaches this memory (copies into it end before their call
/// returns, host functions run in their call). XLA zeroes its timers'
/// page-locked flags so. A capture would not record it: refused.
fn memset_process_only(
    ctx: &Context,
    stream: u32,
    dst: CUdeviceptr,
    value: u32,
    element_size: u32,
    count: usize,
    len: u64,
) -> Result<(), u32> {
    if !pinned::process_only_as_device("cuMemsetD*", dst, len)? {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    refuse_captured_over_network(ctx, stream, "cuMemsetD*")?;
    let bytes = value.to_le_bytes();
    let element = bytes
        .get(..element_size as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let start = dst as usize as *mut u8;
    for i in 0..count {
        // SAFETY: `[dst, dst + len)` lies in one live page-locked block of
        // this process (checked above), `len` = `count` * `element_size`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                element.as_ptr(),
                start.add(i * element.len()),
                element.len(),
            )
        };
    }
    Ok(())
}

macro_rules! memset_forms {
    ($($sync:ident, $sync_ptds:ident, $async_:ident, $async_ptsz:ident: $ty:ty, $size:expr;)*) => {$(
        pub(crate) fn $sync(dst: CUdeviceptr, value: $ty, count: usize) -> Result<(), u32> {
            memset(current()?.as_ref(), sync_stream(false), dst, value.into(), $size, count)
        }

        pub(crate) fn $sync_ptds(dst: CUdeviceptr, value: $ty, count: usize) -> Result<(), u32> {
            memset(current()?.as_ref(), sync_stream(true), dst, value.into(), $size, count)
        }

        pub(crate) fn $async_(dst: CUdeviceptr, value: $ty, count: usize, stream: CUstream) -> Result<(), u32> {
            let (ctx, stream) = resolve_stream(stream, false)?;
            memset(&ctx, stream, dst, value.into(), $size, count)
        }

        pub(crate) fn $async_ptsz(dst: CUdeviceptr, value: $ty, count: usize, stream: CUstream) -> Result<(), u32> {
            let (ctx, stream) = resolve_stream(stream, true)?;
            memset(&ctx, stream, dst, value.into(), $size, count)
        }
    )*};
}

memset_forms! {
    memset_d8, memset_d8_ptds, memset_d8_async, memset_d8_async_ptsz: u8, 1;
    memset_d16, memset_d16_ptds, memset_d16_async, memset_d16_async_ptsz: u16, 2;
    memset_d32, memset_d32_ptds, memset_d32_async, memset_d32_async_ptsz: u32, 4;
}

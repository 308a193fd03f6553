//! Pointer queries (`cuPointerGetAttribute`, `cuPointerGetAttributes`),
//! answered in the guest with no round trip: it knows every device
//! allocation it made (each context's map) and every page-locked block
//! (`crate::pinned`).
//!
//! Page-locked memory is blob memory that kernels cannot address (the host
//! copies from and to it), so it has a host pointer but no device pointer.
//! Value widths follow NVIDIA's own bindings: booleans are one byte, sizes
//! `size_t`, memory types and flag masks `unsigned int`.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use rgpu_proto::cuda_result::*;

use crate::abi::CUdeviceptr;
use crate::pinned;
use crate::state::{current_or_none, driver, CONTEXTS};

/// `CUpointer_attribute` numbers (cuda.h).
const CONTEXT: c_int = 1;
const MEMORY_TYPE: c_int = 2;
const DEVICE_POINTER: c_int = 3;
const HOST_POINTER: c_int = 4;
const P2P_TOKENS: c_int = 5;
const SYNC_MEMOPS: c_int = 6;
const BUFFER_ID: c_int = 7;
const IS_MANAGED: c_int = 8;
const DEVICE_ORDINAL: c_int = 9;
const IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;
const MAPPED: c_int = 13;
const ALLOWED_HANDLE_TYPES: c_int = 14;
const IS_GPU_DIRECT_RDMA_CAPABLE: c_int = 15;
const ACCESS_FLAGS: c_int = 16;
const MEMPOOL_HANDLE: c_int = 17;
const MAPPING_SIZE: c_int = 18;
const MAPPING_BASE_ADDR: c_int = 19;
const MEMORY_BLOCK_ID: c_int = 20;
const IS_HW_DECOMPRESS_CAPABLE: c_int = 21;

/// `CUmemorytype`.
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE`.
const ACCESS_READWRITE: c_uint = 3;
/// The device ordinal `cuPointerGetAttributes` reports for memory CUDA does
/// not know (what cudart passes on as the device of unregistered memory).
const UNKNOWN_DEVICE: c_int = -2;
/// Most attributes one `cuPointerGetAttributes` call may ask for.
const MAX_ATTRIBUTES: c_uint = 256;

/// What the guest knows about the memory a pointer lies in.
#[derive(Debug, Clone, Copy)]
struct Located {
    /// The owning context's `CUcontext` value; 0 once it is gone.
    context: usize,
    memory_type: c_uint,
    device: c_int,
    base: u64,
    size: u64,
    buffer_id: u64,
    /// A `cuMemAlloc` allocation of this process: `cuIpcGetMemHandle`
    /// exports it.
    ipc_capable: bool,
    /// Page-locked memory the host maps for kernels: its host and device
    /// addresses of `base`'s place (`base` is one of the two).
    mapped: Option<(u64, u64)>,
}

/// One attribute value, in the width the driver writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Pointer(usize),
    Uint(c_uint),
    Int(c_int),
    U64(u64),
    Size(usize),
    Bool(bool),
}

fn locate(ptr: CUdeviceptr) -> Result<Option<Located>, u32> {
    driver()?;
    // The current context first: another context's addresses may coincide
    // (the sim executor's do).
    let current = current_or_none().ok().flatten();
    let contexts = current.into_iter().chain(CONTEXTS.values());
    for ctx in contexts.filter(|c| c.is_alive()) {
        if let Some((base, allocation)) = ctx.allocation_at(ptr) {
            return Ok(Some(Located {
                context: Arc::as_ptr(&ctx) as usize,
                memory_type: MEMORYTYPE_DEVICE,
                device: ctx.device,
                base,
                size: allocation.size,
                buffer_id: allocation.buffer_id,
                ipc_capable: allocation.ipc_opens == 0,
                mapped: None,
            }));
        }
    }
    if let Some((start, size, ctx)) = crate::api::vmm::mapping_at(ptr) {
        // Virtual-memory API mappings: device memory of the physical
        // allocation's device.
        return Ok(Some(Located {
            context: Arc::as_ptr(&ctx) as usize,
            memory_type: MEMORYTYPE_DEVICE,
            device: ctx.device,
            base: start,
            size,
            buffer_id: 0,
            ipc_capable: false,
            mapped: None,
        }));
    }
    let Ok(address) = usize::try_from(ptr) else {
        return Ok(None);
    };
    if let Some((base, registered)) = crate::api::host_register::lookup(address) {
        return Ok(Some(Located {
            context: registered.context,
            memory_type: MEMORYTYPE_HOST,
            device: registered.device,
            base: base as u64,
            size: registered.size as u64,
            buffer_id: registered.buffer_id,
            ipc_capable: false,
            mapped: None,
        }));
    }
    if let Some(range) = pinned::lookup_device(ptr) {
        // A kernel's address of page-locked memory (its device mapping).
        return Ok(range.device_address.map(|device| Located {
            context: live_context(range.context),
            memory_type: MEMORYTYPE_HOST,
            device: range.device,
            base: device,
            size: range.size,
            buffer_id: range.buffer_id,
            ipc_capable: false,
            mapped: Some((range.base as u64, device)),
        }));
    }
    Ok(pinned::lookup(address).map(|range| Located {
        context: live_context(range.context),
        memory_type: MEMORYTYPE_HOST,
        device: range.device,
        base: range.base as u64,
        size: range.size,
        buffer_id: range.buffer_id,
        ipc_capable: false,
        mapped: range
            .device_address
            .map(|device| (range.base as u64, device)),
    }))
}

/// `context` while that context lives, else 0.
fn live_context(context: usize) -> usize {
    let alive = CONTEXTS
        .get(context as *mut c_void)
        .is_some_and(|c| c.is_alive());
    if alive {
        context
    } else {
        0
    }
}

/// The value of `attribute` for `ptr` in `memory`. `lenient` is the
/// `cuPointerGetAttributes` form: what does not exist reads as zero (NULL)
/// instead of failing.
fn value(
    attribute: c_int,
    ptr: CUdeviceptr,
    memory: Option<&Located>,
    lenient: bool,
) -> Result<Value, u32> {
    let Some(m) = memory else {
        if !lenient {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        return zero(attribute);
    };
    let host = m.memory_type == MEMORYTYPE_HOST;
    let absent = |zero: Value| {
        if lenient {
            Ok(zero)
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    };
    Ok(match attribute {
        CONTEXT => Value::Pointer(m.context),
        MEMORY_TYPE => Value::Uint(m.memory_type),
        DEVICE_POINTER if host => match m.mapped {
            Some((_, device)) => Value::U64(device + (ptr - m.base)),
            None => return absent(Value::U64(0)),
        },
        DEVICE_POINTER => Value::U64(ptr),
        HOST_POINTER if host => {
            let host_address = m.mapped.map_or(ptr, |(host, _)| host + (ptr - m.base));
            Value::Pointer(usize::try_from(host_address).unwrap_or(0))
        }
        HOST_POINTER => return absent(Value::Pointer(0)),
        P2P_TOKENS => return Err(CUDA_ERROR_NOT_SUPPORTED),
        // rgpu's synchronous copies always wait for the host.
        SYNC_MEMOPS => Value::Bool(true),
        BUFFER_ID | MEMORY_BLOCK_ID => Value::U64(m.buffer_id),
        IS_LEGACY_CUDA_IPC_CAPABLE => Value::Bool(m.ipc_capable),
        IS_MANAGED | IS_HW_DECOMPRESS_CAPABLE => Value::Bool(false),
        DEVICE_ORDINAL => Value::Int(m.device),
        RANGE_START_ADDR | MAPPING_BASE_ADDR => Value::U64(m.base),
        RANGE_SIZE | MAPPING_SIZE => Value::Size(usize::try_from(m.size).unwrap_or(usize::MAX)),
        MAPPED => Value::Bool(true),
        ALLOWED_HANDLE_TYPES | IS_GPU_DIRECT_RDMA_CAPABLE => Value::Uint(0),
        ACCESS_FLAGS => Value::Uint(ACCESS_READWRITE),
        MEMPOOL_HANDLE => Value::Pointer(0),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// What `cuPointerGetAttributes` reports for memory CUDA does not know.
fn zero(attribute: c_int) -> Result<Value, u32> {
    Ok(match attribute {
        CONTEXT | HOST_POINTER | MEMPOOL_HANDLE => Value::Pointer(0),
        MEMORY_TYPE | ALLOWED_HANDLE_TYPES | IS_GPU_DIRECT_RDMA_CAPABLE | ACCESS_FLAGS => {
            Value::Uint(0)
        }
        DEVICE_POINTER | BUFFER_ID | RANGE_START_ADDR | MAPPING_BASE_ADDR | MEMORY_BLOCK_ID => {
            Value::U64(0)
        }
        RANGE_SIZE | MAPPING_SIZE => Value::Size(0),
        SYNC_MEMOPS
        | IS_MANAGED
        | IS_LEGACY_CUDA_IPC_CAPABLE
        | MAPPED
        | IS_HW_DECOMPRESS_CAPABLE => Value::Bool(false),
        DEVICE_ORDINAL => Value::Int(UNKNOWN_DEVICE),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// Stores `value` at `data` in its own width.
fn store(data: *mut c_void, value: Value) -> Result<(), u32> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes `data` point to writable
    // storage of the attribute's type. Unaligned writes: a C caller may
    // hand a byte buffer.
    unsafe {
        match value {
            Value::Pointer(v) | Value::Size(v) => data.cast::<usize>().write_unaligned(v),
            Value::Uint(v) => data.cast::<c_uint>().write_unaligned(v),
            Value::Int(v) => data.cast::<c_int>().write_unaligned(v),
            Value::U64(v) => data.cast::<u64>().write_unaligned(v),
            Value::Bool(v) => data.cast::<u8>().write(u8::from(v)),
        }
    }
    Ok(())
}

pub(crate) fn get_attribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> Result<(), u32> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let memory = locate(ptr)?;
    store(data, value(attribute, ptr, memory.as_ref(), false)?)
}

pub(crate) fn get_attributes(
    count: c_uint,
    attributes: *const c_int,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> Result<(), u32> {
    if count == 0 {
        driver()?;
        return Ok(());
    }
    if attributes.is_null() || data.is_null() || count > MAX_ATTRIBUTES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, at most MAX_ATTRIBUTES; the API contract makes both
    // arrays `count` elements long for the duration of the call.
    let (attributes, data) = unsafe {
        (
            std::slice::from_raw_parts(attributes, count as usize),
            std::slice::from_raw_parts(data, count as usize),
        )
    };
    let memory = locate(ptr)?;
    // Every value is computed before any is stored: a bad attribute leaves
    // the caller's storage untouched.
    let values = attributes
        .iter()
        .map(|a| value(*a, ptr, memory.as_ref(), true))
        .collect::<Result<Vec<_>, u32>>()?;
    for (slot, v) in data.iter().zip(values) {
        store(*slot, v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICE: Located = Located {
        context: 0x1000,
        memory_type: MEMORYTYPE_DEVICE,
        device: 0,
        base: 0x7f00_0000_0000,
        size: 4096,
        buffer_id: 9,
        ipc_capable: true,
        mapped: None,
    };

    /// Page-locked memory at 0x5000_0000 that kernels reach at
    /// 0x7e00_0000_0000, located by its device address.
    const MAPPED: Located = Located {
        context: 0x1000,
        memory_type: MEMORYTYPE_HOST,
        device: 0,
        base: 0x7e00_0000_0000,
        size: 4096,
        buffer_id: 3,
        ipc_capable: false,
        mapped: Some((0x5000_0000, 0x7e00_0000_0000)),
    };

    #[test]
    fn mapped_host_memory_answers_both_its_addresses() {
        let inside = MAPPED.base + 64;
        let v = |a| value(a, inside, Some(&MAPPED), false);
        assert_eq!(v(MEMORY_TYPE), Ok(Value::Uint(MEMORYTYPE_HOST)));
        assert_eq!(v(DEVICE_POINTER), Ok(Value::U64(inside)));
        assert_eq!(v(HOST_POINTER), Ok(Value::Pointer(0x5000_0040)));
        assert_eq!(v(DEVICE_ORDINAL), Ok(Value::Int(0)));
    }

    #[test]
    fn device_memory_has_a_device_pointer_and_no_host_pointer() {
        let inside = DEVICE.base + 100;
        let v = |a| value(a, inside, Some(&DEVICE), false);
        assert_eq!(v(MEMORY_TYPE), Ok(Value::Uint(MEMORYTYPE_DEVICE)));
        assert_eq!(v(DEVICE_POINTER), Ok(Value::U64(inside)));
        assert_eq!(v(HOST_POINTER), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(v(RANGE_START_ADDR), Ok(Value::U64(DEVICE.base)));
        assert_eq!(v(RANGE_SIZE), Ok(Value::Size(4096)));
        assert_eq!(v(BUFFER_ID), Ok(Value::U64(9)));
        assert_eq!(v(IS_MANAGED), Ok(Value::Bool(false)));
        assert_eq!(v(IS_LEGACY_CUDA_IPC_CAPABLE), Ok(Value::Bool(true)));
        assert_eq!(v(CONTEXT), Ok(Value::Pointer(0x1000)));
        assert_eq!(v(P2P_TOKENS), Err(CUDA_ERROR_NOT_SUPPORTED));
        assert_eq!(v(99), Err(CUDA_ERROR_INVALID_VALUE));
        // The lenient form reads what does not exist as NULL.
        assert_eq!(
            value(HOST_POINTER, inside, Some(&DEVICE), true),
            Ok(Value::Pointer(0))
        );
    }

    #[test]
    fn unknown_memory_fails_alone_and_reads_as_zero_in_a_list() {
        assert_eq!(
            value(MEMORY_TYPE, 0x1234, None, false),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(value(MEMORY_TYPE, 0x1234, None, true), Ok(Value::Uint(0)));
        assert_eq!(
            value(DEVICE_ORDINAL, 0x1234, None, true),
            Ok(Value::Int(UNKNOWN_DEVICE))
        );
        assert_eq!(
            value(IS_MANAGED, 0x1234, None, true),
            Ok(Value::Bool(false))
        );
    }

    #[test]
    fn values_are_stored_in_their_own_width() {
        let mut buffer = [0xaau8; 16];
        store(buffer.as_mut_ptr().cast(), Value::Bool(true)).unwrap();
        assert_eq!(buffer[..2], [1, 0xaa]);
        store(buffer.as_mut_ptr().cast(), Value::Uint(2)).unwrap();
        assert_eq!(buffer[..5], [2, 0, 0, 0, 0xaa]);
        store(
            buffer.as_mut_ptr().wrapping_add(1).cast(),
            Value::U64(u64::MAX),
        )
        .unwrap();
        assert_eq!(
            buffer[..10],
            [2, 255, 255, 255, 255, 255, 255, 255, 255, 0xaa]
        );
        assert_eq!(
            store(std::ptr::null_mut(), Value::Int(1)),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn calls_before_init_fail_cleanly() {
        let mut v = 0u32;
        assert_eq!(
            get_attribute((&mut v as *mut u32).cast(), MEMORY_TYPE, 0x1000),
            Err(CUDA_ERROR_NOT_INITIALIZED)
        );
    }
}

//! Page-locked host memory (`cuMemAllocHost`, `cuMemHostAlloc`): blob
//! memory the host sees too, so copies from and to it are zero-copy. A
//! sorted registry maps pointers back to `(resource id, offset)`. Over the
//! network carrier nothing is shared: the memory is this process's own, and
//! copies from and to it travel on the connection as pageable ones do. A
//! blob lives on the carrier of the context that allocated it: contexts of
//! other carriers (`RGPU_DEVICES`) stage copies from and to it likewise.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rgpu_proto::cuda_result::*;
use rgpu_proto::BlobRange;
use rgpu_transport::Carrier;

use crate::transport_error::carrier_error;

struct PinnedBlock {
    size: u64,
    /// The blob; 0 for memory of this process only (network carrier).
    resource_id: u32,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`.
    buffer_id: u64,
    /// The context that allocated it (its `CUcontext` value) and its device.
    context: usize,
    device: i32,
    /// The carrier the blob is on (the allocating context's address space).
    space: usize,
    /// The virtio-gpu contexts of that carrier the blob is attached to; the
    /// first created it.
    attached: Mutex<Vec<u32>>,
    /// Where kernels reach its start (`cuMemHostGetDevicePointer`), once
    /// the host said.
    device_address: OnceLock<u64>,
}

static PINNED: RwLock<BTreeMap<usize, Arc<PinnedBlock>>> = RwLock::new(BTreeMap::new());

/// The blocks whose device address the host said, by that address: their
/// host address (a key of [`PINNED`]).
static DEVICE_MAPPED: RwLock<BTreeMap<u64, usize>> = RwLock::new(BTreeMap::new());

/// The context that allocates pinned memory, as the registry keeps it (the
/// registry knows no contexts: it sits below them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    /// Its virtio-gpu context.
    pub ctx_id: u32,
    pub device: i32,
    /// Its carrier ([`crate::state::Context::space`]).
    pub space: usize,
    /// Its `CUcontext` value.
    pub context: usize,
}

/// Allocates `size` bytes of blob memory for `owner` on `carrier` (its
/// carrier) and returns its address; `buffer_id` is what pointer queries
/// report for it.
pub(crate) fn alloc(
    carrier: &dyn Carrier,
    owner: Owner,
    buffer_id: u64,
    size: u64,
) -> Result<*mut u8, u32> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let blob = if carrier.remote().is_some() {
        local_memory(size)?
    } else {
        carrier
            .create_same_address_blob(owner.ctx_id, size)
            .map_err(carrier_error)?
    };
    let block = Arc::new(PinnedBlock {
        size: blob.size.max(size),
        resource_id: blob.resource_id,
        buffer_id,
        context: owner.context,
        device: owner.device,
        space: owner.space,
        attached: Mutex::new(vec![owner.ctx_id]),
        device_address: OnceLock::new(),
    });
    PINNED
        .write()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(blob.ptr as usize, block);
    Ok(blob.ptr)
}

/// Frees memory from [`alloc`]; `ptr` must be the address it returned.
/// `carrier_of` gives the carrier of an address space.
pub(crate) fn free<'a>(
    carrier_of: impl FnOnce(usize) -> Result<&'a dyn Carrier, u32>,
    ptr: *mut u8,
) -> Result<(), u32> {
    let block = PINNED
        .write()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .remove(&(ptr as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let (Some(device), Ok(mut mapped)) = (block.device_address.get(), DEVICE_MAPPED.write()) {
        mapped.remove(device);
    }
    if block.resource_id == LOCAL {
        // SAFETY: `local_memory` mapped exactly `block.size` bytes here, and
        // the registry no longer hands the range out.
        unsafe { libc::munmap(ptr.cast(), block.size as usize) };
        return Ok(());
    }
    let owner = block.attached.lock().ok().and_then(|a| a.first().copied());
    match owner {
        Some(ctx_id) => carrier_of(block.space)?
            .destroy_blob(ctx_id, block.resource_id)
            .map_err(carrier_error),
        None => {
            // Every context it was attached to is gone, and the host freed
            // the blob with the last one.
            log::debug!(
                "rgpu: pinned blob {} outlived its contexts",
                block.resource_id
            );
            Ok(())
        }
    }
}

/// The blob range that holds `[ptr, ptr + len)` entirely, attaching the blob
/// to virtio-gpu context `ctx_id` of `carrier` (address space `space`) on
/// first use there; `None` for memory that is not pinned, or not on that
/// carrier.
pub(crate) fn blob_range(
    carrier: &dyn Carrier,
    space: usize,
    ctx_id: u32,
    ptr: usize,
    len: u64,
) -> Result<Option<BlobRange>, u32> {
    let Some((base, block)) =
        find(ptr, len).filter(|(_, b)| b.resource_id != LOCAL && b.space == space)
    else {
        return Ok(None);
    };
    {
        let mut attached = block.attached.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        if !attached.contains(&ctx_id) {
            carrier
                .attach_blob(ctx_id, block.resource_id)
                .map_err(carrier_error)?;
            attached.push(ctx_id);
        }
    }
    Ok(Some(BlobRange {
        resource_id: block.resource_id,
        offset: (ptr - base) as u64,
        length: len,
    }))
}

/// The resource id of memory that is this process's only.
const LOCAL: u32 = 0;

/// `size` bytes (rounded up to pages) of this process's own memory, as a
/// mapping without a blob.
fn local_memory(size: u64) -> Result<rgpu_transport::BlobMapping, u32> {
    let page = 4096u64;
    let rounded = size
        .checked_add(page - 1)
        .map(|s| s & !(page - 1))
        .and_then(|s| usize::try_from(s).ok())
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: a fresh anonymous mapping nobody else uses.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            rounded,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(rgpu_transport::BlobMapping {
        resource_id: LOCAL,
        ptr: ptr.cast(),
        size: rounded as u64,
    })
}

fn find(ptr: usize, len: u64) -> Option<(usize, Arc<PinnedBlock>)> {
    let map = PINNED.read().ok()?;
    let (base, block) = map.range(..=ptr).next_back()?;
    let offset = (ptr - base) as u64;
    let end = offset.checked_add(len)?;
    (end <= block.size).then(|| (*base, block.clone()))
}

/// Page-locked memory as pointer queries report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PinnedRange {
    pub base: usize,
    pub size: u64,
    pub buffer_id: u64,
    /// The allocating context's `CUcontext` value (it may be gone).
    pub context: usize,
    pub device: i32,
    /// The carrier it is on ([`Owner::space`]).
    pub space: usize,
    /// Where kernels reach `base`, if the host said.
    pub device_address: Option<u64>,
}

/// The page-locked block holding `ptr`, if any.
pub(crate) fn lookup(ptr: usize) -> Option<PinnedRange> {
    find(ptr, 1).map(|(base, block)| range_of(base, &block))
}

fn range_of(base: usize, block: &PinnedBlock) -> PinnedRange {
    PinnedRange {
        base,
        size: block.size,
        buffer_id: block.buffer_id,
        context: block.context,
        device: block.device,
        space: block.space,
        device_address: block.device_address.get().copied(),
    }
}

/// Remembers that the host maps page-locked memory at `ptr` for kernels at
/// device address `device`.
/// (The worker maps a blob once: its device address does not change.)
pub(crate) fn note_device_address(ptr: usize, device: u64) {
    let Some((base, block)) = find(ptr, 1) else {
        return;
    };
    let Some(start) = device.checked_sub((ptr - base) as u64) else {
        return;
    };
    if block.device_address.set(start).is_ok() {
        if let Ok(mut mapped) = DEVICE_MAPPED.write() {
            mapped.insert(start, base);
        }
    }
}

/// The page-locked block whose device mapping holds device address `ptr`.
pub(crate) fn lookup_device(ptr: u64) -> Option<PinnedRange> {
    let (start, base) = {
        let mapped = DEVICE_MAPPED.read().ok()?;
        let (start, base) = mapped.range(..=ptr).next_back()?;
        (*start, *base)
    };
    let map = PINNED.read().ok()?;
    let block = map.get(&base)?;
    (block.device_address.get() == Some(&start) && ptr - start < block.size)
        .then(|| range_of(base, block))
}

/// A destroyed context's blobs are detached by the host: forget them.
/// (Virtio-gpu context ids are per carrier: `space` says whose.)
pub(crate) fn forget_context(space: usize, ctx_id: u32) {
    if let Ok(map) = PINNED.read() {
        for block in map.values().filter(|b| b.space == space) {
            if let Ok(mut attached) = block.attached.lock() {
                attached.retain(|c| *c != ctx_id);
            }
        }
    }
}

//! Page-locked host memory (`cuMemAllocHost`, `cuMemHostAlloc`): blob
//! memory the host sees too, so copies from and to it are zero-copy. A
//! sorted registry maps pointers back to `(resource id, offset)`. Over the
//! network carrier nothing is shared: the memory is this process's own, and
//! copies from and to it travel on the connection as pageable ones do. A
//! blob lives on the carrier of the context that allocated it: contexts of
//! other carriers (`RGPU_DEVICES`) stage copies from and to it likewise.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

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

/// Live blocks of this process's memory only (network carrier): while
/// there are none (local and VM modes), [`host_cannot_reach`] is one load.
static PROCESS_ONLY: AtomicUsize = AtomicUsize::new(0);

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
    register(blob, owner, buffer_id, size)
}

/// Enters `blob` (`size` bytes asked) in the registry: its address.
fn register(
    blob: rgpu_transport::BlobMapping,
    owner: Owner,
    buffer_id: u64,
    size: u64,
) -> Result<*mut u8, u32> {
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
    let process_only = block.resource_id == LOCAL;
    PINNED
        .write()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(blob.ptr as usize, block);
    if process_only {
        PROCESS_ONLY.fetch_add(1, Ordering::Relaxed);
    }
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
        PROCESS_ONLY.fetch_sub(1, Ordering::Relaxed);
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

/// Whether any byte of `[ptr, ptr + len)` (a zero `len`: `ptr` itself) is
/// page-locked memory of this process only: the network carrier shares no
/// memory with the host, so no GPU and no graph reaches it, whichever
/// device address it might look like there.
pub(crate) fn host_cannot_reach(ptr: u64, len: u64) -> bool {
    if PROCESS_ONLY.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let Ok(start) = usize::try_from(ptr) else {
        return false;
    };
    let end = usize::try_from(len.max(1)).map_or(usize::MAX, |len| start.saturating_add(len));
    // A registry poisoned by a panic elsewhere is still a valid map.
    let map = PINNED.read().unwrap_or_else(PoisonError::into_inner);
    let holding = map
        .range(..=start)
        .next_back()
        .filter(|(base, block)| ((start - **base) as u64) < block.size);
    // `start + 1 <= end` always: the range below never panics.
    holding
        .into_iter()
        .chain(map.range(start.saturating_add(1)..end))
        .any(|(_, block)| block.resource_id == LOCAL)
}

/// Why the network carrier refuses a call naming this program's host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreachable {
    /// A graph node (or a copy captured into a graph) names host memory.
    Graph,
    /// Page-locked memory named as device memory (unified addressing).
    DeviceAddress,
}

/// `CUDA_ERROR_NOT_SUPPORTED` for `call`, which names host memory of this
/// program that the host never sees (network carrier); says why once per
/// call and reason, as the other unsupported paths do.
pub(crate) fn unreachable(call: &'static str, why: Unreachable) -> u32 {
    static LOGGED: Mutex<Vec<(&str, Unreachable)>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(PoisonError::into_inner);
    if !logged.contains(&(call, why)) {
        logged.push((call, why));
        match why {
            Unreachable::Graph => log::warn!(
                "rgpu: {call} naming this program's host memory is not supported over the \
                 network carrier (CUDA_ERROR_NOT_SUPPORTED): it shares no memory with the host, \
                 so a graph cannot reach the program's host memory, page-locked or not"
            ),
            Unreachable::DeviceAddress => log::warn!(
                "rgpu: {call} naming page-locked memory as device memory is not supported over \
                 the network carrier (CUDA_ERROR_NOT_SUPPORTED): it shares no memory with the \
                 host, so page-locked memory has no device address there"
            ),
        }
    }
    CUDA_ERROR_NOT_SUPPORTED
}

/// `CUDA_ERROR_NOT_SUPPORTED` (said once, [`unreachable`]) when
/// `[ptr, ptr + len)`, named by `call` as device memory, holds page-locked
/// memory of this process only; checked before the device ranges, whose
/// addresses are another machine's and might coincide.
pub(crate) fn refuse_as_device(call: &'static str, ptr: u64, len: u64) -> Result<(), u32> {
    if host_cannot_reach(ptr, len) {
        return Err(unreachable(call, Unreachable::DeviceAddress));
    }
    Ok(())
}

/// Whether `[ptr, ptr + len)` lies within one block of page-locked memory
/// of this process only (network carrier): memory the program may fill
/// itself, as no GPU work of the host's can reach it.
pub(crate) fn is_process_only(ptr: u64, len: u64) -> bool {
    usize::try_from(ptr)
        .ok()
        .and_then(|start| find(start, len))
        .is_some_and(|(_, block)| block.resource_id == LOCAL)
}

/// Whether `[ptr, ptr + len)`, named by `call` as device memory, is
/// page-locked memory of this process only (network carrier): the
/// program's own bytes, which it copies or fills itself, as nothing the
/// host runs reaches them (copies into them end before their call
/// returns, host functions run in their call). Partly so:
/// `CUDA_ERROR_NOT_SUPPORTED`, said once.
pub(crate) fn process_only_as_device(call: &'static str, ptr: u64, len: u64) -> Result<bool, u32> {
    if !host_cannot_reach(ptr, len) {
        return Ok(false);
    }
    if is_process_only(ptr, len) {
        return Ok(true);
    }
    Err(unreachable(call, Unreachable::DeviceAddress))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_process_memory_is_out_of_the_hosts_reach() {
        let owner = Owner {
            ctx_id: 1,
            device: 0,
            space: 0,
            context: 0,
        };
        let blob = local_memory(8192).unwrap();
        let ptr = register(blob, owner, 1, 8192).unwrap();
        let base = ptr as u64;
        assert!(host_cannot_reach(base, 4));
        assert!(
            host_cannot_reach(base + 8191, 0),
            "a zero length asks for the byte"
        );
        assert!(
            host_cannot_reach(base - 16, 32),
            "a range running into the block"
        );
        assert!(host_cannot_reach(base - 16, u64::MAX), "lengths saturate");
        assert!(!host_cannot_reach(base - 16, 16), "the bytes just before");
        assert!(!host_cannot_reach(base + 8192, 4), "the bytes just after");
        assert!(matches!(
            refuse_as_device("test", base + 4, 4),
            Err(CUDA_ERROR_NOT_SUPPORTED)
        ));
        free(|_| Err(CUDA_ERROR_INVALID_VALUE), ptr).unwrap();
        assert!(!host_cannot_reach(base, 4), "freed");
        assert_eq!(refuse_as_device("test", base, 4), Ok(()));
    }
}

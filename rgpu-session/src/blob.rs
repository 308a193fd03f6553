//! Guest blobs (`RESOURCE_CREATE_BLOB` with `BLOB_MEM_GUEST`): a list of
//! guest-physical ranges, resolved once into host mappings.
//!
//! Interface used by the device model:
//! - `Blob::new(resource_id, size, &entries, &AtomicGuestMemory) -> Result<Blob, BlobError>`
//!   checks that the entries cover exactly `size` bytes and that each lies
//!   inside one guest memory region, resolves them to host addresses and
//!   coalesces adjacent ones into runs, and keeps the memory mapping alive;
//! - `Blob::resource_id()`, `Blob::size()`, `Blob::runs()`;
//! - `Blob::host_runs(offset, len)`: the host pieces of a byte range;
//! - `Blob::read(offset, &mut buf)`, `Blob::write(offset, &buf)`: volatile
//!   copies across runs;
//! - `Blob::atomic_u64(offset)`, `Blob::atomic_u32(offset)`: the channel's
//!   shared counters; `Blob::shared_word(&blob, offset)` one of them checked
//!   once and held (read in the worker's spin loop and after every command).
//!
//! The guest may write its memory at any time, concurrently with the host:
//! bytes are copied out (volatile) before they are decoded, and the only Rust
//! references into guest memory are atomics.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

use rgpu_executor::HostRun;
use rgpu_proto::virtio_gpu::MemEntry;
use vm_memory::{
    GuestAddress, GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion, VolatileSlice,
};

use crate::{AtomicGuestMemory, GuestMemory};

/// Why a blob cannot be created or a range of it cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    #[error("blob size is zero")]
    ZeroSize,
    #[error("blob entries cover {covered} bytes, blob size is {size}")]
    SizeMismatch { covered: u64, size: u64 },
    #[error(
        "blob entry at guest address {addr:#x} (+{length}) is not inside one guest memory region"
    )]
    EntryOutsideMemory { addr: u64, length: u32 },
    #[error("guest memory at {addr:#x} has no host mapping")]
    NoHostAddress { addr: u64 },
    #[error("range {offset}+{length} outside blob of {size} bytes")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("offset {offset} not aligned or not inside one run for a {width}-byte atomic")]
    BadAtomic { offset: u64, width: u64 },
}

/// A guest blob resolved into host runs.
pub struct Blob {
    resource_id: u32,
    size: u64,
    runs: Vec<HostRun>,
    /// Blob offset at which each run starts (same index as `runs`).
    starts: Vec<u64>,
    /// Keeps every run's mapping alive as long as the blob.
    _mapping: Arc<dyn Send + Sync>,
    /// Registers the memory for DMA when a copy first needs it (`None`: it
    /// never is, and the driver stages copies).
    dma: Option<Arc<dyn DmaRegistration>>,
}

/// Memory that can be registered with the driver for DMA. Registration
/// waits for the first copy that needs it: registering opens the process's
/// primary context, which a process that never copies (NVML alone) must not
/// pay for.
pub trait DmaRegistration: Send + Sync {
    /// Whether copies may DMA from and to it, registering it on the first
    /// call.
    fn dma_registered(&self) -> bool;
}

// SAFETY: the raw pointers in `runs` point into the guest memory mapping that
// `memory` keeps alive; the blob never hands out references to those bytes
// other than atomics, and copies through them are volatile, so sharing and
// sending the blob between threads is sound.
unsafe impl Send for Blob {}
// SAFETY: see `Send`; no method takes `&mut self`.
unsafe impl Sync for Blob {}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blob")
            .field("resource_id", &self.resource_id)
            .field("size", &self.size)
            .field("runs", &self.runs.len())
            .finish()
    }
}

/// An aligned atomic word of a blob (`AtomicU64` unless named), shared with
/// the guest, whose bounds were checked once ([`Blob::shared_word`],
/// [`Blob::shared_word32`]).
#[derive(Debug)]
pub struct SharedWord<A = AtomicU64> {
    word: std::ptr::NonNull<A>,
    /// Keeps the mapping that `word` points into alive.
    _blob: Arc<Blob>,
}

// SAFETY: `word` points into guest memory that the held `Arc<Blob>` keeps
// mapped; it is only used as an atomic (`AtomicU64` or `AtomicU32`, the
// only types built), which any thread may access.
unsafe impl<A: Sync> Send for SharedWord<A> {}
// SAFETY: as for `Send`: shared access goes through atomic operations only.
unsafe impl<A: Sync> Sync for SharedWord<A> {}

impl<A> Clone for SharedWord<A> {
    fn clone(&self) -> Self {
        SharedWord {
            word: self.word,
            _blob: Arc::clone(&self._blob),
        }
    }
}

impl<A> std::ops::Deref for SharedWord<A> {
    type Target = A;

    fn deref(&self) -> &A {
        // SAFETY: checked in bounds and aligned by `Blob::atomic_u64` or
        // `Blob::atomic_u32`, and the mapping lives as long as `self` (it
        // holds the blob).
        unsafe { self.word.as_ref() }
    }
}

impl Blob {
    pub fn new(
        resource_id: u32,
        size: u64,
        entries: &[MemEntry],
        memory: &AtomicGuestMemory,
    ) -> Result<Blob, BlobError> {
        if size == 0 {
            return Err(BlobError::ZeroSize);
        }
        let memory = memory.memory().into_inner();
        let mut runs: Vec<HostRun> = Vec::new();
        let mut starts = Vec::new();
        let mut covered: u64 = 0;
        for entry in entries.iter().filter(|e| e.length > 0) {
            let host = resolve(&memory, entry)?;
            covered = covered
                .checked_add(entry.length.into())
                .filter(|c| *c <= size)
                .ok_or(BlobError::SizeMismatch {
                    covered: covered.saturating_add(entry.length.into()),
                    size,
                })?;
            let len = entry.length as usize;
            match runs.last_mut() {
                Some(last) if (last.ptr as usize).checked_add(last.len) == Some(host as usize) => {
                    last.len += len;
                }
                _ => {
                    starts.push(covered - u64::from(entry.length));
                    runs.push(HostRun { ptr: host, len });
                }
            }
        }
        if covered != size {
            return Err(BlobError::SizeMismatch { covered, size });
        }
        Ok(Blob {
            resource_id,
            size,
            runs,
            starts,
            _mapping: memory,
            dma: None,
        })
    }

    /// A blob that is one host mapping of `run.len` bytes (a worker process
    /// maps each blob's guest pages contiguously), kept mapped by `mapping`
    /// as long as the blob lives and registered by it for DMA on first need.
    pub fn from_mapping<M: DmaRegistration + 'static>(
        resource_id: u32,
        run: HostRun,
        mapping: Arc<M>,
    ) -> Result<Blob, BlobError> {
        if run.len == 0 {
            return Err(BlobError::ZeroSize);
        }
        Ok(Blob {
            resource_id,
            size: run.len as u64,
            runs: vec![run],
            starts: vec![0],
            _mapping: mapping.clone(),
            dma: Some(mapping),
        })
    }

    pub fn resource_id(&self) -> u32 {
        self.resource_id
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The blob's host runs, in blob order, adjacent ones coalesced.
    pub fn runs(&self) -> &[HostRun] {
        &self.runs
    }

    /// Whether copies may DMA from and to the blob (registering it with the
    /// driver on first ask).
    pub fn dma_registered(&self) -> bool {
        self.dma.as_ref().is_some_and(|dma| dma.dma_registered())
    }

    /// The host pieces of `offset..offset + len`, in order. An empty range
    /// inside the blob gives no pieces.
    pub fn host_runs(&self, offset: u64, len: u64) -> Result<Vec<HostRun>, BlobError> {
        let mut out = Vec::new();
        self.for_each_piece(offset, len, |run| {
            out.push(run);
        })?;
        Ok(out)
    }

    /// Copies `buf.len()` bytes at `offset` out of the blob.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlobError> {
        let mut done = 0usize;
        self.for_each_piece(offset, buf.len() as u64, |run| {
            if let Some(dst) = buf.get_mut(done..done + run.len) {
                // SAFETY: `run` lies inside a mapping kept alive by `self`;
                // every access to guest memory here is volatile.
                let slice = unsafe { VolatileSlice::new(run.ptr, run.len) };
                slice.copy_to(dst);
            }
            done += run.len;
        })
    }

    /// Copies `buf` into the blob at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlobError> {
        let mut done = 0usize;
        self.for_each_piece(offset, buf.len() as u64, |run| {
            if let Some(src) = buf.get(done..done + run.len) {
                // SAFETY: as in `read`.
                let slice = unsafe { VolatileSlice::new(run.ptr, run.len) };
                slice.copy_from(src);
            }
            done += run.len;
        })
    }

    /// The `u64` at `offset`, shared with the guest.
    pub fn atomic_u64(&self, offset: u64) -> Result<&AtomicU64, BlobError> {
        let ptr = self.atomic_ptr(offset, 8)?;
        // SAFETY: `ptr` is 8-byte aligned, 8 bytes inside one run of a mapping
        // kept alive as long as `self`; the guest only accesses it atomically
        // by protocol, and a hostile guest writing it otherwise can only
        // change the value we read.
        Ok(unsafe { &*(ptr as *const AtomicU64) })
    }

    /// The `u32` at `offset`, shared with the guest.
    pub fn atomic_u32(&self, offset: u64) -> Result<&AtomicU32, BlobError> {
        let ptr = self.atomic_ptr(offset, 4)?;
        // SAFETY: as in `atomic_u64`, with 4-byte alignment and size.
        Ok(unsafe { &*(ptr as *const AtomicU32) })
    }

    /// The `u64` at `offset`, checked now and held with the blob.
    pub fn shared_word(blob: &Arc<Blob>, offset: u64) -> Result<SharedWord, BlobError> {
        let word = std::ptr::NonNull::from(blob.atomic_u64(offset)?);
        Ok(SharedWord {
            word,
            _blob: Arc::clone(blob),
        })
    }

    /// The `u32` at `offset`, checked now and held with the blob.
    pub fn shared_word32(
        blob: &Arc<Blob>,
        offset: u64,
    ) -> Result<SharedWord<AtomicU32>, BlobError> {
        let word = std::ptr::NonNull::from(blob.atomic_u32(offset)?);
        Ok(SharedWord {
            word,
            _blob: Arc::clone(blob),
        })
    }

    fn atomic_ptr(&self, offset: u64, width: u64) -> Result<*mut u8, BlobError> {
        // Called in the worker's spin loop: no allocation here.
        let mut pieces = 0usize;
        let mut first = None;
        self.for_each_piece(offset, width, |run| {
            pieces += 1;
            first.get_or_insert(run);
        })?;
        match first {
            Some(run)
                if pieces == 1
                    && run.len as u64 == width
                    && (run.ptr as usize) & (width as usize - 1) == 0 =>
            {
                Ok(run.ptr)
            }
            _ => Err(BlobError::BadAtomic { offset, width }),
        }
    }

    /// Calls `f` with each host piece of `offset..offset + len`, in order,
    /// after checking the whole range.
    fn for_each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(HostRun),
    ) -> Result<(), BlobError> {
        let out_of_range = BlobError::OutOfRange {
            offset,
            length: len,
            size: self.size,
        };
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= self.size)
            .ok_or(out_of_range)?;
        if len == 0 {
            return Ok(());
        }
        // The run holding `offset`: the last one starting at or before it.
        let first = self
            .starts
            .partition_point(|s| *s <= offset)
            .saturating_sub(1);
        let mut pos = offset;
        for (run, start) in self.runs.iter().zip(&self.starts).skip(first) {
            if pos >= end {
                break;
            }
            let skip = pos - start;
            let take = (run.len as u64 - skip).min(end - pos);
            f(HostRun {
                // `skip` < run.len, so the pointer stays inside the run.
                ptr: run.ptr.wrapping_add(skip as usize),
                len: take as usize,
            });
            pos += take;
        }
        Ok(())
    }
}

/// Host address of a whole entry, which must lie in one region.
fn resolve(memory: &GuestMemory, entry: &MemEntry) -> Result<*mut u8, BlobError> {
    let outside = BlobError::EntryOutsideMemory {
        addr: entry.addr,
        length: entry.length,
    };
    let start = GuestAddress(entry.addr);
    let last = entry
        .addr
        .checked_add(u64::from(entry.length) - 1)
        .ok_or(outside.clone())?;
    let region = memory.find_region(start).ok_or(outside.clone())?;
    if last > region.last_addr().0 {
        return Err(outside);
    }
    let region_addr = region.to_region_addr(start).ok_or(outside)?;
    region
        .get_host_address(region_addr)
        .map_err(|_| BlobError::NoHostAddress { addr: entry.addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> AtomicGuestMemory {
        let mem = GuestMemory::from_ranges(&[
            (GuestAddress(0), 0x10000),
            (GuestAddress(0x100000), 0x10000),
        ])
        .unwrap_or_else(|e| panic!("guest memory: {e}"));
        AtomicGuestMemory::new(mem)
    }

    fn entry(addr: u64, length: u32) -> MemEntry {
        MemEntry { addr, length }
    }

    #[test]
    fn coalesces_adjacent_entries_and_copies_across_runs() {
        let mem = memory();
        let entries = [
            entry(0x1000, 0x1000),
            entry(0x2000, 0x1000),
            entry(0x100000, 0x1000),
            entry(0x5000, 0x1000),
        ];
        let blob = Blob::new(7, 0x4000, &entries, &mem).unwrap();
        assert_eq!(blob.resource_id(), 7);
        assert_eq!(blob.size(), 0x4000);
        let lens: Vec<usize> = blob.runs().iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![0x2000, 0x1000, 0x1000]);

        let data: Vec<u8> = (0..0x3000u32).map(|i| (i % 251) as u8).collect();
        blob.write(0x800, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        blob.read(0x800, &mut back).unwrap();
        assert_eq!(back, data);

        let pieces = blob.host_runs(0x1800, 0x1000).unwrap();
        let lens: Vec<usize> = pieces.iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![0x800, 0x800]);
        assert!(blob.host_runs(0x3fff, 2).is_err());
        assert!(blob.host_runs(u64::MAX, 2).is_err());
        assert!(blob.host_runs(0x4000, 0).unwrap().is_empty());
        assert!(blob.read(0x3000, &mut [0u8; 0x1001]).is_err());
    }

    #[test]
    fn atomics_need_alignment_and_one_run() {
        let mem = memory();
        let blob = Blob::new(
            1,
            0x2000,
            &[entry(0x1000, 0x1000), entry(0x100000, 0x1000)],
            &mem,
        )
        .unwrap();
        let a = blob.atomic_u64(0x40).unwrap();
        a.store(0x1122_3344_5566_7788, std::sync::atomic::Ordering::SeqCst);
        let mut raw = [0u8; 8];
        blob.read(0x40, &mut raw).unwrap();
        assert_eq!(u64::from_le_bytes(raw), 0x1122_3344_5566_7788);
        assert!(blob.atomic_u64(0x44).is_err());
        assert!(blob.atomic_u32(0x44).is_ok());
        assert!(blob.atomic_u64(0x1ffc).is_err());
        assert!(blob.atomic_u64(0x2000).is_err());
    }

    #[test]
    fn rejects_bad_entries() {
        let mem = memory();
        assert_eq!(Blob::new(1, 0, &[], &mem).unwrap_err(), BlobError::ZeroSize);
        assert!(matches!(
            Blob::new(1, 0x2000, &[entry(0x1000, 0x1000)], &mem),
            Err(BlobError::SizeMismatch { .. })
        ));
        assert!(matches!(
            Blob::new(
                1,
                0x1000,
                &[entry(0x1000, 0x1000), entry(0x2000, 0x1000)],
                &mem
            ),
            Err(BlobError::SizeMismatch { .. })
        ));
        // Crosses the end of the first region.
        assert!(matches!(
            Blob::new(1, 0x1000, &[entry(0xf800, 0x1000)], &mem),
            Err(BlobError::EntryOutsideMemory { .. })
        ));
        // In the hole between regions.
        assert!(matches!(
            Blob::new(1, 0x1000, &[entry(0x20000, 0x1000)], &mem),
            Err(BlobError::EntryOutsideMemory { .. })
        ));
        assert!(matches!(
            Blob::new(1, 0x1000, &[entry(u64::MAX - 10, 0x1000)], &mem),
            Err(BlobError::EntryOutsideMemory { .. })
        ));
    }
}

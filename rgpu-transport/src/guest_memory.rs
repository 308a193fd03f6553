//! Guest memory of the local carrier: one memfd shared with the daemon, and
//! an allocator of page-aligned ranges in it (vrings, channel blobs, pinned
//! host memory).
//!
//! The "guest-physical address" of a byte is its offset in the memfd; the
//! daemon maps the same file (SET_MEM_TABLE) and translates the same way.
//! Allocations are not zeroed: users that need zeros write them.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::Mutex;

use thiserror::Error;

/// Every allocation starts on a page.
pub const PAGE_SIZE: u64 = 4096;
/// Allocations of at least this size start on a huge-page boundary, so the
/// host can map them with large pages.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// Size used when `RGPU_LOCAL_MEMORY_MB` is not set.
pub const DEFAULT_MEMORY_MB: u64 = 4096;
/// Where the memory is mapped when that range is free (a hint). A worker
/// maps page-locked blobs at the process's own address of them (unified
/// addressing), which works only where its own address space is free;
/// left to the kernel, both processes' mappings sit below their randomised
/// `mmap` bases and a 4 GiB mapping now and then overlapped the worker's
/// libraries (`killed_standby_is_replaced_while_a_client_runs` failed
/// once so). Far below those bases and above any program's heap, this
/// range is empty in a fresh worker.
pub const ADDRESS_HINT: usize = 0x3000_0000_0000;

#[derive(Debug, Error)]
pub enum GuestMemoryError {
    #[error("cannot create {size} bytes of guest memory: {source}")]
    Create { size: u64, source: std::io::Error },
    #[error("out of guest memory for {0} bytes")]
    OutOfMemory(u64),
    #[error("guest address {0:#x} is not the start of an allocation")]
    NotAllocated(u64),
}

/// First-fit allocator of address ranges with coalescing of free neighbours.
#[derive(Debug)]
pub struct RangeAllocator {
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
    /// Allocated ranges: start -> length.
    used: HashMap<u64, u64>,
}

const fn align_up(value: u64, align: u64) -> Option<u64> {
    match value.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

impl RangeAllocator {
    pub fn new(size: u64) -> Self {
        let mut free = BTreeMap::new();
        let size = size & !(PAGE_SIZE - 1);
        if size > 0 {
            free.insert(0, size);
        }
        Self {
            free,
            used: HashMap::new(),
        }
    }

    /// Allocates `size` bytes (rounded up to pages); returns the start.
    pub fn alloc(&mut self, size: u64) -> Result<u64, GuestMemoryError> {
        let length = align_up(size.max(1), PAGE_SIZE).ok_or(GuestMemoryError::OutOfMemory(size))?;
        let align = if length >= HUGE_PAGE_SIZE {
            HUGE_PAGE_SIZE
        } else {
            PAGE_SIZE
        };
        let found = self.free.iter().find_map(|(&start, &len)| {
            let aligned = align_up(start, align)?;
            let end = aligned.checked_add(length)?;
            (end <= start + len).then_some((start, len, aligned))
        });
        let (start, len, aligned) = found.ok_or(GuestMemoryError::OutOfMemory(size))?;
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned - start);
        }
        let tail = start + len - (aligned + length);
        if tail > 0 {
            self.free.insert(aligned + length, tail);
        }
        self.used.insert(aligned, length);
        Ok(aligned)
    }

    /// Frees the allocation starting at `start`; returns its length.
    pub fn free(&mut self, start: u64) -> Result<u64, GuestMemoryError> {
        let length = self
            .used
            .remove(&start)
            .ok_or(GuestMemoryError::NotAllocated(start))?;
        let mut new_start = start;
        let mut new_len = length;
        if let Some((&prev_start, &prev_len)) = self.free.range(..start).next_back() {
            if prev_start + prev_len == start {
                self.free.remove(&prev_start);
                new_start = prev_start;
                new_len += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(start + length)) {
            new_len += next_len;
        }
        self.free.insert(new_start, new_len);
        Ok(length)
    }

    /// Length of the allocation starting at `start`.
    pub fn allocation_len(&self, start: u64) -> Option<u64> {
        self.used.get(&start).copied()
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Number of separate free ranges (tests check coalescing with it).
    pub fn free_ranges(&self) -> usize {
        self.free.len()
    }
}

/// The memfd, its mapping in this process, and the allocator.
#[derive(Debug)]
pub struct GuestMemory {
    file: File,
    base: *mut u8,
    size: u64,
    allocator: Mutex<RangeAllocator>,
}

// SAFETY: the mapping is shared memory owned by this object for its whole
// life; the raw pointer is only an address, and the allocator is behind a
// mutex.
unsafe impl Send for GuestMemory {}
// SAFETY: as above.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    /// Creates a sparse memfd of `size` bytes (rounded up to pages) and maps
    /// it shared.
    pub fn new(size: u64) -> Result<Self, GuestMemoryError> {
        let create_err = |source| GuestMemoryError::Create { size, source };
        let size = align_up(size.max(PAGE_SIZE), PAGE_SIZE)
            .ok_or_else(|| create_err(std::io::ErrorKind::InvalidInput.into()))?;
        let length = usize::try_from(size)
            .map_err(|_| create_err(std::io::ErrorKind::InvalidInput.into()))?;
        let file_len = libc::off_t::try_from(size)
            .map_err(|_| create_err(std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: the name is a NUL-terminated literal; the flags are valid.
        let fd = unsafe { libc::memfd_create(c"rgpu-guest-memory".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(create_err(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::ftruncate(file.as_raw_fd(), file_len) } != 0 {
            return Err(create_err(std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh shared mapping of the whole file; no existing
        // memory is affected (the address is a hint, never MAP_FIXED).
        let base = unsafe {
            libc::mmap(
                std::ptr::without_provenance_mut(ADDRESS_HINT),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(create_err(std::io::Error::last_os_error()));
        }
        log::debug!("guest memory: {size} bytes at {base:p}");
        Ok(Self {
            file,
            base: base.cast(),
            size,
            allocator: Mutex::new(RangeAllocator::new(size)),
        })
    }

    /// Size from `RGPU_LOCAL_MEMORY_MB` (default 4096 MiB).
    pub fn from_env() -> Result<Self, GuestMemoryError> {
        let mb = match std::env::var("RGPU_LOCAL_MEMORY_MB") {
            Ok(value) => value.trim().parse::<u64>().unwrap_or_else(|_| {
                log::warn!(
                    "RGPU_LOCAL_MEMORY_MB={value:?} is not a number; using {DEFAULT_MEMORY_MB}"
                );
                DEFAULT_MEMORY_MB
            }),
            Err(_) => DEFAULT_MEMORY_MB,
        };
        Self::new(mb.saturating_mul(1 << 20))
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The start of the mapping in this process.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Allocates `size` bytes; returns the guest address and where it is
    /// mapped here. The memory holds whatever its last user left.
    pub fn alloc(&self, size: u64) -> Result<(u64, *mut u8), GuestMemoryError> {
        let gpa = self.lock().alloc(size)?;
        // SAFETY: the allocator only hands out ranges inside the mapping.
        Ok((gpa, unsafe { self.base.add(gpa as usize) }))
    }

    /// Frees an allocation by its guest address.
    pub fn free(&self, gpa: u64) -> Result<(), GuestMemoryError> {
        self.lock().free(gpa).map(|_| ())
    }

    /// Where `len` bytes at `gpa` are mapped here, if they are inside.
    pub fn host_ptr(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let end = gpa.checked_add(len)?;
        if end > self.size {
            return None;
        }
        // SAFETY: checked to be inside the mapping just above.
        Some(unsafe { self.base.add(gpa as usize) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RangeAllocator> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way that matters more than failing every later call would.
        self.allocator.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; nothing
        // borrowed from it outlives `self`.
        unsafe {
            libc::munmap(self.base.cast(), self.size as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocations_are_aligned_and_disjoint() {
        let mut a = RangeAllocator::new(64 * MIB);
        let small = a.alloc(100).unwrap();
        assert_eq!(small % PAGE_SIZE, 0);
        assert_eq!(a.allocation_len(small), Some(PAGE_SIZE));
        let big = a.alloc(3 * MIB).unwrap();
        assert_eq!(big % HUGE_PAGE_SIZE, 0);
        assert!(big >= small + PAGE_SIZE);
        let other = a.alloc(5000).unwrap();
        assert_eq!(other % PAGE_SIZE, 0);
        assert_eq!(a.allocation_len(other), Some(2 * PAGE_SIZE));
        // First fit: the gap below the huge-aligned block is reused.
        assert!(other < big);
    }

    #[test]
    fn free_coalesces_and_space_returns() {
        let mut a = RangeAllocator::new(16 * MIB);
        let total = a.free_bytes();
        let blocks: Vec<u64> = (0..8).map(|_| a.alloc(PAGE_SIZE).unwrap()).collect();
        assert_eq!(a.free_bytes(), total - 8 * PAGE_SIZE);
        for b in blocks.iter().step_by(2) {
            a.free(*b).unwrap();
        }
        assert_eq!(a.free_ranges(), 5);
        for b in blocks.iter().skip(1).step_by(2) {
            a.free(*b).unwrap();
        }
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.free_bytes(), total);
        assert!(matches!(
            a.free(blocks[0]),
            Err(GuestMemoryError::NotAllocated(_))
        ));
    }

    #[test]
    fn out_of_space_is_an_error() {
        let mut a = RangeAllocator::new(4 * MIB);
        let x = a.alloc(2 * MIB).unwrap();
        assert!(matches!(
            a.alloc(4 * MIB),
            Err(GuestMemoryError::OutOfMemory(_))
        ));
        assert!(matches!(
            a.alloc(u64::MAX),
            Err(GuestMemoryError::OutOfMemory(_))
        ));
        a.free(x).unwrap();
        assert_eq!(a.alloc(4 * MIB).unwrap(), 0);
    }

    #[test]
    fn memfd_mapping_is_shared_and_allocations_in_bounds() {
        let mem = GuestMemory::new(8 * MIB).unwrap();
        let (gpa, ptr) = mem.alloc(PAGE_SIZE).unwrap();
        // SAFETY: `ptr` points at a page allocated just above.
        unsafe { ptr.write_bytes(0xab, PAGE_SIZE as usize) };
        // The same bytes are visible through the file, as the daemon sees them.
        let mut buf = [0u8; 16];
        // SAFETY: reads into a local buffer from a descriptor we own.
        let n = unsafe {
            libc::pread(
                mem.fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                gpa as libc::off_t,
            )
        };
        assert_eq!(n, 16);
        assert_eq!(buf, [0xab; 16]);
        assert_eq!(mem.host_ptr(gpa, PAGE_SIZE), Some(ptr));
        assert_eq!(mem.host_ptr(8 * MIB - 1, 2), None);
        mem.free(gpa).unwrap();
        assert!(mem.free(gpa).is_err());
    }

    #[test]
    fn concurrent_allocations_do_not_overlap() {
        let mem = std::sync::Arc::new(GuestMemory::new(64 * MIB).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let mem = mem.clone();
                std::thread::spawn(move || {
                    (0..100)
                        .map(|i| mem.alloc(PAGE_SIZE * (1 + i % 3)).unwrap().0)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort_unstable();
        let before = all.len();
        all.dedup();
        assert_eq!(all.len(), before);
    }
}

//! A blob in its worker process: the blob's guest pages mapped one after
//! the other into one range of the worker's address space, and that range
//! (and nothing else of guest memory) registered for DMA when a copy first
//! needs it.
//!
//! The worker maps only the blobs of its own guest process, so a forged
//! device pointer, or a kernel that dereferences one, finds no other guest
//! memory: the GPU reaches what this process registered and its own device
//! memory, as natively. Mapping the pages contiguously also lets a copy
//! from a blob of scattered guest pages be one DMA over one virtual range.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::null_mut;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use log::debug;
use rgpu_executor::{Executor, HostRun};
use rgpu_session::{Completion, Counters, DmaRegistration};

use super::message::FileRun;

/// Page size of guest memory and of the mappings.
pub const PAGE_BYTES: u64 = 4096;
/// Mappings the rest of a worker (libraries, NVIDIA's driver, thread
/// stacks) may need beside blob runs.
const MAPPINGS_KEPT_FREE: usize = 8192;

/// Blob runs a worker may map at once: each run is one mapping, and the
/// kernel caps mappings per process at `vm.max_map_count` (65530 unless the
/// host raised it); `lower` (`--max-mapped-runs`, tests) lowers it.
pub fn mapped_runs_limit(lower: Option<usize>) -> usize {
    let kernel = max_map_count_runs();
    lower.map_or(kernel, |lower| lower.min(kernel))
}

/// The runs a worker has mapped, against its limit.
#[derive(Debug, Clone, Copy)]
pub struct RunBudget {
    pub mapped: usize,
    pub limit: usize,
}

fn max_map_count_runs() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(65_530)
        .saturating_sub(MAPPINGS_KEPT_FREE)
}

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("blob runs cover {covered} bytes, the blob has {size}")]
    SizeMismatch { covered: u64, size: u64 },
    #[error("run at file offset {offset:#x} (+{len:#x}) is not page-aligned")]
    Unaligned { offset: u64, len: u64 },
    #[error("guest memory file {0} was never sent")]
    UnknownFile(u32),
    #[error(
        "this process would map {wanted} page runs, more than {limit}: its blobs are too \
         scattered (large guest pages, or a higher vm.max_map_count on the host, help)"
    )]
    TooManyRuns { wanted: usize, limit: usize },
    #[error("mmap failed: {0}")]
    Mmap(std::io::Error),
}

/// A mapped blob, registered for DMA on first need if the executor can.
pub struct BlobMapping {
    base: *mut u8,
    len: usize,
    runs: usize,
    /// Whether registering worked, once a copy asked.
    registered: OnceLock<bool>,
    executor: Arc<dyn Executor>,
    counters: Arc<Counters>,
    /// Completed once the mapping is gone.
    on_unmapped: Mutex<Vec<Box<dyn Completion>>>,
}

// SAFETY: `base` is only an address of a mapping this value owns; the bytes
// are reached through `rgpu_session::Blob`, which copies volatilely.
unsafe impl Send for BlobMapping {}
// SAFETY: as above; the only interior mutability is behind a Mutex and a
// OnceLock.
unsafe impl Sync for BlobMapping {}

impl BlobMapping {
    /// Maps `runs` (`size` bytes in all) of `files` contiguously, at
    /// `address` if that is not 0 and nothing of this process is there
    /// (else where the kernel chooses), within the worker's `budget` of
    /// mapped runs.
    pub fn map(
        files: &HashMap<u32, File>,
        runs: &[FileRun],
        size: u64,
        address: u64,
        budget: RunBudget,
        executor: Arc<dyn Executor>,
        counters: Arc<Counters>,
    ) -> Result<BlobMapping, MapError> {
        let covered = runs
            .iter()
            .try_fold(0u64, |sum, run| sum.checked_add(run.len))
            .unwrap_or(u64::MAX);
        let len = usize::try_from(size)
            .ok()
            .filter(|_| covered == size && size > 0);
        let Some(len) = len else {
            return Err(MapError::SizeMismatch { covered, size });
        };
        let wanted = budget.mapped.saturating_add(runs.len());
        if wanted > budget.limit {
            return Err(MapError::TooManyRuns {
                wanted,
                limit: budget.limit,
            });
        }
        for run in runs {
            if run.offset % PAGE_BYTES != 0 || run.len % PAGE_BYTES != 0 || run.len == 0 {
                return Err(MapError::Unaligned {
                    offset: run.offset,
                    len: run.len,
                });
            }
            if !files.contains_key(&run.file) {
                return Err(MapError::UnknownFile(run.file));
            }
        }
        let base = reserve(address, len)?;
        let mapping = BlobMapping {
            base,
            len,
            runs: runs.len(),
            registered: OnceLock::new(),
            executor,
            counters,
            on_unmapped: Mutex::new(Vec::new()),
        };
        let mut at = 0usize;
        for run in runs {
            let (Some(file), Ok(offset), Ok(run_len)) = (
                files.get(&run.file),
                libc::off_t::try_from(run.offset),
                usize::try_from(run.len),
            ) else {
                return Err(MapError::UnknownFile(run.file));
            };
            // SAFETY: replaces part of our own reservation (`at + run_len <=
            // len`, since the runs sum to `len`) with a shared mapping of
            // guest memory.
            let placed = unsafe {
                libc::mmap(
                    base.add(at).cast(),
                    run_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    file.as_raw_fd(),
                    offset,
                )
            };
            if placed == libc::MAP_FAILED {
                // Dropping `mapping` unmaps the whole reservation.
                return Err(MapError::Mmap(std::io::Error::last_os_error()));
            }
            at += run_len;
        }
        debug!(
            "blob of {size} bytes in {} runs mapped at {base:p}",
            runs.len()
        );
        Ok(mapping)
    }

    /// The whole mapping.
    pub fn run(&self) -> HostRun {
        HostRun {
            ptr: self.base,
            len: self.len,
        }
    }

    /// Mappings (page runs) it holds.
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// Completes `completion` once the mapping is gone (unregistered and
    /// unmapped).
    pub fn when_unmapped(&self, completion: Box<dyn Completion>) {
        self.on_unmapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(completion);
    }
}

/// `len` bytes of address space for a blob's runs: at `address` if that is
/// not 0 and free, else where the kernel chooses.
fn reserve(address: u64, len: usize) -> Result<*mut u8, MapError> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if address != 0 {
        // SAFETY: NOREPLACE never touches an existing mapping: the call
        // fails instead (and the range stays PROT_NONE until the runs are
        // mapped over it).
        let placed = unsafe {
            libc::mmap(
                address as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                flags | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if placed as u64 == address {
            return Ok(placed.cast());
        }
        if placed != libc::MAP_FAILED {
            // A kernel older than NOREPLACE took it as a hint and placed it
            // elsewhere: still a fresh reservation of ours.
            debug!("blob reservation wanted at {address:#x}, placed at {placed:p}");
            return Ok(placed.cast());
        }
        debug!(
            "blob reservation at {address:#x} (+{len:#x}): {}; placed elsewhere",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a fresh reservation nobody else uses; PROT_NONE until the
    // runs are mapped over it.
    let base = unsafe { libc::mmap(null_mut(), len, libc::PROT_NONE, flags, -1, 0) };
    if base == libc::MAP_FAILED {
        return Err(MapError::Mmap(std::io::Error::last_os_error()));
    }
    Ok(base.cast())
}

impl DmaRegistration for BlobMapping {
    fn dma_registered(&self) -> bool {
        *self.registered.get_or_init(|| {
            let registered = self.executor.register_host_memory(self.run()).is_ok();
            if registered {
                Counters::add(&self.counters.dma_registered_bytes, self.len as u64);
            }
            debug!(
                "blob of {} bytes at {:p} registered for DMA: {registered}",
                self.len, self.base
            );
            registered
        })
    }
}

impl Drop for BlobMapping {
    fn drop(&mut self) {
        if self.registered.get() == Some(&true) {
            self.executor.unregister_host_memory(self.run());
            Counters::sub(&self.counters.dma_registered_bytes, self.len as u64);
        }
        // SAFETY: the reservation (and every run mapped over it) is ours;
        // nothing refers to it any more: every Blob holding it is gone.
        unsafe { libc::munmap(self.base.cast(), self.len) };
        let waiting = std::mem::take(
            self.on_unmapped
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for completion in waiting {
            completion.complete();
        }
    }
}

//! Guest memory registered with the GPU for DMA (ARCHITECTURE.md §5).
//!
//! Guest memory is registered once per connection, in fixed 64 MiB chunks
//! aligned in host address space and clipped to the guest memory region,
//! lazily, as blobs come to lie in them. Chunks never overlap (the driver
//! refuses overlapping registrations), sessions come and go without touching
//! them, and a VM whose blobs are scattered 4 KiB pages ends up with its RAM
//! registered the way a passthrough GPU pins it, while a local process's
//! sparse memfd only pins what its blobs use. Copies are split at chunk
//! boundaries so no single copy spans two registrations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rgpu_executor::{Executor, HostRun};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::blob::Blob;
use crate::counters::Counters;
use crate::GuestMemory;

/// Size and host-address alignment of a registration chunk.
pub const DMA_CHUNK: usize = 64 << 20;

struct Chunk {
    len: usize,
    /// Whether the executor accepted it.
    registered: bool,
    /// Keeps the mapping alive while it is registered.
    _memory: Arc<GuestMemory>,
}

/// One connection's registrations.
pub struct DmaRegistry {
    executor: Arc<dyn Executor>,
    counters: Arc<Counters>,
    chunks: Mutex<HashMap<usize, Chunk>>,
}

impl DmaRegistry {
    pub fn new(executor: Arc<dyn Executor>, counters: Arc<Counters>) -> Self {
        Self {
            executor,
            counters,
            chunks: Mutex::new(HashMap::new()),
        }
    }

    /// Registers every chunk the blob's memory lies in; returns whether all
    /// of them are registered (else copies from the blob are staged by the
    /// driver, which the counters show).
    pub fn cover(&self, blob: &Blob) -> bool {
        let memory = blob.memory();
        let mut chunks = self.chunks.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all = true;
        for run in blob.runs() {
            for (start, len) in chunks_of(memory, *run) {
                let chunk = chunks.entry(start).or_insert_with(|| {
                    let registered = self
                        .executor
                        .register_host_memory(HostRun {
                            ptr: start as *mut u8,
                            len,
                        })
                        .is_ok();
                    if registered {
                        Counters::add(&self.counters.dma_registered_bytes, len as u64);
                    }
                    Chunk {
                        len,
                        registered,
                        _memory: memory.clone(),
                    }
                });
                all &= chunk.registered;
            }
        }
        all
    }
}

impl Drop for DmaRegistry {
    fn drop(&mut self) {
        let chunks = self
            .chunks
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for (start, chunk) in chunks.drain() {
            if chunk.registered {
                self.executor.unregister_host_memory(HostRun {
                    ptr: start as *mut u8,
                    len: chunk.len,
                });
                Counters::sub(&self.counters.dma_registered_bytes, chunk.len as u64);
            }
        }
    }
}

/// The chunks (host start, length) that `run` touches, clipped to the guest
/// memory region that holds it. A run outside every region (impossible for
/// a run of a blob) touches none.
fn chunks_of(memory: &GuestMemory, run: HostRun) -> Vec<(usize, usize)> {
    let start = run.ptr as usize;
    let Some(end) = start.checked_add(run.len) else {
        return Vec::new();
    };
    let region = memory.iter().find_map(|region| {
        let base = region.as_ptr() as usize;
        let region_end = base.checked_add(region.len() as usize)?;
        (base <= start && end <= region_end).then_some((base, region_end))
    });
    let Some((base, region_end)) = region else {
        return Vec::new();
    };
    let mut chunks = Vec::new();
    let mut at = start - start % DMA_CHUNK;
    while at < end {
        let chunk_start = at.max(base);
        let chunk_end = at.saturating_add(DMA_CHUNK).min(region_end);
        chunks.push((chunk_start, chunk_end - chunk_start));
        at = at.saturating_add(DMA_CHUNK);
    }
    chunks
}

/// Splits runs at chunk boundaries, so that no copy spans two
/// registrations.
pub fn split_at_chunks(runs: Vec<HostRun>) -> Vec<HostRun> {
    if runs
        .iter()
        .all(|r| (r.ptr as usize % DMA_CHUNK) + r.len <= DMA_CHUNK)
    {
        return runs;
    }
    let mut out = Vec::with_capacity(runs.len() + 4);
    for run in runs {
        let mut ptr = run.ptr as usize;
        let mut left = run.len;
        while left > 0 {
            let piece = left.min(DMA_CHUNK - ptr % DMA_CHUNK);
            out.push(HostRun {
                ptr: ptr as *mut u8,
                len: piece,
            });
            ptr += piece;
            left -= piece;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_runs_at_chunk_boundaries() {
        let base = 3 * DMA_CHUNK - 4096;
        let runs = split_at_chunks(vec![
            HostRun {
                ptr: base as *mut u8,
                len: DMA_CHUNK + 8192,
            },
            HostRun {
                ptr: 5 as *mut u8,
                len: 10,
            },
        ]);
        let pieces: Vec<(usize, usize)> = runs.iter().map(|r| (r.ptr as usize, r.len)).collect();
        assert_eq!(
            pieces,
            vec![
                (base, 4096),
                (3 * DMA_CHUNK, DMA_CHUNK),
                (4 * DMA_CHUNK, 4096),
                (5, 10)
            ]
        );
    }
}

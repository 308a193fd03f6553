//! The daemon's own accounting, read by its stats socket and by tests: what
//! is alive now and how much data moved which way.

use std::sync::atomic::{AtomicU64, Ordering};

/// Daemon-wide counters. All fields only go up, except the `*_active` and
/// `device_memory_bytes` gauges.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections_active: AtomicU64,
    pub connections_total: AtomicU64,
    pub sessions_active: AtomicU64,
    pub sessions_total: AtomicU64,
    /// Bytes of device memory that guests hold right now.
    pub device_memory_bytes: AtomicU64,
    pub commands_executed: AtomicU64,
    /// Commands that failed (error replies and sticky asynchronous errors).
    pub command_errors: AtomicU64,
    /// Bytes copied by DMA straight from or into guest blobs the application
    /// owns (pinned host memory): no copy on the host.
    pub zero_copy_bytes: AtomicU64,
    /// Bytes that went through the channel's ring or bounce area (pageable
    /// application memory, staged by the guest library).
    pub staged_bytes: AtomicU64,
    /// Bytes the daemon itself copied with the CPU (module images, replies);
    /// bulk data must never show up here.
    pub host_cpu_copy_bytes: AtomicU64,
    /// Guest memory registered with the GPU for DMA right now (gauge).
    pub dma_registered_bytes: AtomicU64,
    /// Bytes copied from or into guest memory that is not registered for
    /// DMA: the driver stages those through its own buffers (a host copy).
    pub unregistered_copy_bytes: AtomicU64,
    /// Module loads served from the daemon's module cache (the image did
    /// not cross from the guest again).
    pub module_cache_hits: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn sub(counter: &AtomicU64, value: u64) {
        // Saturating: a bookkeeping slip must not wrap a gauge.
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(value))
        });
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

//! The daemon's own accounting, read by its stats socket and by tests: what
//! is alive now and how much data moved which way.
//!
//! The values live in a [`CounterPage`], laid out so that it can sit in
//! memory shared between processes: the daemon serves each connection in a
//! process of its own, which counts into a page that the parent process
//! (and its stats socket) maps too. [`Counters`] is the handle the sessions
//! count through; it dereferences to the page, wherever the page lives.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counter values. Process-shared layout: `#[repr(C)]`, only
/// `AtomicU64` fields (lock-free, 8-byte aligned, no pointers), all zeroes
/// a valid initial state, so a zero-filled page shared with another process
/// (memfd, `MAP_SHARED`) is one. Fields are only ever appended.
#[repr(C)]
#[derive(Debug, Default)]
pub struct CounterPage {
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
    /// Worker processes (one per guest process using the GPU) alive now.
    pub workers_active: AtomicU64,
    pub workers_total: AtomicU64,
    /// Sessions whose GPU work may be running now (the scheduler's view).
    pub gpu_busy_sessions: AtomicU64,
    /// Sessions waiting for their tenant's turn on the GPU.
    pub gpu_waiting_sessions: AtomicU64,
    /// Times a sleeping session was woken through its channel's wake word
    /// and found commands (a local guest published them).
    pub wake_word_wakeups: AtomicU64,
    /// Times a sleeping session was woken by a doorbell that came through
    /// the device's control queue (VM mode, or a guest without the wake
    /// word, or one that waits on a fence).
    pub doorbell_wakeups: AtomicU64,
}

// The page is shared as one 4 KiB page, and read as atomics by the other
// process: it must fit and must not need more than the page's alignment.
const _: () = assert!(std::mem::size_of::<CounterPage>() <= 4096);
const _: () = assert!(std::mem::align_of::<CounterPage>() == 8);

/// Whether a counter says what is alive now or how much happened so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    /// Goes up and down; what a process that ended held is gone with it.
    Gauge,
    /// Only goes up.
    Total,
}

impl CounterPage {
    /// Every counter with its name (as the stats socket prints it) and
    /// kind, in declaration order.
    pub fn fields(&self) -> [(&'static str, CounterKind, &AtomicU64); 19] {
        use CounterKind::{Gauge, Total};
        [
            ("connections_active", Gauge, &self.connections_active),
            ("connections_total", Total, &self.connections_total),
            ("sessions_active", Gauge, &self.sessions_active),
            ("sessions_total", Total, &self.sessions_total),
            ("device_memory_bytes", Gauge, &self.device_memory_bytes),
            ("commands_executed", Total, &self.commands_executed),
            ("command_errors", Total, &self.command_errors),
            ("zero_copy_bytes", Total, &self.zero_copy_bytes),
            ("staged_bytes", Total, &self.staged_bytes),
            ("host_cpu_copy_bytes", Total, &self.host_cpu_copy_bytes),
            ("dma_registered_bytes", Gauge, &self.dma_registered_bytes),
            (
                "unregistered_copy_bytes",
                Total,
                &self.unregistered_copy_bytes,
            ),
            ("module_cache_hits", Total, &self.module_cache_hits),
            ("workers_active", Gauge, &self.workers_active),
            ("workers_total", Total, &self.workers_total),
            ("gpu_busy_sessions", Gauge, &self.gpu_busy_sessions),
            ("gpu_waiting_sessions", Gauge, &self.gpu_waiting_sessions),
            ("wake_word_wakeups", Total, &self.wake_word_wakeups),
            ("doorbell_wakeups", Total, &self.doorbell_wakeups),
        ]
    }

    /// Sets every counter to the sum of `parts`' (one pass per field).
    pub fn store_sum(&self, parts: &[&CounterPage]) {
        for (i, (_, _, mine)) in self.fields().iter().enumerate() {
            let sum = parts.iter().fold(0u64, |sum, part| {
                let value = part.fields().get(i).map_or(0, |(_, _, c)| Counters::get(c));
                sum.saturating_add(value)
            });
            mine.store(sum, Ordering::Relaxed);
        }
    }

    /// Adds `other`'s counters of the given kinds to these.
    pub fn add_from(&self, other: &CounterPage, kinds: &[CounterKind]) {
        for ((_, kind, mine), (_, _, theirs)) in self.fields().iter().zip(other.fields()) {
            if kinds.contains(kind) {
                Counters::add(mine, Counters::get(theirs));
            }
        }
    }
}

/// The counters the daemon counts into: a page of its own, or one shared
/// with another process ([`Counters::shared`]).
#[derive(Debug)]
pub struct Counters {
    page: Page,
}

#[derive(Debug)]
enum Page {
    Owned(CounterPage),
    Shared(&'static CounterPage),
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            page: Page::Owned(CounterPage::default()),
        }
    }
}

impl Deref for Counters {
    type Target = CounterPage;

    fn deref(&self) -> &CounterPage {
        match &self.page {
            Page::Owned(page) => page,
            Page::Shared(page) => page,
        }
    }
}

impl Counters {
    /// Counters kept in `page`, typically mapped from memory that another
    /// process reads too.
    pub fn shared(page: &'static CounterPage) -> Self {
        Self {
            page: Page::Shared(page),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_totals_and_gauges_separately() {
        let sum = Counters::default();
        let child = Counters::default();
        Counters::add(&child.sessions_active, 2);
        Counters::add(&child.sessions_total, 5);
        sum.add_from(&child, &[CounterKind::Total]);
        assert_eq!(Counters::get(&sum.sessions_active), 0);
        assert_eq!(Counters::get(&sum.sessions_total), 5);
        sum.add_from(&child, &[CounterKind::Gauge, CounterKind::Total]);
        assert_eq!(Counters::get(&sum.sessions_active), 2);
        assert_eq!(Counters::get(&sum.sessions_total), 10);
        let page: &'static CounterPage = Box::leak(Box::default());
        let shared = Counters::shared(page);
        Counters::add(&shared.command_errors, 1);
        assert_eq!(Counters::get(&page.command_errors), 1);
    }
}

//! A tenant's device-memory budget (the sharing issue's `memory_limit`):
//! every allocation a session makes is taken from it first, and given back
//! when freed. The daemon keeps it in memory shared by every process that
//! serves the tenant; a session only sees this trait.

use std::sync::atomic::{AtomicU64, Ordering};

/// Device memory a tenant may take.
pub trait MemoryBudget: Send + Sync + std::fmt::Debug {
    /// Takes `bytes`; false (and nothing taken) past the limit.
    fn try_reserve(&self, bytes: u64) -> bool;
    /// Takes `bytes` even past the limit: memory the driver already took
    /// for the tenant (later allocations then fail until it comes back).
    fn charge(&self, bytes: u64);
    /// Gives `bytes` back.
    fn release(&self, bytes: u64);
    /// The limit in bytes; `None`: none.
    fn limit(&self) -> Option<u64>;
    /// Bytes taken now, by every process of the tenant.
    fn used(&self) -> u64;
    /// This process opened a device context for guest process
    /// `guest_pid`: it is listed (NVML's process lists) with what it takes,
    /// until its last context closes.
    fn context_opened(&self, _guest_pid: u32) {}
    /// A context [`MemoryBudget::context_opened`] counted closed.
    fn context_closed(&self) {}
    /// The tenant's named processes with what each holds (`ctx_id` 0);
    /// `None`: the budget keeps no such list.
    fn processes(&self) -> Option<Vec<rgpu_proto::reply::SessionUsage>> {
        None
    }
}

/// A budget of this process alone (tests, and tenants of one process):
/// what is taken, against a limit if one is given.
#[derive(Debug, Default)]
pub struct LocalBudget {
    used: AtomicU64,
    limit: Option<u64>,
}

impl LocalBudget {
    pub fn with_limit(limit: Option<u64>) -> Self {
        Self {
            used: AtomicU64::new(0),
            limit,
        }
    }
}

impl MemoryBudget for LocalBudget {
    fn try_reserve(&self, bytes: u64) -> bool {
        let limit = self.limit.unwrap_or(u64::MAX);
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    fn charge(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_add(bytes))
            });
    }

    fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    fn limit(&self) -> Option<u64> {
        self.limit
    }

    fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

/// `(free, total)` of a device as a tenant under `budget` sees it: its
/// limit is its total, and what it has not taken of it (nor the device
/// lacks) is free.
pub fn clamp_to_budget(free: u64, total: u64, budget: Option<&dyn MemoryBudget>) -> (u64, u64) {
    match budget.and_then(|b| b.limit().map(|limit| (limit, b.used()))) {
        Some((limit, used)) => (free.min(limit.saturating_sub(used)), total.min(limit)),
        None => (free, total),
    }
}

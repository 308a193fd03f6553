//! A tenant's device-memory budget (the sharing issue's `memory_limit`):
//! every allocation a session makes is taken from it first, and given back
//! when freed. The daemon keeps it in memory shared by every process that
//! serves the tenant; a session only sees this trait.

/// Device memory a tenant may take.
pub trait MemoryBudget: Send + Sync + std::fmt::Debug {
    /// Takes `bytes`; false (and nothing taken) past the limit.
    fn try_reserve(&self, bytes: u64) -> bool;
    /// Gives `bytes` back.
    fn release(&self, bytes: u64);
    /// The limit in bytes; `None`: none.
    fn limit(&self) -> Option<u64>;
    /// Bytes taken now, by every process of the tenant.
    fn used(&self) -> u64;
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

//! A tenant's memory budget, shared by every process that serves it: the
//! parent (which sets the limit, live), its connection processes and their
//! workers (which take device memory against it). One page of a memfd that
//! the parent creates per tenant and its children inherit, holding atomics
//! only, so every process sees the same numbers without a round trip.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rgpu_session::MemoryBudget;

use crate::shared_page::{self, SharedLayout, SharedPage};

/// No limit.
pub const UNLIMITED: u64 = u64::MAX;

/// The shared layout: all zeroes is "no use", so the parent stores the
/// limit before any child starts.
#[repr(C)]
struct Budget {
    limit_bytes: AtomicU64,
    used_bytes: AtomicU64,
}

// SAFETY: `#[repr(C)]`, two atomics, valid all zero.
unsafe impl SharedLayout for Budget {}

/// A mapping of a tenant's page, and its descriptor, for the processes
/// this one starts.
pub struct TenantPage {
    budget: SharedPage<Budget>,
    fd: OwnedFd,
}

impl std::fmt::Debug for TenantPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantPage")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .finish()
    }
}

impl TenantPage {
    /// A new page with `limit` bytes (or [`UNLIMITED`]). Its descriptor
    /// ([`TenantPage::fd`]) is close-on-exec: a child's spawner makes it
    /// inheritable.
    pub fn create(limit: u64) -> io::Result<TenantPage> {
        let fd = shared_page::create(c"rgpu-tenant")?;
        let budget = SharedPage::map(&fd)?;
        let page = TenantPage { budget, fd };
        page.set_limit(limit);
        Ok(page)
    }

    /// Maps the page a parent passed as descriptor `fd` (which it keeps,
    /// close-on-exec from now on, for its own children).
    pub fn inherit(fd: RawFd) -> io::Result<TenantPage> {
        let fd = shared_page::adopt(fd, "a tenant page")?;
        // SAFETY: plain call on our descriptor.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
            return Err(io::Error::last_os_error());
        }
        let budget = SharedPage::map(&fd)?;
        Ok(TenantPage { budget, fd })
    }

    /// The page's descriptor, to pass to a child.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn budget(&self) -> &Budget {
        self.budget.get()
    }

    pub fn set_limit(&self, bytes: u64) {
        self.budget().limit_bytes.store(bytes, Ordering::Release);
    }

    /// The limit in bytes ([`UNLIMITED`]: none).
    pub fn limit(&self) -> u64 {
        self.budget().limit_bytes.load(Ordering::Acquire)
    }

    pub fn used(&self) -> u64 {
        self.budget().used_bytes.load(Ordering::Acquire)
    }
}

impl MemoryBudget for TenantPage {
    fn try_reserve(&self, bytes: u64) -> bool {
        let limit = self.limit();
        self.budget()
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        let _ =
            self.budget()
                .used_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    Some(used.saturating_sub(bytes))
                });
    }

    fn limit(&self) -> Option<u64> {
        Some(TenantPage::limit(self)).filter(|l| *l != UNLIMITED)
    }

    fn used(&self) -> u64 {
        TenantPage::used(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapping_shares_one_budget() {
        let parent = TenantPage::create(100).expect("a page");
        // SAFETY: dup of its descriptor, owned by the child mapping.
        let dup = unsafe { libc::dup(parent.fd()) };
        let child = TenantPage::inherit(dup).expect("the child's mapping");
        assert!(child.try_reserve(60));
        assert!(!child.try_reserve(41), "past the limit");
        assert!(parent.try_reserve(40));
        assert_eq!(MemoryBudget::used(&parent), 100);
        child.release(60);
        assert_eq!(MemoryBudget::used(&parent), 40);
        // Lowering the limit below use refuses new memory, takes none away.
        parent.set_limit(10);
        assert!(!child.try_reserve(1));
        assert_eq!(MemoryBudget::used(&child), 40);
        assert_eq!(MemoryBudget::limit(&child), Some(10));
        parent.set_limit(UNLIMITED);
        assert_eq!(MemoryBudget::limit(&child), None);
        assert!(child.try_reserve(u64::MAX - 40));
        assert!(!child.try_reserve(1), "no overflow");
    }
}

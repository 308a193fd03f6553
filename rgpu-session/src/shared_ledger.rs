//! Memory the tenant's processes share, charged once (issue 8's limit with
//! issue 10's sharing).
//!
//! An exported allocation is charged to its exporter as any other; an
//! importer is charged nothing while the exporter holds it. The driver
//! keeps imported memory for the importer after the exporter freed it, so
//! when the exporter lets go while importers still hold it, the ledger
//! takes the charge over and gives it back with the last importer. An
//! import of what its exporter no longer shares is refused.
//!
//! The daemon's ledger lives in the tenant's broker thread (it outlives
//! every worker and watches their ends); a tenant without one keeps a
//! ledger of this process ([`LocalShareLedger`]).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::budget::MemoryBudget;

/// What names a shared object: a CUDA IPC handle, or a shareable handle's
/// token (its 32 bytes, then `TOKEN_MARK`).
pub type ShareKey = [u8; 64];

/// The last byte of a token's key (IPC handles end in zeros).
const TOKEN_MARK: u8 = 0xa5;

/// Objects one ledger keeps at most; past it a share is refused.
pub const MAX_SHARED: usize = 4096;

/// The key of shareable-handle token `token`.
pub fn token_key(token: &[u8; 32]) -> ShareKey {
    let mut key = [0u8; 64];
    key[..32].copy_from_slice(token);
    key[63] = TOKEN_MARK;
    key
}

/// Who holds or shares: a process (whose end the daemon's ledger watches)
/// and one of its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder {
    pub pid: i32,
    pub member: u64,
}

#[derive(Debug)]
struct Entry {
    size: u64,
    /// The session that shares it, while it does.
    sharer: Option<Holder>,
    /// Importing sessions and how many imports each holds.
    holders: HashMap<Holder, u32>,
    /// The ledger carries the charge (the sharer let go first).
    adopted: bool,
}

/// The shared objects of a tenant.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<ShareKey, Entry>,
}

impl Ledger {
    /// `by` shares `key` of `size` bytes (sharing it again changes
    /// nothing); false when the ledger is full or another shares it.
    pub fn share(&mut self, by: Holder, key: &ShareKey, size: u64) -> bool {
        if let Some(entry) = self.entries.get_mut(key) {
            return match entry.sharer {
                Some(sharer) => sharer == by,
                None => false,
            };
        }
        if self.entries.len() >= MAX_SHARED {
            return false;
        }
        self.entries.insert(
            *key,
            Entry {
                size,
                sharer: Some(by),
                holders: HashMap::new(),
                adopted: false,
            },
        );
        true
    }

    /// `by` imports `key`: false when nobody shares it (any more).
    pub fn hold(&mut self, by: Holder, key: &ShareKey) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) if entry.sharer.is_some() => {
                let held = entry.holders.entry(by).or_insert(0);
                *held = held.saturating_add(1);
                true
            }
            _ => false,
        }
    }

    /// `by` lets go of one import of `key`; the last holder of an adopted
    /// object gives its charge back to `budget`.
    pub fn let_go(&mut self, by: Holder, key: &ShareKey, budget: Option<&dyn MemoryBudget>) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if let Some(held) = entry.holders.get_mut(&by) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                entry.holders.remove(&by);
            }
        }
        self.settle(key, budget);
    }

    /// `by` stops sharing `key` (its own charge goes with its allocation):
    /// where importers still hold it, `budget` is charged for it now.
    pub fn unshare(&mut self, by: Holder, key: &ShareKey, budget: Option<&dyn MemoryBudget>) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.sharer != Some(by) {
            return;
        }
        entry.sharer = None;
        if !entry.holders.is_empty() && !entry.adopted {
            entry.adopted = true;
            if let Some(budget) = budget {
                budget.charge(entry.size);
            }
        }
        self.settle(key, budget);
    }

    /// Process `pid` ended: what it shared and held goes as if let go.
    pub fn process_ended(&mut self, pid: i32, budget: Option<&dyn MemoryBudget>) {
        let keys: Vec<ShareKey> = self.entries.keys().copied().collect();
        for key in keys {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            entry.holders.retain(|holder, _| holder.pid != pid);
            if let Some(sharer) = entry.sharer.filter(|s| s.pid == pid) {
                self.unshare(sharer, &key, budget);
            } else {
                self.settle(&key, budget);
            }
        }
    }

    /// Whether process `pid` shares or holds anything.
    pub fn involves(&self, pid: i32) -> bool {
        self.entries.values().any(|e| {
            e.sharer.is_some_and(|s| s.pid == pid) || e.holders.keys().any(|h| h.pid == pid)
        })
    }

    /// Bytes the ledger carries now.
    pub fn adopted_bytes(&self) -> u64 {
        self.entries
            .values()
            .filter(|e| e.adopted)
            .fold(0u64, |sum, e| sum.saturating_add(e.size))
    }

    /// Drops `key` once nobody shares or holds it, giving back what the
    /// ledger carried.
    fn settle(&mut self, key: &ShareKey, budget: Option<&dyn MemoryBudget>) {
        let done = self
            .entries
            .get(key)
            .is_some_and(|e| e.sharer.is_none() && e.holders.is_empty());
        if !done {
            return;
        }
        if let Some(entry) = self.entries.remove(key) {
            if entry.adopted {
                if let Some(budget) = budget {
                    budget.release(entry.size);
                }
            }
        }
    }
}

/// A tenant's ledger as its sessions reach it; `budget` is the tenant's
/// (the daemon's ledger charges the budget it was given instead).
pub trait ShareLedger: Send + Sync + std::fmt::Debug {
    fn share(&self, member: u64, key: &ShareKey, size: u64) -> bool;
    fn hold(&self, member: u64, key: &ShareKey) -> bool;
    fn let_go(&self, member: u64, key: &ShareKey, budget: Option<&dyn MemoryBudget>);
    fn unshare(&self, member: u64, key: &ShareKey, budget: Option<&dyn MemoryBudget>);
}

/// A ledger of this process alone.
#[derive(Debug, Default)]
pub struct LocalShareLedger {
    ledger: Mutex<Ledger>,
}

impl LocalShareLedger {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn holder(member: u64) -> Holder {
        Holder {
            pid: i32::try_from(std::process::id()).unwrap_or(0),
            member,
        }
    }

    /// Bytes it carries now.
    pub fn adopted_bytes(&self) -> u64 {
        self.lock().adopted_bytes()
    }
}

impl ShareLedger for LocalShareLedger {
    fn share(&self, member: u64, key: &ShareKey, size: u64) -> bool {
        self.lock().share(Self::holder(member), key, size)
    }

    fn hold(&self, member: u64, key: &ShareKey) -> bool {
        self.lock().hold(Self::holder(member), key)
    }

    fn let_go(&self, member: u64, key: &ShareKey, budget: Option<&dyn MemoryBudget>) {
        self.lock().let_go(Self::holder(member), key, budget);
    }

    fn unshare(&self, member: u64, key: &ShareKey, budget: Option<&dyn MemoryBudget>) {
        self.lock().unshare(Self::holder(member), key, budget);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::LocalBudget;

    const A: Holder = Holder { pid: 1, member: 1 };
    const B: Holder = Holder { pid: 2, member: 1 };

    #[test]
    fn the_last_holder_carries_the_charge() {
        let budget = LocalBudget::default();
        let mut ledger = Ledger::default();
        let key = token_key(&[7; 32]);
        assert!(ledger.share(A, &key, 100));
        assert!(ledger.hold(B, &key));
        assert!(ledger.hold(B, &key));
        ledger.unshare(A, &key, Some(&budget));
        assert_eq!(budget.used(), 100, "adopted while B holds it");
        assert!(!ledger.hold(B, &key), "nobody shares it any more");
        ledger.let_go(B, &key, Some(&budget));
        assert_eq!(budget.used(), 100, "B still holds one import");
        ledger.let_go(B, &key, Some(&budget));
        assert_eq!(budget.used(), 0);
        assert!(!ledger.involves(2));
    }

    #[test]
    fn an_unheld_share_costs_nothing_and_ends_with_processes() {
        let budget = LocalBudget::default();
        let mut ledger = Ledger::default();
        let key = token_key(&[9; 32]);
        assert!(ledger.share(A, &key, 100));
        assert!(!ledger.share(B, &key, 100), "A's to share");
        ledger.unshare(A, &key, Some(&budget));
        assert_eq!(budget.used(), 0);
        assert!(!ledger.hold(B, &key));
        // A holder's end, then its sharer's: nothing stays charged.
        assert!(ledger.share(A, &key, 50));
        assert!(ledger.hold(B, &key));
        ledger.process_ended(1, Some(&budget));
        assert_eq!(budget.used(), 50);
        ledger.process_ended(2, Some(&budget));
        assert_eq!(budget.used(), 0);
        assert_eq!(ledger.adopted_bytes(), 0);
    }
}

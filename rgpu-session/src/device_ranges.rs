//! The device memory a guest process may name: its allocations and the
//! globals of its modules, as non-overlapping address ranges.
//!
//! NVIDIA's driver accepts any address its host process can reach in a
//! copy or memset: another guest's allocation, or host memory registered
//! for DMA. So the session checks every device pointer a guest passes
//! against this map first. One map serves all contexts of one guest
//! process ([`crate::Tenant`]): natively, with unified addressing, a
//! second context of a process may copy the first one's memory.

use std::collections::BTreeMap;

/// What a range is, and whose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeOwner {
    /// The session (a tenant member number) that got the range.
    pub session: u64,
    pub kind: RangeKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeKind {
    /// A `cuMemAlloc` result.
    Allocation,
    /// A `cuMemAddressReserve` range: only memory this session maps can
    /// be behind it (another process's never is).
    Reservation,
    /// A global of the module with this guest handle (`cuModuleGetGlobal`):
    /// gone when the module is unloaded.
    Global { module: u32 },
    /// Memory another process of the tenant exported, opened through CUDA
    /// IPC (`cuIpcOpenMemHandle`): gone when it is closed.
    IpcMapping,
    /// A graph's memory-allocation node's memory: gone when no graph or
    /// executable graph of the session holds the node.
    GraphAllocation,
    /// The device mapping of page-locked memory of this process (blob
    /// `resource_id`, registered by its worker): gone when the blob is
    /// detached from the session.
    PageLocked { resource_id: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("range {start:#x}+{len:#x} runs past the end of the address space")]
    Overflow { start: u64, len: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// One past the last byte.
    end: u64,
    owner: RangeOwner,
}

/// Non-overlapping `[start, end)` ranges keyed by start.
#[derive(Debug, Default)]
pub struct DeviceRanges {
    ranges: BTreeMap<u64, Entry>,
}

/// What [`DeviceRanges::insert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// A new range.
    Added,
    /// An empty range names no byte: nothing was recorded.
    Empty,
    /// The same range with the same owner was known already (a global
    /// looked up again); nothing changed.
    AlreadyKnown,
    /// The new range overlapped this many known ones, which were dropped.
    /// The driver never hands out an address that is still in use in its
    /// process, so what overlapped was stale.
    ReplacedStale(usize),
}

impl DeviceRanges {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Records `[start, start + len)` for `owner`. An empty range names no
    /// byte and is not recorded.
    pub fn insert(
        &mut self,
        start: u64,
        len: u64,
        owner: RangeOwner,
    ) -> Result<Inserted, RangeError> {
        let end = start
            .checked_add(len)
            .ok_or(RangeError::Overflow { start, len })?;
        if len == 0 {
            return Ok(Inserted::Empty);
        }
        let new = Entry { end, owner };
        if self.ranges.get(&start) == Some(&new) {
            return Ok(Inserted::AlreadyKnown);
        }
        // Overlapping: the last range starting at or before `start` if it
        // reaches past `start`, and every range starting inside the new one.
        let mut stale: Vec<u64> = self
            .ranges
            .range(..=start)
            .next_back()
            .filter(|(_, entry)| entry.end > start)
            .map(|(at, _)| *at)
            .into_iter()
            .collect();
        stale.extend(self.ranges.range(start..end).map(|(at, _)| *at));
        stale.dedup();
        for at in &stale {
            self.ranges.remove(at);
        }
        self.ranges.insert(start, new);
        Ok(if stale.is_empty() {
            Inserted::Added
        } else {
            Inserted::ReplacedStale(stale.len())
        })
    }

    /// Forgets the range starting at `start` if `owner` holds it; whether
    /// it did.
    pub fn remove(&mut self, start: u64, owner: RangeOwner) -> bool {
        match self.ranges.get(&start) {
            Some(entry) if entry.owner == owner => {
                self.ranges.remove(&start);
                true
            }
            _ => false,
        }
    }

    /// Forgets every range whose owner matches; how many went.
    pub fn remove_where(&mut self, mut matches: impl FnMut(&RangeOwner) -> bool) -> usize {
        let before = self.ranges.len();
        self.ranges.retain(|_, entry| !matches(&entry.owner));
        before - self.ranges.len()
    }

    /// The start of the allocation (a `cuMemAlloc` result) that holds
    /// `ptr`, if one does.
    pub fn allocation_holding(&self, ptr: u64) -> Option<u64> {
        self.ranges
            .range(..=ptr)
            .next_back()
            .filter(|(_, entry)| ptr < entry.end && entry.owner.kind == RangeKind::Allocation)
            .map(|(start, _)| *start)
    }

    /// Whether all of `[ptr, ptr + len)` lies inside ONE known range (a
    /// copy may not run from one allocation into the next, even where they
    /// touch). False when the end overflows.
    pub fn contains(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.ranges
            .range(..=ptr)
            .next_back()
            .is_some_and(|(_, entry)| end <= entry.end && ptr < entry.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOC: RangeOwner = RangeOwner {
        session: 1,
        kind: RangeKind::Allocation,
    };
    const OTHER: RangeOwner = RangeOwner {
        session: 2,
        kind: RangeKind::Allocation,
    };

    fn global(module: u32) -> RangeOwner {
        RangeOwner {
            session: 1,
            kind: RangeKind::Global { module },
        }
    }

    #[test]
    fn contains_only_whole_ranges_inside_one_entry() {
        let mut map = DeviceRanges::new();
        assert_eq!(map.insert(0x1000, 0x100, ALLOC), Ok(Inserted::Added));
        assert!(map.contains(0x1000, 0x100));
        assert!(map.contains(0x1000, 1));
        assert!(map.contains(0x10ff, 1));
        assert!(map.contains(0x1080, 0x80));
        assert!(!map.contains(0x1080, 0x81), "straddles the end");
        assert!(!map.contains(0x0fff, 2), "starts before");
        assert!(!map.contains(0x1100, 1), "one past the end");
        assert!(!map.contains(0x0fff, 1));
        assert!(!map.contains(0, 0x2000));
        assert!(DeviceRanges::new().is_empty());
        assert!(!DeviceRanges::new().contains(0x1000, 1));
    }

    #[test]
    fn only_an_allocation_holds_a_pointer_for_ipc() {
        let mut map = DeviceRanges::new();
        map.insert(0x1000, 0x100, ALLOC).unwrap();
        map.insert(0x2000, 0x100, global(3)).unwrap();
        let opened = RangeOwner {
            session: 1,
            kind: RangeKind::IpcMapping,
        };
        map.insert(0x3000, 0x100, opened).unwrap();
        assert_eq!(map.allocation_holding(0x1000), Some(0x1000));
        assert_eq!(map.allocation_holding(0x10ff), Some(0x1000));
        assert_eq!(map.allocation_holding(0x1100), None, "one past the end");
        assert_eq!(map.allocation_holding(0xfff), None);
        assert_eq!(map.allocation_holding(0x2000), None, "a global");
        assert_eq!(map.allocation_holding(0x3000), None, "another's memory");
        assert!(map.contains(0x3000, 0x100), "usable all the same");
    }

    #[test]
    fn adjacent_ranges_stay_separate() {
        let mut map = DeviceRanges::new();
        map.insert(0x1000, 0x100, ALLOC).unwrap();
        assert_eq!(map.insert(0x1100, 0x100, OTHER), Ok(Inserted::Added));
        assert_eq!(map.len(), 2);
        assert!(map.contains(0x1000, 0x100));
        assert!(map.contains(0x1100, 0x100));
        // Across the boundary of two known ranges: not one range.
        assert!(!map.contains(0x10f0, 0x20));
        assert!(!map.contains(0x1000, 0x200));
        assert!(map.contains(0x10f0, 0x10));
        assert!(map.contains(0x1100, 0x10));
    }

    #[test]
    fn overflow_is_refused_and_never_contained() {
        let mut map = DeviceRanges::new();
        assert_eq!(
            map.insert(u64::MAX - 4, 16, ALLOC),
            Err(RangeError::Overflow {
                start: u64::MAX - 4,
                len: 16
            })
        );
        assert!(map.is_empty());
        map.insert(u64::MAX - 0xff, 0xff, ALLOC).unwrap();
        assert!(map.contains(u64::MAX - 0xff, 0xff));
        assert!(map.contains(u64::MAX - 1, 1));
        assert!(!map.contains(u64::MAX - 1, 2));
        assert!(!map.contains(u64::MAX - 0x10, u64::MAX));
        assert!(!map.contains(u64::MAX, u64::MAX));
        map.insert(0x1000, 0x100, ALLOC).unwrap();
        assert!(!map.contains(0x1000, u64::MAX));
    }

    #[test]
    fn removal_needs_the_owner() {
        let mut map = DeviceRanges::new();
        map.insert(0x1000, 0x100, ALLOC).unwrap();
        map.insert(0x2000, 0x100, global(7)).unwrap();
        map.insert(0x3000, 0x100, global(8)).unwrap();
        assert!(!map.remove(0x1000, OTHER));
        assert!(!map.remove(0x1001, ALLOC));
        assert!(map.contains(0x1000, 0x100));
        assert!(map.remove(0x1000, ALLOC));
        assert!(!map.contains(0x1000, 1));
        assert!(!map.remove(0x1000, ALLOC));
        // A module's globals go with it; the others stay.
        assert_eq!(
            map.remove_where(|o| *o == global(7)),
            1,
            "one global of module 7"
        );
        assert!(!map.contains(0x2000, 1));
        assert!(map.contains(0x3000, 0x100));
        assert_eq!(map.remove_where(|o| o.session == 1), 1);
        assert!(map.is_empty());
    }

    #[test]
    fn a_global_looked_up_again_is_known_and_empty_ranges_are_not_kept() {
        let mut map = DeviceRanges::new();
        assert_eq!(map.insert(0x2000, 8, global(3)), Ok(Inserted::Added));
        assert_eq!(map.insert(0x2000, 8, global(3)), Ok(Inserted::AlreadyKnown));
        assert_eq!(map.len(), 1);
        assert_eq!(map.insert(0x5000, 0, ALLOC), Ok(Inserted::Empty));
        assert_eq!(map.len(), 1);
        assert!(!map.contains(0x5000, 0));
    }

    #[test]
    fn a_new_range_replaces_the_stale_ones_it_overlaps() {
        let mut map = DeviceRanges::new();
        map.insert(0x1000, 0x100, ALLOC).unwrap();
        map.insert(0x1200, 0x100, ALLOC).unwrap();
        map.insert(0x1400, 0x100, ALLOC).unwrap();
        // Starts inside the first, ends inside the second.
        assert_eq!(
            map.insert(0x1080, 0x200, OTHER),
            Ok(Inserted::ReplacedStale(2))
        );
        assert_eq!(map.len(), 2);
        assert!(map.contains(0x1080, 0x200));
        assert!(!map.contains(0x1000, 1));
        assert!(map.contains(0x1400, 0x100));
        // Same start, other size.
        assert_eq!(
            map.insert(0x1400, 0x10, ALLOC),
            Ok(Inserted::ReplacedStale(1))
        );
        assert!(!map.contains(0x1400, 0x11));
    }
}

//! The device address ranges this process may name: every allocation the
//! host made for it and every module global it looked up, in all of its
//! contexts (natively, one context may copy another's memory).
//!
//! The host refuses copies and memsets outside these ranges, but asynchronous
//! commands get no reply, so its refusal would surface as a sticky error at
//! some later, unrelated call. Checking here first answers
//! `CUDA_ERROR_INVALID_VALUE` at once, as NVIDIA's driver does, and sends
//! nothing. Every copy asks, so a query is one read lock and one BTreeMap
//! range lookup per device range.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;

/// Who made a range, so that it goes away with its maker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// An allocation (`MemAlloc`) of the context with this id.
    Allocation { context: u64 },
    /// A global of module `module` of the context with this id.
    Global { context: u64, module: u32 },
    /// The host's device mapping of page-locked memory that the context
    /// with this id allocated.
    PageLocked { context: u64 },
}

impl Owner {
    fn context(self) -> u64 {
        match self {
            Owner::Allocation { context }
            | Owner::Global { context, .. }
            | Owner::PageLocked { context } => context,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    /// Never 0. A length rather than an end: a range may reach 2^64.
    len: u64,
    owner: Owner,
}

/// Disjoint address ranges by start.
#[derive(Debug, Default)]
pub(crate) struct RangeMap {
    ranges: BTreeMap<u64, Range>,
}

impl RangeMap {
    pub const fn new() -> Self {
        Self {
            ranges: BTreeMap::new(),
        }
    }

    /// The range holding `ptr`: `(start, len)`.
    fn find(&self, ptr: u64) -> Option<(u64, u64)> {
        self.find_range(ptr)
            .map(|(start, range)| (start, range.len))
    }

    fn find_range(&self, ptr: u64) -> Option<(u64, Range)> {
        let (start, range) = self.ranges.range(..=ptr).next_back()?;
        (ptr - start < range.len).then_some((*start, *range))
    }

    /// Whether `[ptr, ptr + len)` lies inside one range (overflow-safe). A
    /// zero-length query asks whether `ptr` lies in a range.
    pub fn contains(&self, ptr: u64, len: u64) -> bool {
        self.find(ptr)
            .is_some_and(|(start, range_len)| len <= range_len - (ptr - start))
    }

    /// Records `[start, start + len)`; nothing for an empty range. The host
    /// just handed these addresses out, so any range overlapping them is
    /// stale (its memory was freed by a path the guest did not see) and
    /// goes; that keeps the ranges disjoint, which `contains` relies on.
    pub fn insert(&mut self, start: u64, len: u64, owner: Owner) {
        if len == 0 {
            return;
        }
        let mut stale: Vec<u64> = Vec::new();
        if let Some((before, range)) = self.ranges.range(..start).next_back() {
            if start - before < range.len {
                stale.push(*before);
            }
        }
        let overlapping = match start.checked_add(len) {
            Some(end) => self.ranges.range(start..end),
            None => self.ranges.range(start..),
        };
        stale.extend(overlapping.map(|(s, _)| *s));
        for s in stale {
            if let Some(range) = self.ranges.remove(&s) {
                // Re-inserting the same global (looked up twice) is routine.
                if !(s == start && range.len == len && range.owner == owner) {
                    let (old_len, old_owner) = (range.len, range.owner);
                    log::debug!(
                        "rgpu: dropping device range {s:#x}+{old_len:#x} ({old_owner:?}), \
                         overlapped by {start:#x}+{len:#x}"
                    );
                }
            }
        }
        self.ranges.insert(start, Range { len, owner });
    }

    /// Whether `[ptr, ptr + len)` lies inside one page-locked range.
    pub fn is_page_locked(&self, ptr: u64, len: u64) -> bool {
        self.find_range(ptr).is_some_and(|(start, range)| {
            matches!(range.owner, Owner::PageLocked { .. }) && len <= range.len - (ptr - start)
        })
    }

    /// Forgets the allocation starting at `start` (`cuMemFree`); a global
    /// there stays.
    pub fn remove_allocation(&mut self, start: u64) {
        if let Some(range) = self.ranges.get(&start) {
            if matches!(range.owner, Owner::Allocation { .. }) {
                self.ranges.remove(&start);
            }
        }
    }

    /// Forgets the page-locked memory mapped at `start`.
    pub fn remove_page_locked(&mut self, start: u64) {
        if let Some(range) = self.ranges.get(&start) {
            if matches!(range.owner, Owner::PageLocked { .. }) {
                self.ranges.remove(&start);
            }
        }
    }

    /// Keeps only the ranges whose owner `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(Owner) -> bool) {
        self.ranges.retain(|_, range| keep(range.owner));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ranges.len()
    }
}

/// One map per address space (carrier index).
static SPACES: RwLock<Vec<RangeMap>> = RwLock::new(Vec::new());

// A panic elsewhere while the lock was held leaves valid maps (each change
// is one BTreeMap or Vec operation), so a poisoned lock is used as it is.
fn read() -> RwLockReadGuard<'static, Vec<RangeMap>> {
    SPACES.read().unwrap_or_else(PoisonError::into_inner)
}

fn write() -> RwLockWriteGuard<'static, Vec<RangeMap>> {
    SPACES.write().unwrap_or_else(PoisonError::into_inner)
}

/// Records a range in `space`'s map, making the map on first use.
fn insert(space: usize, start: u64, len: u64, owner: Owner) {
    let mut spaces = write();
    if spaces.len() <= space {
        spaces.resize_with(space + 1, RangeMap::new);
    }
    if let Some(map) = spaces.get_mut(space) {
        map.insert(start, len, owner);
    }
}

/// A device allocation of context `context` (its `Context::id`), in address
/// space `space` (its `Context::space`).
pub(crate) fn add_allocation(space: usize, context: u64, ptr: u64, size: u64) {
    insert(space, ptr, size, Owner::Allocation { context });
}

/// A global of module `module` of context `context`, in `space`.
pub(crate) fn add_global(space: usize, context: u64, module: u32, ptr: u64, size: u64) {
    insert(space, ptr, size, Owner::Global { context, module });
}

/// A freed allocation of `space`.
pub(crate) fn remove_allocation(space: usize, ptr: u64) {
    if let Some(map) = write().get_mut(space) {
        map.remove_allocation(ptr);
    }
}

/// The device mapping of page-locked memory of context `context`, in
/// `space`: copies and memsets may name it as device memory, as natively.
pub(crate) fn add_page_locked(space: usize, context: u64, start: u64, size: u64) {
    insert(space, start, size, Owner::PageLocked { context });
}

/// Freed page-locked memory of `space`, mapped at `start`.
pub(crate) fn remove_page_locked(space: usize, start: u64) {
    if let Some(map) = write().get_mut(space) {
        map.remove_page_locked(start);
    }
}

/// Whether `[ptr, ptr + len)` of `space` is page-locked memory of this
/// process (whose address is a device address too).
pub(crate) fn is_page_locked(space: usize, ptr: u64, len: u64) -> bool {
    read()
        .get(space)
        .is_some_and(|map| map.is_page_locked(ptr, len))
}

/// The globals of an unloaded module.
pub(crate) fn forget_module(context: u64, module: u32) {
    let gone = Owner::Global { context, module };
    for map in write().iter_mut() {
        map.retain(|owner| owner != gone);
    }
}

/// Everything of a closed or reset context: the host freed it all.
pub(crate) fn forget_context(context: u64) {
    for map in write().iter_mut() {
        map.retain(|owner| owner.context() != context);
    }
}

/// `CUDA_ERROR_INVALID_VALUE` unless each `(ptr, len)` lies inside one known
/// range of `space`; one lock for all of them.
pub(crate) fn check(space: usize, device: &[(u64, u64)]) -> Result<(), u32> {
    let spaces = read();
    let contains = |ptr: u64, len: u64| spaces.get(space).is_some_and(|m| m.contains(ptr, len));
    match device.iter().find(|(ptr, len)| !contains(*ptr, *len)) {
        None => Ok(()),
        Some((ptr, len)) => {
            log::debug!("rgpu: device range {ptr:#x}+{len:#x} is not this process's memory");
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

/// Where a pointer is, seen from one address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// Device memory of the asking space.
    Here,
    /// Device memory of another space only: an allocation or global of the
    /// context with id `context`.
    Elsewhere { space: usize, context: u64 },
    /// No device memory this process knows: host memory, or nothing.
    Nowhere,
}

/// Where each `(ptr, len)` is, seen from `space`: its own map first (two
/// daemons' addresses may coincide, and a context means its own device's
/// then), then the other spaces in order. `CUDA_ERROR_INVALID_VALUE` when
/// `ptr` lies in a range but `[ptr, ptr + len)` runs past it. One lock for
/// all of them.
pub(crate) fn locate<const N: usize>(
    space: usize,
    device: [(u64, u64); N],
) -> Result<[Location; N], u32> {
    let spaces = read();
    let mut found = [Location::Nowhere; N];
    for ((ptr, len), location) in device.iter().zip(found.iter_mut()) {
        let own = spaces.get(space).into_iter().map(|map| (space, map));
        let others = spaces.iter().enumerate().filter(|(s, _)| *s != space);
        for (s, map) in own.chain(others) {
            let Some((start, range)) = map.find_range(*ptr) else {
                continue;
            };
            if *len > range.len - (ptr - start) {
                log::debug!("rgpu: device range {ptr:#x}+{len:#x} runs past its allocation");
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            *location = if s == space {
                Location::Here
            } else {
                Location::Elsewhere {
                    space: s,
                    context: range.owner.context(),
                }
            };
            break;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Owner = Owner::Allocation { context: 1 };
    const B: Owner = Owner::Allocation { context: 2 };
    const G: Owner = Owner::Global {
        context: 1,
        module: 7,
    };

    #[test]
    fn contains_needs_the_whole_span_in_one_range() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x100, A);
        map.insert(0x1100, 0x100, A);
        assert!(map.contains(0x1000, 0x100));
        assert!(map.contains(0x1080, 0x80));
        assert!(map.contains(0x10ff, 1));
        assert!(!map.contains(0x1080, 0x81), "adjacent ranges are not one");
        assert!(!map.contains(0x0fff, 2), "starts before");
        assert!(!map.contains(0x1200, 1), "past the end");
        assert!(!map.contains(0, 1));
        assert!(!map.contains(0x1000, 0x200));
    }

    #[test]
    fn zero_length_asks_for_the_pointer_only() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x100, A);
        assert!(map.contains(0x1000, 0));
        assert!(map.contains(0x10ff, 0));
        assert!(!map.contains(0x1100, 0));
        assert!(!map.contains(0xfff, 0));
    }

    #[test]
    fn arithmetic_never_overflows() {
        let mut map = RangeMap::new();
        map.insert(u64::MAX - 0xff, 0x100, A);
        assert!(map.contains(u64::MAX - 0xff, 0x100));
        assert!(map.contains(u64::MAX, 1));
        assert!(!map.contains(u64::MAX, 2));
        assert!(!map.contains(u64::MAX - 0xff, u64::MAX));
        map.insert(0x1000, 0x100, A);
        assert!(!map.contains(0x1080, u64::MAX));
        // A range reaching 2^64, and an insert whose end overflows.
        map.insert(u64::MAX - 0x10, u64::MAX, B);
        assert!(map.contains(u64::MAX - 0x10, 0x11));
        assert!(!map.contains(u64::MAX - 0xff, 1), "dropped as overlapped");
        assert!(map.contains(0x1000, 0x100));
    }

    #[test]
    fn empty_ranges_are_not_recorded() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0, A);
        assert_eq!(map.len(), 0);
        assert!(!map.contains(0x1000, 0));
    }

    #[test]
    fn a_new_range_drops_the_ranges_it_overlaps() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x100, A);
        map.insert(0x1200, 0x100, A);
        map.insert(0x1400, 0x100, A);
        map.insert(0x1080, 0x200, B);
        assert_eq!(map.len(), 2);
        assert!(!map.contains(0x1000, 1));
        assert!(!map.contains(0x1200, 0x100), "swallowed range dropped");
        assert!(map.contains(0x1080, 0x200));
        assert!(map.contains(0x1400, 0x100), "untouched");
        // The same range again replaces it.
        map.insert(0x1080, 0x200, G);
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn free_forgets_allocations_only() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x100, A);
        map.insert(0x2000, 0x100, G);
        map.remove_allocation(0x1000);
        map.remove_allocation(0x2000);
        map.remove_allocation(0x3000);
        assert!(!map.contains(0x1000, 1));
        assert!(map.contains(0x2000, 1));
    }

    #[test]
    fn modules_and_contexts_take_their_ranges_along() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x100, A);
        map.insert(0x2000, 0x100, G);
        map.insert(
            0x3000,
            0x100,
            Owner::Global {
                context: 1,
                module: 8,
            },
        );
        map.insert(0x4000, 0x100, B);
        let gone = G;
        map.retain(|o| o != gone);
        assert!(!map.contains(0x2000, 1));
        assert!(map.contains(0x3000, 1));
        map.retain(|o| o.context() != 1);
        assert_eq!(map.len(), 1);
        assert!(map.contains(0x4000, 0x100));
    }

    #[test]
    fn checks_and_locations_share_the_process_maps() {
        // The one static set of maps: addresses no other test of this crate
        // uses.
        let base = 0x5eed_0000_0000_u64;
        add_allocation(0, 901, base, 0x1000);
        add_global(0, 902, 3, base + 0x10_0000, 0x40);
        assert_eq!(
            check(0, &[(base, 0x1000), (base + 0x10_0000, 0x40)]),
            Ok(())
        );
        assert_eq!(
            check(0, &[(base, 0x1000), (base + 0x10_0000, 0x41)]),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(check(0, &[]), Ok(()));
        assert_eq!(
            locate(0, [(base + 8, 8), (0x1234, 8)]),
            Ok([Location::Here, Location::Nowhere])
        );
        assert_eq!(
            locate(0, [(0x1234, 9), (base + 0xff8, 9)]),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        remove_allocation(0, base);
        assert_eq!(check(0, &[(base, 1)]), Err(CUDA_ERROR_INVALID_VALUE));
        forget_module(902, 4);
        assert_eq!(check(0, &[(base + 0x10_0000, 1)]), Ok(()));
        forget_context(902);
        assert_eq!(
            check(0, &[(base + 0x10_0000, 1)]),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn each_space_has_its_own_addresses() {
        // Two daemons handing out the same address, and one only space 2 has.
        let base = 0x5eee_0000_0000_u64;
        add_allocation(1, 911, base, 0x1000);
        add_allocation(2, 912, base, 0x2000);
        add_allocation(2, 912, base + 0x10_0000, 0x100);
        assert_eq!(check(1, &[(base, 0x1000)]), Ok(()));
        assert_eq!(check(1, &[(base, 0x1001)]), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(check(2, &[(base, 0x2000)]), Ok(()));
        assert_eq!(
            check(1, &[(base + 0x10_0000, 1)]),
            Err(CUDA_ERROR_INVALID_VALUE),
            "another space's memory is not this space's"
        );
        // Coinciding addresses mean the asking space's own.
        assert_eq!(locate(1, [(base, 0x800)]), Ok([Location::Here]));
        assert_eq!(locate(2, [(base, 0x1800)]), Ok([Location::Here]));
        assert_eq!(
            locate(1, [(base, 0x1800)]),
            Err(CUDA_ERROR_INVALID_VALUE),
            "runs past the asking space's range"
        );
        assert_eq!(
            locate(1, [(base + 0x10_0040, 0x40), (base, 1)]),
            Ok([
                Location::Elsewhere {
                    space: 2,
                    context: 912
                },
                Location::Here
            ])
        );
        // A space never seen asks the others.
        assert_eq!(
            locate(7, [(base + 0x10_0000, 1)]),
            Ok([Location::Elsewhere {
                space: 2,
                context: 912
            }])
        );
        assert_eq!(check(7, &[(base, 1)]), Err(CUDA_ERROR_INVALID_VALUE));
        remove_allocation(1, base);
        assert_eq!(check(2, &[(base, 1)]), Ok(()), "only space 1's went");
        forget_context(912);
        assert_eq!(locate(1, [(base, 1)]), Ok([Location::Nowhere]));
    }
}

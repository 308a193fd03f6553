//! The driver side of a split virtqueue (virtio 1.x, "Split Virtqueues"),
//! living in guest memory: descriptor table, available ring and used ring.
//!
//! No EVENT_IDX and no indirect descriptors. The free-descriptor list and the
//! chains in flight are kept in private shadow arrays, so nothing the device
//! writes into shared memory can corrupt them.

use std::sync::atomic::{fence, AtomicU16, Ordering};

use thiserror::Error;

/// Entries of the control and cursor queues.
pub const QUEUE_SIZE: u16 = 256;

const DESC_SIZE: u64 = 16;
const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Part alignment: a page, which satisfies both legacy and 1.x layouts.
const PART_ALIGN: u64 = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum VirtqueueError {
    #[error("a request needs at least one buffer")]
    Empty,
    #[error("not enough free descriptors: {needed} needed, {free} free")]
    Full { needed: usize, free: u16 },
    #[error("queue size {0} is not a power of two between 1 and 32768")]
    BadSize(u16),
    #[error("the device returned descriptor {0}, which is not the head of a request in flight")]
    BadUsedId(u32),
    #[error("the device's used index jumped from {last} to {now}")]
    BadUsedIndex { last: u16, now: u16 },
}

/// Where the three parts sit relative to the start of the queue's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// Bytes of memory the whole queue needs.
    pub bytes: u64,
}

const fn align_up(value: u64) -> u64 {
    (value + PART_ALIGN - 1) & !(PART_ALIGN - 1)
}

impl QueueLayout {
    pub fn new(size: u16) -> Result<Self, VirtqueueError> {
        if size == 0 || !size.is_power_of_two() {
            return Err(VirtqueueError::BadSize(size));
        }
        let n = u64::from(size);
        let desc = 0;
        let avail = align_up(DESC_SIZE * n);
        // flags, idx, ring[n], used_event
        let used = avail + align_up(6 + 2 * n);
        // flags, idx, ring[n] of {id u32, len u32}, avail_event
        let bytes = used + align_up(6 + 8 * n);
        Ok(Self {
            size,
            desc,
            avail,
            used,
            bytes,
        })
    }
}

/// The driver's view of one split virtqueue.
#[derive(Debug)]
pub struct SplitQueue {
    base: *mut u8,
    gpa: u64,
    layout: QueueLayout,
    /// Shadow of each descriptor's `next`: the free list and the chains.
    next: Vec<u16>,
    /// Descriptors in the chain whose head is the index; 0 = not in flight.
    chain_len: Vec<u16>,
    free_head: u16,
    num_free: u16,
    avail_idx: u16,
    last_used: u16,
}

// SAFETY: the queue memory belongs to this object on the driver side; the
// raw pointer is only an address into it and all access goes through
// `&mut self` or atomics.
unsafe impl Send for SplitQueue {}

impl SplitQueue {
    /// Builds an empty queue in `layout.bytes` bytes at `base` (guest
    /// address `gpa`), zeroing them.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `layout.bytes` bytes,
    /// 4 KiB aligned, for as long as the queue lives, and nothing else in
    /// this process may write there.
    pub unsafe fn new(base: *mut u8, gpa: u64, size: u16) -> Result<Self, VirtqueueError> {
        let layout = QueueLayout::new(size)?;
        // SAFETY: the caller guarantees `layout.bytes` writable bytes at `base`.
        unsafe { base.write_bytes(0, layout.bytes as usize) };
        let next = (1..=size).map(|i| i % size).collect();
        Ok(Self {
            base,
            gpa,
            layout,
            next,
            chain_len: vec![0; usize::from(size)],
            free_head: 0,
            num_free: size,
            avail_idx: 0,
            last_used: 0,
        })
    }

    pub fn size(&self) -> u16 {
        self.layout.size
    }

    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    pub fn layout(&self) -> QueueLayout {
        self.layout
    }

    /// Guest addresses of the descriptor table, available and used rings.
    pub fn gpas(&self) -> (u64, u64, u64) {
        (
            self.gpa + self.layout.desc,
            self.gpa + self.layout.avail,
            self.gpa + self.layout.used,
        )
    }

    /// Addresses of the same parts in this process (vhost-user wants these).
    pub fn host_addrs(&self) -> (u64, u64, u64) {
        let base = self.base as u64;
        (
            base + self.layout.desc,
            base + self.layout.avail,
            base + self.layout.used,
        )
    }

    fn ptr(&self, offset: u64) -> *mut u8 {
        debug_assert!(offset < self.layout.bytes);
        // SAFETY: every caller passes an offset inside the queue's memory,
        // computed from the layout and an index below the queue size.
        unsafe { self.base.add(offset as usize) }
    }

    fn atomic_u16(&self, offset: u64) -> &AtomicU16 {
        // SAFETY: the offset is 2-aligned inside the queue's memory, which
        // lives as long as `self`; the device only accesses it atomically
        // or with plain aligned 16-bit accesses.
        unsafe { AtomicU16::from_ptr(self.ptr(offset).cast()) }
    }

    fn write_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let p = self.ptr(self.layout.desc + DESC_SIZE * u64::from(index));
        // SAFETY: a descriptor slot inside the table (index < size), 16-byte
        // aligned; the device does not read it before the avail index says so.
        unsafe {
            p.cast::<u64>().write_volatile(addr.to_le());
            p.add(8).cast::<u32>().write_volatile(len.to_le());
            p.add(12).cast::<u16>().write_volatile(flags.to_le());
            p.add(14).cast::<u16>().write_volatile(next.to_le());
        }
    }

    /// Chains the buffers (device-readable first, then device-writable) and
    /// makes the chain available; returns its head. The caller kicks the
    /// device if [`Self::needs_kick`] says so.
    pub fn add(
        &mut self,
        readable: &[(u64, u32)],
        writable: &[(u64, u32)],
    ) -> Result<u16, VirtqueueError> {
        let needed = readable.len() + writable.len();
        if needed == 0 {
            return Err(VirtqueueError::Empty);
        }
        if needed > usize::from(self.num_free) {
            return Err(VirtqueueError::Full {
                needed,
                free: self.num_free,
            });
        }
        let head = self.free_head;
        let mut index = head;
        let buffers = readable
            .iter()
            .map(|b| (b, 0))
            .chain(writable.iter().map(|b| (b, VIRTQ_DESC_F_WRITE)));
        for (i, (&(addr, len), write_flag)) in buffers.enumerate() {
            let next = self.next[usize::from(index)];
            let last = i + 1 == needed;
            let flags = write_flag | if last { 0 } else { VIRTQ_DESC_F_NEXT };
            self.write_desc(index, addr, len, flags, if last { 0 } else { next });
            if last {
                self.free_head = next;
            } else {
                index = next;
            }
        }
        // `needed` <= num_free <= size <= u16::MAX.
        let count = needed as u16;
        self.num_free -= count;
        self.chain_len[usize::from(head)] = count;

        let slot = u64::from(self.avail_idx % self.layout.size);
        let ring_entry = self.ptr(self.layout.avail + 4 + 2 * slot);
        // SAFETY: an avail ring slot inside the queue memory, 2-aligned.
        unsafe { ring_entry.cast::<u16>().write_volatile(head.to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The descriptors and the ring entry must be visible before the index.
        fence(Ordering::Release);
        self.atomic_u16(self.layout.avail + 2)
            .store(self.avail_idx.to_le(), Ordering::Release);
        Ok(head)
    }

    /// Whether the device wants a notification for what was just made
    /// available (it may set `VIRTQ_USED_F_NO_NOTIFY` while it polls).
    pub fn needs_kick(&self) -> bool {
        // The avail index store must be ordered before reading the flags.
        fence(Ordering::SeqCst);
        let flags = u16::from_le(self.atomic_u16(self.layout.used).load(Ordering::Relaxed));
        flags & VIRTQ_USED_F_NO_NOTIFY == 0
    }

    /// The next completed request, `(head, bytes written by the device)`,
    /// with its descriptors returned to the free list.
    pub fn poll_used(&mut self) -> Result<Option<(u16, u32)>, VirtqueueError> {
        let now = u16::from_le(
            self.atomic_u16(self.layout.used + 2)
                .load(Ordering::Acquire),
        );
        if now == self.last_used {
            return Ok(None);
        }
        let pending = now.wrapping_sub(self.last_used);
        let in_flight = self.layout.size - self.num_free;
        if pending > in_flight {
            return Err(VirtqueueError::BadUsedIndex {
                last: self.last_used,
                now,
            });
        }
        let slot = u64::from(self.last_used % self.layout.size);
        let elem = self.ptr(self.layout.used + 4 + 8 * slot);
        // SAFETY: a used ring element inside the queue memory, 4-aligned; the
        // acquire load above orders this read after the device's write.
        let (id, len) = unsafe {
            (
                u32::from_le(elem.cast::<u32>().read_volatile()),
                u32::from_le(elem.add(4).cast::<u32>().read_volatile()),
            )
        };
        let head = u16::try_from(id)
            .ok()
            .filter(|h| *h < self.layout.size)
            .ok_or(VirtqueueError::BadUsedId(id))?;
        let count = self.chain_len[usize::from(head)];
        if count == 0 {
            return Err(VirtqueueError::BadUsedId(id));
        }
        self.last_used = self.last_used.wrapping_add(1);
        self.chain_len[usize::from(head)] = 0;
        let mut tail = head;
        for _ in 1..count {
            tail = self.next[usize::from(tail)];
        }
        self.next[usize::from(tail)] = self.free_head;
        self.free_head = head;
        self.num_free += count;
        Ok(Some((head, len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Page-aligned backing memory for a queue.
    struct Memory(Vec<u64>);

    impl Memory {
        fn new(bytes: u64) -> Self {
            // Over-allocate so the queue can start on a page.
            Self(vec![0u64; (bytes as usize + 4096) / 8])
        }
        fn base(&mut self) -> *mut u8 {
            let p = self.0.as_mut_ptr().cast::<u8>();
            // SAFETY: stays inside the over-allocated vector.
            unsafe { p.add(p.align_offset(4096)) }
        }
    }

    /// Plays the device: reads what the driver published, writes used
    /// entries, directly on the memory.
    struct Device {
        base: *mut u8,
        layout: QueueLayout,
        last_avail: u16,
        used_idx: u16,
    }

    #[derive(Debug, PartialEq)]
    struct Desc {
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    }

    impl Device {
        fn read<T: Copy>(&self, offset: u64) -> T {
            // SAFETY: test offsets stay inside the queue memory.
            unsafe { self.base.add(offset as usize).cast::<T>().read_volatile() }
        }
        fn write<T: Copy>(&self, offset: u64, v: T) {
            // SAFETY: as above.
            unsafe { self.base.add(offset as usize).cast::<T>().write_volatile(v) }
        }
        fn desc(&self, i: u16) -> Desc {
            let o = self.layout.desc + 16 * u64::from(i);
            Desc {
                addr: self.read(o),
                len: self.read(o + 8),
                flags: self.read(o + 12),
                next: self.read(o + 14),
            }
        }
        /// The next available chain as its descriptors.
        fn pop(&mut self) -> Option<(u16, Vec<Desc>)> {
            let idx: u16 = self.read(self.layout.avail + 2);
            if idx == self.last_avail {
                return None;
            }
            let slot = u64::from(self.last_avail % self.layout.size);
            let head: u16 = self.read(self.layout.avail + 4 + 2 * slot);
            self.last_avail = self.last_avail.wrapping_add(1);
            let mut chain = vec![];
            let mut i = head;
            loop {
                let d = self.desc(i);
                let more = d.flags & VIRTQ_DESC_F_NEXT != 0;
                let next = d.next;
                chain.push(d);
                if !more {
                    break;
                }
                i = next;
            }
            Some((head, chain))
        }
        fn complete(&mut self, head: u32, len: u32) {
            let slot = u64::from(self.used_idx % self.layout.size);
            self.write(self.layout.used + 4 + 8 * slot, head);
            self.write(self.layout.used + 8 + 8 * slot, len);
            self.used_idx = self.used_idx.wrapping_add(1);
            fence(Ordering::Release);
            self.write(self.layout.used + 2, self.used_idx);
        }
    }

    fn setup(size: u16) -> (Memory, SplitQueue, Device) {
        let layout = QueueLayout::new(size).unwrap();
        let mut mem = Memory::new(layout.bytes);
        let base = mem.base();
        // SAFETY: `mem` outlives the queue in every test and holds
        // `layout.bytes` aligned bytes at `base`.
        let queue = unsafe { SplitQueue::new(base, 0x10_0000, size) }.unwrap();
        let device = Device {
            base,
            layout,
            last_avail: 0,
            used_idx: 0,
        };
        (mem, queue, device)
    }

    #[test]
    fn layout_is_aligned() {
        let l = QueueLayout::new(256).unwrap();
        assert_eq!((l.desc, l.avail, l.used, l.bytes), (0, 4096, 8192, 12288));
        assert_eq!(QueueLayout::new(3), Err(VirtqueueError::BadSize(3)));
        assert_eq!(QueueLayout::new(0), Err(VirtqueueError::BadSize(0)));
    }

    #[test]
    fn device_sees_the_chain_and_driver_gets_completion() {
        let (_mem, mut q, mut dev) = setup(QUEUE_SIZE);
        let (desc_gpa, avail_gpa, used_gpa) = q.gpas();
        assert_eq!(
            (desc_gpa, avail_gpa, used_gpa),
            (0x10_0000, 0x10_1000, 0x10_2000)
        );
        let head = q
            .add(&[(0x1000, 24), (0x2000, 8)], &[(0x3000, 64)])
            .unwrap();
        assert!(q.needs_kick());
        assert_eq!(q.num_free(), QUEUE_SIZE - 3);
        let (h, chain) = dev.pop().unwrap();
        assert_eq!(h, head);
        assert_eq!(chain.len(), 3);
        assert_eq!((chain[0].addr, chain[0].len), (0x1000, 24));
        assert_eq!(chain[0].flags, VIRTQ_DESC_F_NEXT);
        assert_eq!((chain[1].addr, chain[1].len), (0x2000, 8));
        assert_eq!(chain[2].flags, VIRTQ_DESC_F_WRITE);
        assert_eq!((chain[2].addr, chain[2].len), (0x3000, 64));
        assert!(dev.pop().is_none());

        assert_eq!(q.poll_used(), Ok(None));
        dev.complete(head.into(), 40);
        assert_eq!(q.poll_used(), Ok(Some((head, 40))));
        assert_eq!(q.poll_used(), Ok(None));
        assert_eq!(q.num_free(), QUEUE_SIZE);
    }

    #[test]
    fn full_queue_refuses_and_recycles_out_of_order() {
        let (_mem, mut q, mut dev) = setup(8);
        let a = q.add(&[(1, 1)], &[(2, 2)]).unwrap();
        let b = q.add(&[(3, 3)], &[(4, 4), (5, 5)]).unwrap();
        let c = q.add(&[(6, 6)], &[(7, 7)]).unwrap();
        assert_eq!(q.num_free(), 1);
        assert_eq!(
            q.add(&[(8, 8)], &[(9, 9)]),
            Err(VirtqueueError::Full { needed: 2, free: 1 })
        );
        assert_eq!(q.add(&[], &[]), Err(VirtqueueError::Empty));
        for _ in 0..3 {
            dev.pop().unwrap();
        }
        // The device completes them in another order than it got them.
        dev.complete(b.into(), 5);
        dev.complete(c.into(), 7);
        dev.complete(a.into(), 2);
        assert_eq!(q.poll_used(), Ok(Some((b, 5))));
        assert_eq!(q.poll_used(), Ok(Some((c, 7))));
        assert_eq!(q.poll_used(), Ok(Some((a, 2))));
        assert_eq!(q.num_free(), 8);
        // Many rounds wrap both indices and reuse every descriptor.
        for round in 0..1000u32 {
            let h = q
                .add(&[(u64::from(round), round)], &[(1, 1), (2, 2)])
                .unwrap();
            let (ph, chain) = dev.pop().unwrap();
            assert_eq!(ph, h);
            assert_eq!(chain[0].len, round);
            assert_eq!(chain.len(), 3);
            dev.complete(h.into(), round);
            assert_eq!(q.poll_used(), Ok(Some((h, round))));
        }
        assert_eq!(q.num_free(), 8);
    }

    #[test]
    fn bad_device_answers_are_errors() {
        let (_mem, mut q, mut dev) = setup(8);
        let head = q.add(&[(1, 1)], &[]).unwrap();
        dev.pop().unwrap();
        dev.complete(u32::from(head) + 1, 0);
        assert_eq!(
            q.poll_used(),
            Err(VirtqueueError::BadUsedId(u32::from(head) + 1))
        );

        let (_mem, mut q, dev) = setup(8);
        q.add(&[(1, 1)], &[]).unwrap();
        dev.write(dev.layout.used + 2, 5u16);
        assert_eq!(
            q.poll_used(),
            Err(VirtqueueError::BadUsedIndex { last: 0, now: 5 })
        );
    }

    #[test]
    fn no_notify_flag_suppresses_kicks() {
        let (_mem, mut q, dev) = setup(8);
        dev.write(dev.layout.used, VIRTQ_USED_F_NO_NOTIFY);
        q.add(&[(1, 1)], &[]).unwrap();
        assert!(!q.needs_kick());
        dev.write(dev.layout.used, 0u16);
        assert!(q.needs_kick());
    }
}

//! The shared-memory channel of a session: a command ring the host worker
//! drains, a reply area it answers in, and a bounce area for data that must
//! come back through guest memory the application did not allocate with us.
//!
//! All of it lives in one guest blob described by
//! [`crate::command::ChannelLayout`]. The control header holds three counters
//! on separate cache lines:
//!
//! - `produced` (guest writes): bytes of commands published in the ring;
//! - `consumed` (host writes): bytes the host has executed (space before it
//!   may be reused, including data carried inline in the ring);
//! - `host_idle` (host writes before it blocks): [`HOST_IDLE_DOORBELL`],
//!   the guest must ring the doorbell (a `SUBMIT_3D` with `Doorbell`) after
//!   publishing; [`HOST_IDLE_WAKE_WORD`], it adds one to the wake word
//!   ([`OFFSET_WAKE`]) and wakes it (`crate::futex::wake`) instead.
//!
//! The guest stores `produced` then loads `host_idle`; the host stores
//! `host_idle` then loads `produced`; both with sequentially consistent
//! ordering, so one of them always sees the other (no lost wake-up).
//!
//! The wake word spares a local guest (one that shares the host's kernel
//! and memory file: local mode) the doorbell's way in, which passes the
//! connection process's queue thread and the worker's serving thread before
//! it reaches the session. Such a guest sets [`GUEST_WAKES_BY_FUTEX`] in
//! [`OFFSET_GUEST_FEATURES`] before it binds; only then does the host sleep
//! on the word (and its own mailbox's senders bump and wake the same word).
//! A guest that sets the flag without sharing the kernel, or stops waking,
//! only leaves its own session asleep until the host's next look.
//!
//! A guest that sets [`GUEST_READS_IDLE_EPOCH`] gets the host's idle spells
//! numbered: `host_idle` is then [`idle_value`]`(mode, epoch)`, a new epoch
//! (from 1) each time the host goes idle, the mode in the low two bits
//! ([`idle_mode`]). The guest rings (or wakes) once per epoch: a second
//! publish before the host is awake needs no second doorbell, as the host
//! stores a new epoch, then loads `produced`, before it sleeps again. A
//! value without an epoch (1 or 2, from a host that does not number them)
//! is rung every time.
//!
//! A command never wraps around the ring's end: the guest fills the tail with
//! a `Padding` command instead. Ring size is a power of two.
//!
//! Every command the guest writes into the ring carries, in its header's
//! last word, the stamp of its position ([`ring_stamp`] with the key the
//! guest put at [`OFFSET_STAMP_KEY`]), stored last with release. The host
//! polls the word where the next command goes, so it sees a new command
//! with the one cache line that holds it, not `produced`'s line first and
//! then the command's; `produced` still says how far the guest published
//! (for the doorbell rule above, and for writers that stamp nothing). The
//! key makes a stale or data-filled slot that reads as the stamp of a
//! position a 2^-64 accident; a guest that forges one confuses only itself.
//! The host moves `consumed` past a `Padding` (which may carry the data of
//! the command after it) only once that command has run, or once
//! `produced` shows nothing follows the `Padding` (a filled ring tail).
//!
//! The rest of the control header, from [`OFFSET_COMPLETIONS`], is the
//! completion table (queries that never wait): the host publishes there
//! which events and streams it has seen complete, so `cuEventQuery` and
//! `cuStreamQuery` are answered in the guest without a round trip. A slot
//! is a tag (what it describes: [`completion_tag`], 0 for none) and a
//! position: everything the item had been given up to that ring position
//! (the host's `consumed` when it looked) is complete. The host writes the
//! position before the tag; the guest reads tag, position, tag, and trusts
//! the position only if both tags are its item's. Items hash to slots
//! ([`completion_slot`]); one that finds its slot taken by another item is
//! asked about through the ring, as before.

/// "RGCH" little-endian, at the start of the control header.
pub const CHANNEL_MAGIC: u32 = 0x4843_4752;
pub const HEADER_SIZE: u64 = 4096;
pub const OFFSET_MAGIC: u64 = 0;
pub const OFFSET_VERSION: u64 = 4;
pub const OFFSET_PRODUCED: u64 = 64;
pub const OFFSET_CONSUMED: u64 = 128;
pub const OFFSET_HOST_IDLE: u64 = 192;
/// The guest's key for [`ring_stamp`] (written before it binds).
pub const OFFSET_STAMP_KEY: u64 = 256;
/// The wake word, a `u32` (a futex): bumped and woken by whoever wants the
/// host's worker, asleep with [`HOST_IDLE_WAKE_WORD`], to look again.
pub const OFFSET_WAKE: u64 = 320;
/// The guest's feature bits (`u64`, written before it binds).
pub const OFFSET_GUEST_FEATURES: u64 = 384;
/// The guest wakes the host through [`OFFSET_WAKE`] (it shares the host's
/// kernel and the channel's memory file).
pub const GUEST_WAKES_BY_FUTEX: u64 = 1;
/// The guest reads numbered idle spells in `host_idle` ([`idle_value`]).
pub const GUEST_READS_IDLE_EPOCH: u64 = 2;

/// `host_idle` values: the host is running (it will see what is published).
pub const HOST_AWAKE: u64 = 0;
/// The host sleeps until a `Doorbell` reaches it.
pub const HOST_IDLE_DOORBELL: u64 = 1;
/// The host sleeps on the wake word.
pub const HOST_IDLE_WAKE_WORD: u64 = 2;

/// `host_idle` for idle spell `epoch` (0: not numbered) in `mode`
/// ([`HOST_IDLE_DOORBELL`] or [`HOST_IDLE_WAKE_WORD`]).
pub const fn idle_value(mode: u64, epoch: u64) -> u64 {
    (epoch << 2) | mode
}

/// The mode of a `host_idle` value ([`HOST_AWAKE`] for 0).
pub const fn idle_mode(value: u64) -> u64 {
    value & 3
}

/// The stamp of a command at ring position `position` (bytes since the
/// channel was bound): injective in the position (commands start at
/// multiples of 8), never 0.
pub const fn ring_stamp(key: u64, position: u64) -> u64 {
    (position ^ key) | 1
}

/// Where the completion table starts in the control header.
pub const OFFSET_COMPLETIONS: u64 = 512;
/// A slot: tag `u64`, then position `u64`.
pub const COMPLETION_SLOT_SIZE: u64 = 16;
/// Slots in the table.
pub const COMPLETION_SLOTS: u64 = (HEADER_SIZE - OFFSET_COMPLETIONS) / COMPLETION_SLOT_SIZE;
/// A position meaning "the host could not tell (an error): ask it".
pub const COMPLETION_FAILED: u64 = u64::MAX;

/// What a completion slot describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum CompletionKind {
    Event = 1,
    Stream = 2,
}

/// The tag of an event's or a stream's slot (never 0).
pub const fn completion_tag(kind: CompletionKind, handle: u32) -> u64 {
    ((kind as u64) << 32) | handle as u64
}

/// The slot of `tag`, below [`COMPLETION_SLOTS`]: the handle's, modulo the
/// table (the guest hands out handles one after another, events and streams
/// alike, so live ones seldom share a slot).
pub const fn completion_slot(tag: u64) -> u64 {
    (tag & 0xffff_ffff) % COMPLETION_SLOTS
}

/// The byte offset of `tag`'s slot from the header's start.
pub const fn completion_offset(tag: u64) -> u64 {
    OFFSET_COMPLETIONS + completion_slot(tag) * COMPLETION_SLOT_SIZE
}

/// The reply record at the start of the reply area: the sequence number is
/// written last (release), so a guest that reads it (acquire) sees the rest.
///
/// | offset | field |
/// | --- | --- |
/// | 0 | `seq` u64 |
/// | 8 | `result` u32 (a CUDA result code) |
/// | 12 | `len` u32: payload bytes |
/// | 16 | `console_len` u32: console bytes (protocol version 2) |
/// | 20 | reserved, zero |
/// | 24 | payload (`len` bytes), then console bytes (`console_len` bytes) |
///
/// Console bytes are what the host's GPU driver printed on the session's
/// behalf (device `printf`, flushed at synchronisation points): the guest
/// writes them to the application's stdout before it returns the reply.
/// `len + console_len` never exceeds the reply area after the header; output
/// that does not fit waits for the next reply. `console_len` is 0 in the
/// common case, so a reply costs one more load.
pub const REPLY_OFFSET_SEQ: u64 = 0;
pub const REPLY_OFFSET_RESULT: u64 = 8;
pub const REPLY_OFFSET_LEN: u64 = 12;
pub const REPLY_OFFSET_CONSOLE_LEN: u64 = 16;
pub const REPLY_OFFSET_PAYLOAD: u64 = 24;

pub const MIN_RING_SIZE: u64 = 4096;
pub const MAX_RING_SIZE: u64 = 1 << 30;
pub const MIN_REPLY_SIZE: u64 = 4096;

/// Checks a layout against the size of the blob that holds it: every part in
/// bounds, 8-byte aligned, not overlapping, ring size a power of two.
pub fn validate_layout(
    layout: &crate::command::ChannelLayout,
    blob_size: u64,
) -> Result<(), &'static str> {
    let parts = [
        (layout.header_offset, HEADER_SIZE),
        (layout.ring_offset, layout.ring_size),
        (layout.reply_offset, layout.reply_size),
        (layout.bounce_offset, layout.bounce_size),
    ];
    for (offset, size) in parts {
        if !offset.is_multiple_of(8) {
            return Err("channel part not 8-byte aligned");
        }
        match offset.checked_add(size) {
            Some(end) if end <= blob_size => {}
            _ => return Err("channel part outside its blob"),
        }
    }
    if !layout.ring_size.is_power_of_two()
        || !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&layout.ring_size)
    {
        return Err("ring size must be a power of two between 4 KiB and 1 GiB");
    }
    if layout.reply_size < MIN_REPLY_SIZE {
        return Err("reply area smaller than 4 KiB");
    }
    for (i, (a_off, a_len)) in parts.iter().enumerate() {
        for (b_off, b_len) in parts.iter().skip(i + 1) {
            if *a_len > 0 && *b_len > 0 && a_off < &(b_off + b_len) && b_off < &(a_off + a_len) {
                return Err("channel parts overlap");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::ChannelLayout;

    fn layout() -> ChannelLayout {
        ChannelLayout {
            resource_id: 1,
            header_offset: 0,
            ring_offset: HEADER_SIZE,
            ring_size: 1 << 20,
            reply_offset: HEADER_SIZE + (1 << 20),
            reply_size: 65536,
            bounce_offset: HEADER_SIZE + (1 << 20) + 65536,
            bounce_size: 1 << 20,
        }
    }

    #[test]
    fn completion_slots_fill_the_rest_of_the_header() {
        assert_eq!(COMPLETION_SLOTS, 224);
        const { assert!(OFFSET_COMPLETIONS >= OFFSET_STAMP_KEY + 64) };
        let mut used = std::collections::HashSet::new();
        for handle in 1..=64 {
            let kind = if handle % 2 == 0 {
                CompletionKind::Event
            } else {
                CompletionKind::Stream
            };
            let tag = completion_tag(kind, handle);
            assert_ne!(tag, 0);
            let offset = completion_offset(tag);
            assert!(offset + COMPLETION_SLOT_SIZE <= HEADER_SIZE);
            assert_eq!(offset % 8, 0);
            used.insert(offset);
        }
        // Sequential handles (an event and a stream never share one) take a
        // slot each.
        assert_eq!(used.len(), 64);
    }

    #[test]
    fn accepts_a_well_formed_layout() {
        let l = layout();
        assert_eq!(validate_layout(&l, l.bounce_offset + l.bounce_size), Ok(()));
    }

    #[test]
    fn rejects_bad_layouts() {
        let l = layout();
        let size = l.bounce_offset + l.bounce_size;
        assert!(validate_layout(&l, size - 1).is_err());
        let mut overlap = l;
        overlap.reply_offset = l.ring_offset + 8;
        assert!(validate_layout(&overlap, size).is_err());
        let mut odd_ring = l;
        odd_ring.ring_size = 3 << 12;
        assert!(validate_layout(&odd_ring, size).is_err());
        let mut unaligned = l;
        unaligned.bounce_offset += 1;
        assert!(validate_layout(&unaligned, size + 1).is_err());
        let mut overflow = l;
        overflow.bounce_offset = u64::MAX - 4;
        assert!(validate_layout(&overflow, size).is_err());
    }
}

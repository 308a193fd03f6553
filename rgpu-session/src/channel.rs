//! The host end of a session's channel (rgpu_proto::channel): reads commands
//! out of the guest's ring, publishes `consumed` and `host_idle`, and writes
//! reply records.
//!
//! `consumed` is owned by the host: the copy kept here is the truth, the one
//! in guest memory is only published for the guest.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use rgpu_proto::channel::{
    completion_offset, idle_value, ring_stamp, validate_layout, CHANNEL_MAGIC,
    GUEST_READS_IDLE_EPOCH, GUEST_WAKES_BY_FUTEX, HOST_AWAKE, HOST_IDLE_DOORBELL,
    HOST_IDLE_WAKE_WORD, OFFSET_CONSUMED, OFFSET_GUEST_FEATURES, OFFSET_HOST_IDLE, OFFSET_MAGIC,
    OFFSET_PRODUCED, OFFSET_STAMP_KEY, OFFSET_VERSION, OFFSET_WAKE, REPLY_OFFSET_CONSOLE_LEN,
    REPLY_OFFSET_LEN, REPLY_OFFSET_PAYLOAD, REPLY_OFFSET_RESULT, REPLY_OFFSET_SEQ,
};
use rgpu_proto::command::{
    decode_one, ChannelLayout, CommandHeader, Decoded, Opcode, COMMAND_ALIGN, COMMAND_HEADER_SIZE,
    COMMAND_STAMP_OFFSET,
};
use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;
use rgpu_proto::{Command, DecodeError, PROTOCOL_VERSION};

use crate::blob::SharedWord;
use crate::{Blob, BlobError};

/// Why a `BindChannel` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("channel blob {0} is not attached to the session")]
    NotAttached(u32),
    #[error("bad channel layout: {0}")]
    Layout(&'static str),
    #[error("channel header magic {0:#x}, expected {CHANNEL_MAGIC:#x}")]
    BadMagic(u32),
    #[error("channel protocol version {0}, expected {PROTOCOL_VERSION}")]
    BadVersion(u32),
    #[error("channel consumed counter {0} not aligned to commands")]
    BadConsumed(u64),
    #[error(transparent)]
    Blob(#[from] BlobError),
}

/// The host's cache line (blob offsets keep host alignment: blobs are
/// page runs).
const CACHE_LINE: u64 = 64;

/// What the ring holds at the host's position.
#[derive(Debug)]
pub enum RingEntry {
    /// A command; `Err` carries the reply number of a command whose header
    /// was sound but whose body did not decode.
    Command(Result<Decoded, (u64, DecodeError)>),
    /// The ring cannot be read at this position: the channel is poisoned.
    Bad(String),
}

pub struct Channel {
    blob: Arc<Blob>,
    layout: ChannelLayout,
    /// The reply record's header, checked at bind: a synchronous call
    /// waits while it is written.
    reply_header: ReplyHeader,
    /// The header's counters, checked at bind: read in the spin loop and
    /// written after every command.
    produced_word: SharedWord,
    consumed_word: SharedWord,
    host_idle_word: SharedWord,
    /// The wake word, where the guest said at bind that it wakes the host
    /// by futex (rgpu-proto `channel`): the worker sleeps on it.
    wake_word: Option<SharedWord<AtomicU32>>,
    /// The guest reads numbered idle spells (rgpu-proto `channel`).
    numbers_idle: bool,
    /// An idle spell is on (said since the host last said it is awake).
    in_idle_spell: Cell<bool>,
    /// The current or last idle spell's number.
    idle_epoch: Cell<u64>,
    consumed: u64,
    /// `produced` as last read. Everything below a value the guest
    /// published is whole commands, so the ring is read up to it without
    /// loading the counter again: its cache line is written by the guest
    /// after every command, and a load per command missed each time.
    produced_seen: Cell<u64>,
    /// Reused buffer for copying commands out of guest memory.
    scratch: Vec<u8>,
    /// The guest's key for ring stamps, read at bind.
    stamp_key: u64,
    /// The position last published in `consumed`.
    published: Cell<u64>,
    /// A position whose stamp is not believed: the command there poisoned
    /// the ring, and `produced` has not passed it yet.
    distrusted: Option<u64>,
    /// The stamp word of the command at `consumed`, found once per move
    /// (the spin loop polls it; finding it walks the blob's page runs).
    /// `None` where no header fits before the ring's end.
    next_stamp: Option<StampWord>,
}

/// A word of the channel's ring, checked in bounds and aligned by
/// [`Blob::atomic_u64`]; valid while the channel's blob is, which the
/// channel holds.
#[derive(Debug, Clone, Copy)]
struct StampWord(NonNull<AtomicU64>);

// SAFETY: the word lies in guest memory mapped as long as the channel's
// `Arc<Blob>` lives, and is only accessed atomically.
unsafe impl Send for StampWord {}

impl Channel {
    /// Checks a channel the guest asks to bind in `blob`.
    pub fn bind(blob: Arc<Blob>, layout: ChannelLayout) -> Result<Self, ChannelError> {
        validate_layout(&layout, blob.size()).map_err(ChannelError::Layout)?;
        let header = layout.header_offset;
        let mut word = [0u8; 4];
        blob.read(header + OFFSET_MAGIC, &mut word)?;
        let magic = u32::from_le_bytes(word);
        if magic != CHANNEL_MAGIC {
            return Err(ChannelError::BadMagic(magic));
        }
        blob.read(header + OFFSET_VERSION, &mut word)?;
        let version = u32::from_le_bytes(word);
        if version != PROTOCOL_VERSION {
            return Err(ChannelError::BadVersion(version));
        }
        // The counters must be usable as atomics before anything else runs.
        let produced_word = Blob::shared_word(&blob, header + OFFSET_PRODUCED)?;
        let host_idle_word = Blob::shared_word(&blob, header + OFFSET_HOST_IDLE)?;
        let consumed_word = Blob::shared_word(&blob, header + OFFSET_CONSUMED)?;
        // Resume where the guest says the host is (zero for a fresh channel).
        let consumed = consumed_word.load(Ordering::Acquire);
        if consumed & (COMMAND_ALIGN as u64 - 1) != 0 {
            return Err(ChannelError::BadConsumed(consumed));
        }
        let stamp_key = blob
            .atomic_u64(header + OFFSET_STAMP_KEY)?
            .load(Ordering::Acquire);
        let reply_header = ReplyHeader::find(&blob, &layout)?;
        let features = blob
            .atomic_u64(header + OFFSET_GUEST_FEATURES)?
            .load(Ordering::Acquire);
        let wake_word = if features & GUEST_WAKES_BY_FUTEX != 0 {
            Some(Blob::shared_word32(&blob, header + OFFSET_WAKE)?)
        } else {
            None
        };
        let last_epoch = host_idle_word.load(Ordering::Acquire) >> 2;
        let mut channel = Self {
            blob,
            layout,
            reply_header,
            produced_word,
            consumed_word,
            host_idle_word,
            wake_word,
            numbers_idle: features & GUEST_READS_IDLE_EPOCH != 0,
            in_idle_spell: Cell::new(false),
            // A channel bound again in the same blob goes on numbering
            // where the last host left (the guest may hold its last number).
            idle_epoch: Cell::new(last_epoch),
            consumed,
            produced_seen: Cell::new(consumed),
            scratch: Vec::new(),
            stamp_key,
            published: Cell::new(consumed),
            distrusted: None,
            next_stamp: None,
        };
        channel.find_next_stamp();
        channel.set_host_idle(false);
        Ok(channel)
    }

    pub fn resource_id(&self) -> u32 {
        self.blob.resource_id()
    }

    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The guest's `produced` counter. Where it has caught up with the
    /// host's position, that position is published: a trailing `Padding`
    /// (a ring tail the guest filled) is given back once `produced` says
    /// nothing follows it. A `Padding` found by its stamp alone may carry
    /// the data of a command the guest is still writing: its space is not
    /// the guest's again until that command has run (`advance`).
    pub fn produced(&self) -> u64 {
        let produced = self.produced_word.load(Ordering::SeqCst);
        self.produced_seen.set(produced);
        if produced == self.consumed && self.published.get() != self.consumed {
            self.publish_consumed();
        }
        produced
    }

    /// Whether the ring holds commands the host has not executed.
    pub fn has_work(&self) -> bool {
        self.readable() > 0
    }

    /// [`Self::has_work`] for the polls of a spinning worker: where the
    /// next command's stamp can tell, `produced` is not loaded. The guest
    /// stores `produced` after every command; each poll that loaded it took
    /// its line from the guest's core, so the host missed on it once per
    /// command, and the guest's next store waited to take the line back. A
    /// writer that stamps nothing is found by the next [`Self::has_work`].
    pub fn has_stamped_work(&self) -> bool {
        if self.produced_seen.get() > self.consumed {
            return true;
        }
        self.stamped().unwrap_or_else(|| self.has_work())
    }

    /// [`Self::has_work`] if `load_produced`, else [`Self::has_stamped_work`].
    pub fn has_work_by(&self, load_produced: bool) -> bool {
        match load_produced {
            true => self.has_work(),
            false => self.has_stamped_work(),
        }
    }

    /// Bytes from the host's position that hold published commands: up to
    /// `produced` as last read while it is ahead, else up to the ring's end
    /// if the next command's stamp is there, else up to `produced` read
    /// again (0: nothing yet).
    fn readable(&self) -> u64 {
        let seen = self.produced_seen.get();
        if seen > self.consumed {
            return seen - self.consumed;
        }
        if self.stamped() == Some(true) {
            let position = self.consumed & (self.layout.ring_size - 1);
            return self.layout.ring_size - position;
        }
        self.produced().saturating_sub(self.consumed)
    }

    /// Whether the next command's header carries the stamp of its position;
    /// `None` where a stamp cannot tell (no header fits before the ring's
    /// end, or the position's stamp is not believed).
    fn stamped(&self) -> Option<bool> {
        let StampWord(word) = self.next_stamp?;
        if self.distrusted == Some(self.consumed) {
            return None;
        }
        // SAFETY: found by `Blob::atomic_u64` (in bounds, aligned) in the
        // blob this channel holds, so still mapped.
        let word = unsafe { word.as_ref() };
        Some(word.load(Ordering::Acquire) == ring_stamp(self.stamp_key, self.consumed))
    }

    /// Finds the stamp word at the new `consumed`.
    fn find_next_stamp(&mut self) {
        let position = self.consumed & (self.layout.ring_size - 1);
        self.next_stamp = if self.layout.ring_size - position < COMMAND_HEADER_SIZE as u64 {
            None
        } else {
            let word = self.layout.ring_offset + position + COMMAND_STAMP_OFFSET as u64;
            self.blob
                .atomic_u64(word)
                .ok()
                .map(|w| StampWord(NonNull::from(w)))
        };
    }

    /// Tells the guest whether this side sleeps, and how to wake it; an
    /// idle spell keeps its number however often this is said during it.
    pub fn set_host_idle(&self, idle: bool) {
        if !idle {
            self.in_idle_spell.set(false);
            self.host_idle_word.store(HOST_AWAKE, Ordering::SeqCst);
            return;
        }
        if !self.in_idle_spell.replace(true) {
            // Never 0 (a value without a number); wraps after 2^62 spells,
            // which a guest sees as one more new number.
            let next = ((self.idle_epoch.get() + 1) & (u64::MAX >> 2)).max(1);
            self.idle_epoch.set(next);
        }
        let mode = match self.wake_word.is_some() {
            false => HOST_IDLE_DOORBELL,
            true => HOST_IDLE_WAKE_WORD,
        };
        let epoch = if self.numbers_idle {
            self.idle_epoch.get()
        } else {
            0
        };
        self.host_idle_word
            .store(idle_value(mode, epoch), Ordering::SeqCst);
    }

    /// The word to sleep on while idle, if the guest wakes it.
    pub fn wake_word(&self) -> Option<&SharedWord<AtomicU32>> {
        self.wake_word.as_ref()
    }

    /// Reads the command at the host's position (the caller checked that the
    /// ring is not empty). Does not advance.
    pub fn read(&mut self) -> (RingEntry, u64) {
        let available = self.readable();
        let ring_size = self.layout.ring_size;
        // Ring size is a power of two (validated at bind).
        let position = self.consumed & (ring_size - 1);
        let to_end = ring_size - position;
        if available > ring_size {
            return (
                RingEntry::Bad(format!(
                    "produced {} is more than a ring ahead of consumed {}",
                    self.produced_seen.get(),
                    self.consumed
                )),
                0,
            );
        }
        if to_end < COMMAND_HEADER_SIZE as u64 && available >= to_end {
            // No header fits before the ring's end: the guest skips such a
            // tail without writing a command.
            return (
                RingEntry::Command(Ok(Decoded {
                    reply_seq: 0,
                    command: Command::Padding,
                    wire_len: to_end as usize,
                })),
                to_end,
            );
        }
        let limit = available.min(to_end);
        if limit < COMMAND_HEADER_SIZE as u64 {
            return (
                RingEntry::Bad(format!("{limit} bytes left, less than a command header")),
                0,
            );
        }
        let at = self.layout.ring_offset + position;
        // The first read ends with the cache line that holds the header's
        // end: the lines after it may be the guest's, still being written,
        // and reading them pulls them from its core (and its next write
        // back). A longer command is read on in a second read.
        let header_end = at + COMMAND_HEADER_SIZE as u64;
        let line_end = header_end.next_multiple_of(CACHE_LINE);
        let first = (line_end - at).min(limit) as usize;
        self.scratch.resize(first, 0);
        if let Err(e) = self.blob.read(at, &mut self.scratch) {
            return (RingEntry::Bad(e.to_string()), 0);
        }
        let header = match CommandHeader::decode(&self.scratch) {
            Ok(h) => h,
            Err(e) => return (RingEntry::Bad(format!("bad command header: {e}")), 0),
        };
        let padded = header.padded_len() as u64;
        if padded > limit {
            return (
                RingEntry::Bad(format!(
                    "command of {padded} bytes at ring position {position} passes the end of the \
                     ring or of produced ({limit} bytes left)"
                )),
                0,
            );
        }
        if header.opcode == Opcode::Padding as u16 {
            // Filler or inline data for the next command: nothing to copy.
            return (
                RingEntry::Command(Ok(Decoded {
                    reply_seq: header.reply_seq,
                    command: Command::Padding,
                    wire_len: padded as usize,
                })),
                padded,
            );
        }
        let length = COMMAND_HEADER_SIZE + header.body_len as usize;
        if length > first {
            self.scratch.resize(length, 0);
            let rest = self.scratch.get_mut(first..).unwrap_or_default();
            if let Err(e) = self.blob.read(at + first as u64, rest) {
                return (RingEntry::Bad(e.to_string()), 0);
            }
        }
        let command = self.scratch.get(..length).unwrap_or_default();
        let entry = decode_one(command).map_err(|e| (header.reply_seq, e));
        (RingEntry::Command(entry), padded)
    }

    /// Moves past `len` bytes and publishes the new position.
    pub fn advance(&mut self, len: u64) {
        self.consumed = self.consumed.saturating_add(len);
        self.find_next_stamp();
        self.publish_consumed();
    }

    /// Moves past a command without telling the guest yet (see `advance`).
    pub fn advance_unpublished(&mut self, len: u64) {
        self.consumed = self.consumed.saturating_add(len);
        self.find_next_stamp();
    }

    /// Skips everything the guest has produced (a poisoned ring). Exactly to
    /// `produced`, aligned or not, so that the ring is empty afterwards.
    pub fn skip_to_produced(&mut self) {
        self.consumed = self.consumed.max(self.produced());
        self.find_next_stamp();
        // The bad command may lie past `produced` (found by its stamp):
        // its stamp is not believed again.
        self.distrusted = Some(self.consumed);
        self.publish_consumed();
    }

    pub fn publish_consumed(&self) {
        self.consumed_word.store(self.consumed, Ordering::Release);
        self.published.set(self.consumed);
    }

    /// Publishes in the completion table that the item of `tag` had
    /// completed everything it was given up to ring position `position`
    /// (rgpu_proto::channel: position first, then the tag, so a guest that
    /// reads the tag twice around the position never pairs an item with
    /// another's position).
    pub fn publish_completion(&self, tag: u64, position: u64) {
        let slot = self.layout.header_offset + completion_offset(tag);
        let (Ok(tag_word), Ok(position_word)) =
            (self.blob.atomic_u64(slot), self.blob.atomic_u64(slot + 8))
        else {
            return;
        };
        if tag_word.load(Ordering::Acquire) != tag {
            tag_word.store(0, Ordering::Release);
        }
        position_word.store(position, Ordering::Release);
        tag_word.store(tag, Ordering::Release);
    }

    /// Writes a reply record; the sequence number last, with release. A
    /// payload that does not fit the reply area turns into
    /// `CUDA_ERROR_INVALID_VALUE`. Returns the payload bytes written.
    pub fn write_reply(&self, seq: u64, result: u32, payload: &[u8]) -> usize {
        self.write_reply_with_console(seq, result, payload, &mut Vec::new())
    }

    /// As [`Self::write_reply`], and moves as much of `console` as fits after
    /// the payload into the record; the rest stays for the next reply.
    pub fn write_reply_with_console(
        &self,
        seq: u64,
        result: u32,
        payload: &[u8],
        console: &mut Vec<u8>,
    ) -> usize {
        write_reply_record(
            &self.blob,
            &self.layout,
            &self.reply_header,
            seq,
            result,
            payload,
            console,
        )
    }

    /// Where replies of this channel go, for a writer on another thread
    /// (the process's watchdog).
    pub fn reply_target(&self) -> ReplyTarget {
        ReplyTarget {
            blob: Arc::clone(&self.blob),
            layout: self.layout,
            header: self.reply_header.clone(),
        }
    }
}

/// A channel's reply area, held apart from the channel.
#[derive(Clone, Debug)]
pub struct ReplyTarget {
    blob: Arc<Blob>,
    layout: ChannelLayout,
    header: ReplyHeader,
}

impl ReplyTarget {
    /// Answers reply `seq` with `result` and no payload.
    pub fn write_error(&self, seq: u64, result: u32) {
        write_reply_record(
            &self.blob,
            &self.layout,
            &self.header,
            seq,
            result,
            &[],
            &mut Vec::new(),
        );
    }
}

/// The words of a reply record's header (rgpu_proto::channel), each found
/// once through the blob's page runs: the sequence number, the result and
/// the payload's length, and the console's length with the reserved word
/// after it.
#[derive(Clone, Debug)]
struct ReplyHeader {
    seq: SharedWord,
    result_and_len: SharedWord,
    console_len: SharedWord,
}

impl ReplyHeader {
    fn find(blob: &Arc<Blob>, layout: &ChannelLayout) -> Result<Self, BlobError> {
        const { assert!(REPLY_OFFSET_LEN == REPLY_OFFSET_RESULT + 4) };
        const { assert!(REPLY_OFFSET_PAYLOAD == REPLY_OFFSET_CONSOLE_LEN + 8) };
        let base = layout.reply_offset;
        Ok(Self {
            seq: Blob::shared_word(blob, base + REPLY_OFFSET_SEQ)?,
            result_and_len: Blob::shared_word(blob, base + REPLY_OFFSET_RESULT)?,
            console_len: Blob::shared_word(blob, base + REPLY_OFFSET_CONSOLE_LEN)?,
        })
    }
}

/// Writes a reply record; the sequence number last, with release. A payload
/// that does not fit the reply area turns into `CUDA_ERROR_INVALID_VALUE`.
/// Moves as much of `console` as fits after the payload. Returns the
/// payload bytes written.
fn write_reply_record(
    blob: &Blob,
    layout: &ChannelLayout,
    header: &ReplyHeader,
    seq: u64,
    result: u32,
    payload: &[u8],
    console: &mut Vec<u8>,
) -> usize {
    let room = layout.reply_size - REPLY_OFFSET_PAYLOAD;
    let (result, payload) = if payload.len() as u64 > room {
        (CUDA_ERROR_INVALID_VALUE, &[][..])
    } else {
        (result, payload)
    };
    let console_room = (room - payload.len() as u64).min(u64::from(u32::MAX)) as usize;
    let console_len = console.len().min(console_room);
    let console_bytes = console.get(..console_len).unwrap_or_default();
    let write_if_any = |offset: u64, bytes: &[u8]| match bytes.is_empty() {
        true => Ok(()),
        false => blob.write(offset, bytes),
    };
    let base = layout.reply_offset;
    // The reply area was validated at bind: these writes are in bounds.
    let written = write_if_any(base + REPLY_OFFSET_PAYLOAD, payload).and_then(|()| {
        write_if_any(
            base + REPLY_OFFSET_PAYLOAD + payload.len() as u64,
            console_bytes,
        )
    });
    if let Err(e) = written {
        log::error!("cannot write reply {seq}: {e}");
        return payload.len();
    }
    // The words hold the fields' little-endian bytes in this host's order.
    let word = |low: u32, high: u32| {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&low.to_le_bytes());
        bytes[4..].copy_from_slice(&high.to_le_bytes());
        u64::from_ne_bytes(bytes)
    };
    // Ordered before the sequence number by its release store.
    header
        .result_and_len
        .store(word(result, payload.len() as u32), Ordering::Relaxed);
    header
        .console_len
        .store(word(console_len as u32, 0), Ordering::Relaxed);
    header.seq.store(seq, Ordering::Release);
    console.drain(..console_len);
    payload.len()
}

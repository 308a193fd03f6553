//! One CUDA context's channel to its host session (rgpu-proto `channel`):
//! the command ring the guest writes and the host worker drains, the reply
//! area, and the bounce area. Thread-safe: calls from several application
//! threads are serialised here.
//!
//! Asynchronous commands cost no round trip: they are written to the ring and
//! the doorbell is rung only if the host worker went idle. A call waits for
//! its reply by polling briefly, then sleeping on a fence.
//!
//! Layout of the channel blob: control header (4 KiB), ring (`RGPU_RING_KB`,
//! default 8 MiB, a power of two), reply area (64 KiB), bounce area (8 MiB).
//! `produced` and `consumed` count bytes since the channel was bound; the
//! ring position is the count modulo the ring size.
//!
//! Event and stream queries never wait: the channel remembers where in the
//! ring each event was last recorded and each stream last given work, and
//! answers from the host's completion table ([`Channel::completion`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rgpu_proto::batch::encode_batch;
use rgpu_proto::channel::{
    self as proto, completion_offset, completion_tag, idle_mode, ring_stamp, CompletionKind,
    CHANNEL_MAGIC, COMPLETION_FAILED, GUEST_READS_IDLE_EPOCH, GUEST_WAKES_BY_FUTEX, HEADER_SIZE,
    HOST_AWAKE, HOST_IDLE_WAKE_WORD, OFFSET_CONSUMED, OFFSET_GUEST_FEATURES, OFFSET_HOST_IDLE,
    OFFSET_MAGIC, OFFSET_PRODUCED, OFFSET_STAMP_KEY, OFFSET_VERSION, OFFSET_WAKE,
    REPLY_OFFSET_CONSOLE_LEN, REPLY_OFFSET_LEN, REPLY_OFFSET_PAYLOAD, REPLY_OFFSET_RESULT,
    REPLY_OFFSET_SEQ,
};
use rgpu_proto::command::{
    padded, ChannelLayout, CommandHeader, COMMAND_HEADER_SIZE, COMMAND_STAMP_OFFSET,
};
use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::wire::WireWriter;
use rgpu_proto::{BlobRange, Command, ControlCommand, Opcode, PROTOCOL_VERSION};

use crate::call_profile::CallProfile;
use crate::carrier::{BlobMapping, Carrier, CarrierError};
use crate::copy_crew::{with_crew, Crew};

/// The host's answer to a command that asked for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// A CUDA result code (`rgpu_proto::cuda_result`).
    pub result: u32,
    pub payload: Vec<u8>,
}

/// Default ring size in KiB (`RGPU_RING_KB`).
pub const DEFAULT_RING_KB: u64 = 8192;
pub const REPLY_AREA_SIZE: u64 = 64 << 10;
pub const BOUNCE_AREA_SIZE: u64 = 8 << 20;
/// Slots of the bounce area that a large copy to the guest keeps in
/// flight (2 MiB each with the default area).
pub const BOUNCE_SLOTS: usize = 4;
/// Default of `RGPU_SPIN_US`.
pub const DEFAULT_SPIN_US: u64 = 50;
/// Largest `Padding` body: rgpu-proto's header decoder lets Padding (never
/// copied by the host) be as long as a ring.
pub const MAX_PADDING_BODY: u64 = rgpu_proto::channel::MAX_RING_SIZE;

/// Sizes and timing of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// A power of two between 4 KiB and 1 GiB.
    pub ring_size: u64,
    /// At least 4 KiB, a multiple of 8.
    pub reply_size: u64,
    /// A multiple of 8 (0 disables `copy_from_device`).
    pub bounce_size: u64,
    /// How long to poll for a reply or ring space before sleeping on a fence.
    pub spin: Duration,
    /// How long, at most, to keep polling while the host wakes up.
    pub wake_spin: Duration,
    /// Threads a large pageable copy uses, the caller's included
    /// (`RGPU_COPY_THREADS`).
    pub copy_threads: usize,
    /// Wake a sleeping host through the channel's wake word where the
    /// carrier shares the host's kernel (`RGPU_WAKE_WORD=0`: always ring
    /// the doorbell).
    pub wake_word: bool,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            ring_size: DEFAULT_RING_KB << 10,
            reply_size: REPLY_AREA_SIZE,
            bounce_size: BOUNCE_AREA_SIZE,
            spin: Duration::from_micros(DEFAULT_SPIN_US),
            wake_spin: DEFAULT_WAKE_SPIN,
            copy_threads: 1,
            wake_word: true,
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = value.trim().parse::<u64>().ok();
    if parsed.is_none() {
        log::warn!("{name}={value:?} is not a number; using the default");
    }
    parsed
}

impl ChannelConfig {
    /// The defaults, with `RGPU_RING_KB`, `RGPU_SPIN_US`,
    /// `RGPU_COPY_THREADS` and `RGPU_WAKE_WORD` applied.
    pub fn from_env() -> Self {
        let mut config = Self {
            copy_threads: crate::copy_crew::copy_threads_from_env(),
            ..Self::default()
        };
        if let Some(kb) = env_u64("RGPU_RING_KB") {
            let size = kb.saturating_mul(1024);
            if size.is_power_of_two()
                && (proto::MIN_RING_SIZE..=proto::MAX_RING_SIZE).contains(&size)
            {
                config.ring_size = size;
            } else {
                log::warn!("RGPU_RING_KB={kb} is not a power of two between 4 and 1048576; using {DEFAULT_RING_KB}");
            }
        }
        if let Some(us) = env_u64("RGPU_SPIN_US") {
            config.spin = Duration::from_micros(us);
        }
        if let Some(on) = env_u64("RGPU_WAKE_WORD") {
            config.wake_word = on != 0;
        }
        config
    }

    fn layout(&self, resource_id: u32) -> ChannelLayout {
        let ring_offset = HEADER_SIZE;
        let reply_offset = ring_offset + self.ring_size;
        let bounce_offset = reply_offset + self.reply_size;
        ChannelLayout {
            resource_id,
            header_offset: 0,
            ring_offset,
            ring_size: self.ring_size,
            reply_offset,
            reply_size: self.reply_size,
            bounce_offset,
            bounce_size: self.bounce_size,
        }
    }

    fn blob_size(&self) -> u64 {
        HEADER_SIZE + self.ring_size + self.reply_size + self.bounce_size
    }
}

/// What the completion table says of an event or a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Everything it was given is complete (or it was never given any).
    Done,
    /// Work it was given is not complete yet.
    Pending,
    /// The table cannot tell (its slot holds another item, the host met an
    /// error, or the channel never gave it work): ask the host.
    Ask,
}

/// What the channel's mutex guards (held while a call waits for its reply).
struct State {
    /// Bytes published so far (the last value stored in `produced`).
    produced: u64,
    /// The host's `consumed` as last read: room is known without touching
    /// the counter's cache line, which the host writes after every command
    /// (reading it per command made both sides miss on it each time).
    consumed_seen: u64,
    next_seq: u64,
    /// Where commands are encoded before they are copied into the ring.
    encoded: WireWriter,
    /// `RGPU_PROFILE_CALLS=1`: the halves of each waited call, the
    /// commands written and the waits.
    calls: Option<CallProfile>,
    /// The name of the last command written that asks for a reply (for
    /// the profile's waits).
    awaited: &'static str,
    /// The numbered `host_idle` value last rung or woken for: the host's
    /// idle spell that needs no second doorbell.
    rung_for: u64,
}

impl State {
    /// Runs `wait`, timed in the call profile (if any) as a wait for `what`.
    fn profiled_wait<T>(&mut self, what: &'static str, wait: impl FnOnce(&mut Self) -> T) -> T {
        let began = self.calls.as_ref().map(|_| Instant::now());
        let result = wait(self);
        if let (Some(calls), Some(began)) = (&mut self.calls, began) {
            calls.add_wait(what, began);
        }
        result
    }
}

/// Where events and streams were last given work, for queries (a mutex of
/// its own: a query must not wait for another thread's call). A position
/// is the ring's (a ring channel) or the count of requests (a remote one).
#[derive(Default)]
pub(crate) struct QueryNotes {
    /// Position after each event's latest record.
    recorded: HashMap<u32, u64>,
    /// Position after each stream's latest work.
    queued: HashMap<u32, u64>,
}

impl QueryNotes {
    /// Where `kind`'s item `handle` was last given work; for one never
    /// given any, the answer itself: an event never recorded is complete,
    /// as CUDA says; a stream's work this channel never saw (the legacy
    /// stream's ties to the others) is the host's to judge.
    pub(crate) fn given(&self, kind: CompletionKind, handle: u32) -> Result<u64, Completion> {
        let given = match kind {
            CompletionKind::Event => self.recorded.get(&handle),
            CompletionKind::Stream => self.queued.get(&handle),
        };
        given.copied().ok_or(match kind {
            CompletionKind::Event => Completion::Done,
            CompletionKind::Stream => Completion::Ask,
        })
    }

    /// Notes work given to `stream` up to `end` (a copy that is no command).
    pub(crate) fn note_stream_work(&mut self, stream: u32, end: u64) {
        self.queued.insert(stream, end);
    }

    /// Notes what a command written up to `end` changes for queries.
    pub(crate) fn note(&mut self, command: &Command, end: u64) {
        for event in command.events_recorded() {
            self.recorded.insert(event, end);
        }
        match command {
            Command::EventDestroy { event } => {
                self.recorded.remove(event);
            }
            Command::StreamDestroy { stream } => {
                self.queued.remove(stream);
            }
            _ => {}
        }
        if let Some(stream) = command.queued_on() {
            self.queued.insert(stream, end);
        }
    }
}

pub struct Channel {
    carrier: Arc<dyn Carrier>,
    ctx_id: u32,
    blob: BlobMapping,
    layout: ChannelLayout,
    spin: Duration,
    wake_spin: Duration,
    copy_threads: usize,
    state: Mutex<State>,
    notes: Mutex<QueryNotes>,
    /// Device printf output kept for whoever relays this channel (the
    /// network gateway) instead of printed here; `None`: printed.
    console: Mutex<Option<Vec<u8>>>,
    /// The key of this channel's ring stamps (rgpu-proto `channel`).
    stamp_key: u64,
    /// A sleeping host is woken through the wake word (announced at bind).
    wakes_by_futex: bool,
}

impl Channel {
    /// Creates a virtio-gpu context on `carrier`, allocates the channel blob
    /// and binds it (`BindChannel`).
    pub fn open(carrier: Arc<dyn Carrier>, debug_name: &str) -> Result<Self, CarrierError> {
        Self::open_with_config(carrier, debug_name, ChannelConfig::from_env())
    }

    /// [`Channel::open`] with explicit sizes instead of the environment's.
    pub fn open_with_config(
        carrier: Arc<dyn Carrier>,
        debug_name: &str,
        config: ChannelConfig,
    ) -> Result<Self, CarrierError> {
        let ctx_id = carrier.create_context(debug_name)?;
        let blob = match carrier.create_blob(ctx_id, config.blob_size()) {
            Ok(blob) => blob,
            Err(e) => {
                let _ = carrier.destroy_context(ctx_id);
                return Err(e);
            }
        };
        let wakes_by_futex = config.wake_word && carrier.shares_host_kernel();
        let channel = Self {
            layout: config.layout(blob.resource_id),
            carrier,
            ctx_id,
            blob,
            spin: config.spin,
            wake_spin: config.wake_spin,
            copy_threads: config.copy_threads,
            state: Mutex::new(State {
                produced: 0,
                consumed_seen: 0,
                next_seq: 1,
                encoded: WireWriter::with_capacity(256),
                calls: CallProfile::wanted().then(CallProfile::default),
                awaited: "",
                rung_for: HOST_AWAKE,
            }),
            notes: Mutex::default(),
            console: Mutex::new(None),
            stamp_key: random_key(),
            wakes_by_futex,
        };
        if let Err(e) = channel.bind() {
            let _ = channel.close();
            return Err(e);
        }
        Ok(channel)
    }

    fn bind(&self) -> Result<(), CarrierError> {
        proto::validate_layout(&self.layout, self.blob.size)
            .map_err(|e| CarrierError::Protocol(format!("channel layout: {e}")))?;
        // The blob may hold an earlier user's bytes.
        // SAFETY: the header and the reply record lie inside the blob (layout
        // validated against its size just above), which this channel owns.
        unsafe {
            self.at(self.layout.header_offset)
                .write_bytes(0, HEADER_SIZE as usize);
            self.at(self.layout.reply_offset)
                .write_bytes(0, REPLY_OFFSET_PAYLOAD as usize);
            self.at(self.layout.header_offset + OFFSET_MAGIC)
                .cast::<u32>()
                .write_volatile(CHANNEL_MAGIC.to_le());
            self.at(self.layout.header_offset + OFFSET_VERSION)
                .cast::<u32>()
                .write_volatile(PROTOCOL_VERSION.to_le());
            self.at(self.layout.header_offset + OFFSET_STAMP_KEY)
                .cast::<u64>()
                .write_volatile(self.stamp_key.to_le());
            let features = GUEST_READS_IDLE_EPOCH
                | if self.wakes_by_futex {
                    GUEST_WAKES_BY_FUTEX
                } else {
                    0
                };
            self.at(self.layout.header_offset + OFFSET_GUEST_FEATURES)
                .cast::<u64>()
                .write_volatile(features.to_le());
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let batch = encode_batch(&[(
            0,
            ControlCommand::BindChannel {
                layout: self.layout,
            },
        )]);
        let fence = self
            .carrier
            .submit(self.ctx_id, &batch, true)?
            .ok_or_else(|| CarrierError::Protocol("fenced submit without a fence".into()))?;
        self.carrier.wait_fence(self.ctx_id, fence)
    }

    pub fn ctx_id(&self) -> u32 {
        self.ctx_id
    }

    pub fn carrier(&self) -> &Arc<dyn Carrier> {
        &self.carrier
    }

    /// The channel's place in its blob.
    pub fn layout(&self) -> &ChannelLayout {
        &self.layout
    }

    /// Keeps device printf output for [`Channel::take_console`] instead of
    /// printing it on this process's stdout (a relay sends it on).
    pub fn keep_console(&self) {
        let mut console = self.console.lock().unwrap_or_else(PoisonError::into_inner);
        console.get_or_insert_with(Vec::new);
    }

    /// The device printf output kept since the last call.
    pub fn take_console(&self) -> Vec<u8> {
        let mut console = self.console.lock().unwrap_or_else(PoisonError::into_inner);
        console.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Queues a command that needs no reply (errors surface at the next call).
    pub fn send(&self, command: &Command) -> Result<(), CarrierError> {
        let mut state = self.lock();
        self.write_command(&mut state, command, 0)
    }

    /// Queues a command and waits for its reply.
    pub fn call(&self, command: &Command) -> Result<Reply, CarrierError> {
        let mut state = self.lock();
        let started = state.calls.as_ref().map(|_| Instant::now());
        let seq = Self::take_seq(&mut state);
        self.write_command(&mut state, command, seq)?;
        let written = started.map(|_| Instant::now());
        let reply =
            self.wait_reply_spinning(&mut state, seq, self.spin + expected_duration(command));
        if let (Some(started), Some(written), Some(calls)) = (started, written, &mut state.calls) {
            calls.add(started, written, Instant::now());
        }
        reply
    }

    /// Copies `data` from anywhere in this process to device memory at `dst`
    /// through staging space in the ring (pipelined in chunks). With `sync`,
    /// waits for the host and returns its result; otherwise returns
    /// `CUDA_SUCCESS` once everything is queued.
    pub fn copy_to_device(
        &self,
        stream: u32,
        dst: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<u32, CarrierError> {
        if data.is_empty() {
            return Ok(CUDA_SUCCESS);
        }
        let mut state = self.lock();
        let chunk = self.inline_limit() as usize;
        let count = data.len().div_ceil(chunk);
        with_crew(self.copy_threads, data.len(), |crew| {
            let mut seq = 0;
            for (i, piece) in data.chunks(chunk).enumerate() {
                if sync && i + 1 == count {
                    seq = Self::take_seq(&mut state);
                }
                let chunk_dst = dst.wrapping_add((i * chunk) as u64);
                self.write_inline_with(
                    &mut state,
                    piece,
                    &|src| Command::MemcpyHtoD {
                        stream,
                        dst: chunk_dst,
                        src,
                    },
                    seq,
                    crew,
                )?;
            }
            if !sync {
                return Ok(CUDA_SUCCESS);
            }
            Ok(self.wait_reply(&mut state, seq)?.result)
        })
    }

    /// Copies device memory at `src` into `dst` anywhere in this process
    /// through the bounce area; synchronous; returns the CUDA result.
    ///
    /// Pipelined: the bounce area is split into [`BOUNCE_SLOTS`] slots, and
    /// while this thread copies one slot out, the host fills the next ones.
    /// Only the last piece asks for a reply (an earlier piece's error comes
    /// with it); the others are known done once the host's `consumed` is
    /// past them, as the host finishes a staged copy before moving on.
    pub fn copy_from_device(
        &self,
        stream: u32,
        dst: &mut [u8],
        src: u64,
    ) -> Result<u32, CarrierError> {
        if dst.is_empty() {
            return Ok(CUDA_SUCCESS);
        }
        let bounce = usize::try_from(self.layout.bounce_size)
            .ok()
            .filter(|c| *c > 0)
            .ok_or_else(|| CarrierError::Protocol("channel has no bounce area".into()))?;
        let slot_size = (bounce / BOUNCE_SLOTS) & !7;
        let (slots, piece_size) = if slot_size == 0 || dst.len() <= bounce.min(slot_size * 2) {
            (1, bounce)
        } else {
            (BOUNCE_SLOTS, slot_size)
        };
        let count = dst.len().div_ceil(piece_size);
        let expected = expected_bytes_duration(piece_size as u64);
        let bounce_offset = self.layout.bounce_offset;
        // Where piece `i` lies in the blob.
        let slot_offset = move |i: usize| bounce_offset + ((i % slots) * piece_size) as u64;
        let mut state = self.lock();
        let total = dst.len();
        let threads = self.copy_threads;
        // Queues piece `i` into its slot: (its reply sequence, the ring
        // position after it).
        let issue = |state: &mut State, i: usize| -> Result<(u64, u64), CarrierError> {
            let offset = i * piece_size;
            let length = piece_size.min(total - offset);
            let seq = if i + 1 == count {
                Self::take_seq(state)
            } else {
                0
            };
            let command = Command::MemcpyDtoH {
                stream,
                dst: BlobRange {
                    resource_id: self.blob.resource_id,
                    offset: slot_offset(i),
                    length: length as u64,
                },
                src: src.wrapping_add(offset as u64),
            };
            self.write_command(state, &command, seq)?;
            Ok((seq, state.produced))
        };
        let state = &mut *state;
        with_crew(threads, total, |crew| {
            // Ring positions after the pieces in flight, in order.
            let mut in_flight = std::collections::VecDeque::with_capacity(slots);
            let mut reply_seq = 0;
            for i in 0..slots.min(count) {
                let (seq, end) = issue(state, i)?;
                reply_seq = reply_seq.max(seq);
                in_flight.push_back(end);
            }
            for i in 0..count {
                let end = in_flight.pop_front().unwrap_or(state.produced);
                if i + 1 == count {
                    let reply = self.wait_reply_spinning(state, reply_seq, self.spin + expected)?;
                    if reply.result != CUDA_SUCCESS {
                        return Ok(reply.result);
                    }
                } else {
                    self.wait_consumed(state, end, expected)?;
                }
                let offset = i * piece_size;
                let piece = dst
                    .get_mut(offset..(offset + piece_size).min(dst.len()))
                    .ok_or_else(|| CarrierError::Protocol("copy piece out of range".into()))?;
                // SAFETY: the slot lies inside the bounce area, which lies
                // inside the blob (validated at bind) and holds `slots` slots of
                // `piece_size` >= piece.len() bytes; the host finished writing
                // it (it moved past the command, or replied to it) and writes it
                // again only after this piece's slot is issued anew, below.
                unsafe { crew.copy(piece.as_mut_ptr(), self.at(slot_offset(i)), piece.len()) };
                // That slot is free again: the host may fill it with a later
                // piece meanwhile.
                if i + slots < count {
                    let (seq, end) = issue(state, i + slots)?;
                    reply_seq = reply_seq.max(seq);
                    in_flight.push_back(end);
                }
            }
            Ok(CUDA_SUCCESS)
        })
    }

    /// Waits until the host has executed everything before ring position
    /// `until`: polls for the spin time plus `expected`, then sleeps on a
    /// fenced doorbell (which waits for everything published).
    fn wait_consumed(
        &self,
        state: &mut State,
        until: u64,
        expected: Duration,
    ) -> Result<(), CarrierError> {
        if self.consumed(state)? >= until {
            return Ok(());
        }
        state.profiled_wait("a copy's earlier pieces", |state| {
            self.wait_consumed_spinning(state, until, expected)
        })
    }

    /// [`Self::wait_consumed`] once the host is known to be behind.
    fn wait_consumed_spinning(
        &self,
        state: &State,
        until: u64,
        expected: Duration,
    ) -> Result<(), CarrierError> {
        let mut window = SpinWindow::new(self.spin + expected, self.wake_spin);
        while self.consumed(state)? < until {
            if window.over(|| self.host_asleep()) {
                self.ring_doorbell(state, true)?;
                if self.consumed(state)? < until {
                    return Err(CarrierError::Protocol(
                        "the host signalled a doorbell fence before consuming the ring".into(),
                    ));
                }
                break;
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Makes `data` visible to the host as a blob range (staged in the ring
    /// when small, in a temporary blob when large), builds the command with
    /// it, and waits for the reply. For module images.
    pub fn call_with_data(
        &self,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
    ) -> Result<Reply, CarrierError> {
        if data.len() as u64 <= self.inline_limit() {
            let mut state = self.lock();
            let seq = Self::take_seq(&mut state);
            self.write_inline(&mut state, data, make_command, seq)?;
            return self.wait_reply(&mut state, seq);
        }
        let temp = self.carrier.create_blob(self.ctx_id, data.len() as u64)?;
        // SAFETY: the temporary blob is at least `data.len()` bytes and
        // nobody else uses it yet.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), temp.ptr, data.len()) };
        let reply = self.call(&make_command(BlobRange {
            resource_id: temp.resource_id,
            offset: 0,
            length: data.len() as u64,
        }));
        let destroyed = self.carrier.destroy_blob(self.ctx_id, temp.resource_id);
        let reply = reply?;
        destroyed?;
        Ok(reply)
    }

    /// Destroys the channel's blob and the virtio-gpu context (the host frees
    /// the session).
    pub fn close(self) -> Result<(), CarrierError> {
        if let Some(summary) = self.lock().calls.as_ref().and_then(CallProfile::summary) {
            log::info!("ctx {}: call profile: {summary}", self.ctx_id);
        }
        let blob = self
            .carrier
            .destroy_blob(self.ctx_id, self.blob.resource_id);
        let context = self.carrier.destroy_context(self.ctx_id);
        blob.and(context)
    }

    fn note(&self, command: &Command, end: u64) {
        self.notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .note(command, end);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_seq(state: &mut State) -> u64 {
        let seq = state.next_seq;
        state.next_seq += 1;
        seq
    }

    /// Largest piece of data staged in the ring.
    fn inline_limit(&self) -> u64 {
        (self.layout.ring_size / 4).min(MAX_PADDING_BODY)
    }

    /// Address of a byte of the blob.
    fn at(&self, offset: u64) -> *mut u8 {
        debug_assert!(offset < self.blob.size);
        // SAFETY: callers pass offsets inside the blob (from the validated
        // layout), and the blob's mapping lives as long as the carrier.
        unsafe { self.blob.ptr.add(offset as usize) }
    }

    /// A word of the control header: a counter or a completion slot's.
    fn counter(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: header counters and completion slots are 8-aligned (the
        // blob is page aligned, the offsets are multiples of 8) inside the
        // header, which lies inside the blob, and both sides access them
        // only atomically.
        unsafe { AtomicU64::from_ptr(self.at(self.layout.header_offset + offset).cast()) }
    }

    fn consumed(&self, state: &State) -> Result<u64, CarrierError> {
        let consumed = self.counter(OFFSET_CONSUMED).load(Ordering::Acquire);
        if consumed > state.produced {
            return Err(CarrierError::Protocol(format!(
                "host consumed {consumed} bytes, only {} were produced",
                state.produced
            )));
        }
        Ok(consumed)
    }

    /// Sends a `Doorbell` for everything published; with `wait`, fenced and
    /// waited for, so the host has executed all of it on return.
    fn ring_doorbell(&self, state: &State, wait: bool) -> Result<(), CarrierError> {
        let batch = encode_batch(&[(
            0,
            ControlCommand::Doorbell {
                until: state.produced,
            },
        )]);
        let fence = self.carrier.submit(self.ctx_id, &batch, wait)?;
        match (wait, fence) {
            (false, _) => Ok(()),
            (true, Some(fence)) => self.carrier.wait_fence(self.ctx_id, fence),
            (true, None) => Err(CarrierError::Protocol(
                "fenced submit without a fence".into(),
            )),
        }
    }

    /// Publishes what was written up to `state.produced` and wakes the host
    /// if it went idle (rgpu-proto `channel`: store, then load, both SeqCst).
    /// Once per numbered idle spell: the host stores the next number
    /// before it loads `produced` again, so what is published during this
    /// one is seen.
    fn publish(&self, state: &mut State) -> Result<(), CarrierError> {
        self.counter(OFFSET_PRODUCED)
            .store(state.produced, Ordering::SeqCst);
        let idle = self.counter(OFFSET_HOST_IDLE).load(Ordering::SeqCst);
        let numbered = idle > HOST_IDLE_WAKE_WORD;
        if idle == HOST_AWAKE || (numbered && idle == state.rung_for) {
            return Ok(());
        }
        state.rung_for = idle;
        match idle_mode(idle) {
            HOST_IDLE_WAKE_WORD if self.wakes_by_futex => self.wake_host(),
            // A doorbell, or a value this side does not know: the doorbell
            // wakes any host.
            _ => self.ring_doorbell(state, false)?,
        }
        Ok(())
    }

    /// Wakes a host asleep on the wake word (rgpu-proto `channel`).
    fn wake_host(&self) {
        // SAFETY: the wake word is 4-aligned inside the header, which lies
        // inside the blob; both sides access it only atomically.
        let word =
            unsafe { AtomicU32::from_ptr(self.at(self.layout.header_offset + OFFSET_WAKE).cast()) };
        word.fetch_add(1, Ordering::SeqCst);
        rgpu_proto::futex::wake(word);
    }

    /// Whether the host's worker is (going) asleep: a command published now
    /// waits for the doorbell's wake-up.
    fn host_asleep(&self) -> bool {
        self.counter(OFFSET_HOST_IDLE).load(Ordering::SeqCst) != 0
    }

    /// Waits until `len` bytes of the ring are free.
    fn wait_space(&self, state: &mut State, len: u64) -> Result<(), CarrierError> {
        if self.has_room(state, len) || self.look_for_room(state, len)? {
            return Ok(());
        }
        state.profiled_wait("room in the ring", |state| {
            self.wait_space_spinning(state, len)
        })
    }

    /// [`Self::wait_space`] once the ring is known to be full.
    fn wait_space_spinning(&self, state: &mut State, len: u64) -> Result<(), CarrierError> {
        let spin_until = Instant::now() + self.spin;
        while Instant::now() < spin_until {
            std::hint::spin_loop();
            if self.look_for_room(state, len)? {
                return Ok(());
            }
        }
        self.ring_doorbell(state, true)?;
        if self.look_for_room(state, len)? {
            return Ok(());
        }
        Err(CarrierError::Protocol(
            "the host signalled a doorbell fence before consuming the ring".into(),
        ))
    }

    /// Whether `len` bytes are free by the last `consumed` read.
    fn has_room(&self, state: &State, len: u64) -> bool {
        self.layout.ring_size - (state.produced - state.consumed_seen) >= len
    }

    /// Reads the host's `consumed` again; whether `len` bytes are free.
    fn look_for_room(&self, state: &mut State, len: u64) -> Result<bool, CarrierError> {
        state.consumed_seen = self.consumed(state)?;
        Ok(self.has_room(state, len))
    }

    /// Reserves `len` contiguous bytes at the ring's current position,
    /// filling the tail with `Padding` when they would not fit before the
    /// end; returns the position. Never leaves fewer than a header's worth
    /// of bytes (but more than zero) before the end, so a `Padding` always
    /// fits there.
    fn reserve(&self, state: &mut State, len: u64) -> Result<u64, CarrierError> {
        let ring = self.layout.ring_size;
        let header = COMMAND_HEADER_SIZE as u64;
        if len > ring / 2 || !len.is_multiple_of(8) {
            return Err(CarrierError::Protocol(format!(
                "a {len}-byte command does not fit a {ring}-byte ring"
            )));
        }
        let room = ring - state.produced % ring;
        if len != room && len + header > room {
            self.wait_space(state, room)?;
            let mut left = room;
            while left > 0 {
                // Pieces the header decoder accepts, never leaving a tail
                // too short for the next header.
                let mut piece = left.min(header + MAX_PADDING_BODY);
                let rest = left - piece;
                if rest > 0 && rest < header {
                    piece -= header - rest;
                }
                let padding = CommandHeader {
                    opcode: Opcode::Padding as u16,
                    flags: 0,
                    // piece <= header + MAX_PADDING_BODY.
                    body_len: (piece - header) as u32,
                    reply_seq: 0,
                    stamp: 0,
                };
                self.write_header(state.produced, &padding);
                state.produced += piece;
                left -= piece;
            }
            self.publish(state)?;
        }
        self.wait_space(state, len)?;
        Ok(state.produced % ring)
    }

    fn write_bytes(&self, pos: u64, bytes: &[u8]) {
        debug_assert!(pos + bytes.len() as u64 <= self.layout.ring_size);
        // SAFETY: `reserve` returned `pos` with room for these bytes before
        // the ring's end, and the host is done with that space.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.at(self.layout.ring_offset + pos),
                bytes.len(),
            );
        }
    }

    /// Writes an encoded command (its header's stamp word not yet set) at
    /// ring position `at` (bytes since bind), then its stamp, last, with
    /// release: the host may take the command as soon as it sees the stamp.
    fn write_entry(&self, at: u64, bytes: &[u8]) {
        let pos = at % self.layout.ring_size;
        let (head, rest) = bytes.split_at(COMMAND_STAMP_OFFSET.min(bytes.len()));
        let body = rest
            .get(COMMAND_HEADER_SIZE - COMMAND_STAMP_OFFSET..)
            .unwrap_or_default();
        self.write_bytes(pos, head);
        self.write_bytes(pos + COMMAND_HEADER_SIZE as u64, body);
        self.counter_in_ring(pos + COMMAND_STAMP_OFFSET as u64)
            .store(ring_stamp(self.stamp_key, at), Ordering::Release);
    }

    /// The stamp word of the command at ring position `pos`.
    fn counter_in_ring(&self, pos: u64) -> &AtomicU64 {
        debug_assert!(pos.is_multiple_of(8) && pos + 8 <= self.layout.ring_size);
        // SAFETY: commands start 8-aligned inside the ring (a power of two
        // of at least 4 KiB, 8-aligned in a page-aligned blob) and `reserve`
        // left room for a whole header there; the host reads the word only
        // atomically.
        unsafe { AtomicU64::from_ptr(self.at(self.layout.ring_offset + pos).cast()) }
    }

    fn write_header(&self, at: u64, header: &CommandHeader) {
        self.write_entry(at, &header.to_bytes());
    }

    /// Writes `command`, `len` bytes encoded, at ring position `at` (bytes
    /// since bind), where `reserve` made room for all of it. It is encoded
    /// in the channel's own buffer first and copied into the ring in one
    /// go: the worker polls the line where the next command goes, and
    /// encoding field by field into that line cost a synchronous call
    /// 0.05 µs and a launch + synchronize 0.2 µs in sim (the line went back
    /// and forth between the two cores once per field).
    fn write_command_at(
        &self,
        state: &mut State,
        at: u64,
        command: &Command,
        seq: u64,
        len: u64,
    ) -> Result<(), CarrierError> {
        state.encoded.clear();
        let encoded = command.encode(seq, &mut state.encoded) as u64;
        if encoded != len {
            return Err(CarrierError::Protocol(format!(
                "{:?} encoded to {encoded} bytes, not its {len}",
                command.opcode()
            )));
        }
        self.write_entry(at, state.encoded.as_bytes());
        if let Some(calls) = &mut state.calls {
            let name = command.opcode().name();
            calls.add_command(name);
            if seq != 0 {
                state.awaited = name;
            }
        }
        Ok(())
    }

    fn write_command(
        &self,
        state: &mut State,
        command: &Command,
        seq: u64,
    ) -> Result<(), CarrierError> {
        let len = command.encoded_len() as u64;
        self.reserve(state, len)?;
        let at = state.produced;
        self.write_command_at(state, at, command, seq, len)?;
        state.produced += len;
        self.note(command, state.produced);
        self.publish(state)
    }

    /// Writes `data` as the body of a `Padding` immediately followed by the
    /// command that names it (the inline-data convention).
    fn write_inline(
        &self,
        state: &mut State,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
        seq: u64,
    ) -> Result<(), CarrierError> {
        with_crew(1, 0, |crew| {
            self.write_inline_with(state, data, make_command, seq, crew)
        })
    }

    /// [`Self::write_inline`], copying the data with `crew`.
    fn write_inline_with(
        &self,
        state: &mut State,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
        seq: u64,
        crew: &Crew<'_>,
    ) -> Result<(), CarrierError> {
        let staged = padded(COMMAND_HEADER_SIZE + data.len()) as u64;
        // The encoded size does not depend on the range's values.
        let command_len = make_command(BlobRange::default()).encoded_len() as u64;
        let pos = self.reserve(state, staged + command_len)?;
        let range = BlobRange {
            resource_id: self.blob.resource_id,
            offset: self.layout.ring_offset + pos + COMMAND_HEADER_SIZE as u64,
            length: data.len() as u64,
        };
        let made = make_command(range);
        if made.encoded_len() as u64 != command_len {
            return Err(CarrierError::Protocol(
                "command size changed with its data range".into(),
            ));
        }
        self.write_header(
            state.produced,
            &CommandHeader {
                opcode: Opcode::Padding as u16,
                flags: 0,
                // data.len() <= inline_limit() <= MAX_PADDING_BODY.
                body_len: data.len() as u32,
                reply_seq: 0,
                stamp: 0,
            },
        );
        let data_pos = pos + COMMAND_HEADER_SIZE as u64;
        debug_assert!(data_pos + data.len() as u64 <= self.layout.ring_size);
        // SAFETY: `reserve` returned `pos` with room for the header, the data
        // and the command before the ring's end, and the host is done with
        // that space; `data` is the caller's, distinct from the ring.
        unsafe {
            crew.copy(
                self.at(self.layout.ring_offset + data_pos),
                data.as_ptr(),
                data.len(),
            );
        }
        self.write_command_at(state, state.produced + staged, &made, seq, command_len)?;
        state.produced += staged + command_len;
        self.note(&made, state.produced);
        self.publish(state)
    }

    /// What the host's completion table says of event `event` (`kind`
    /// Event) or stream `stream` (Stream), without asking the host.
    pub fn completion(&self, kind: CompletionKind, handle: u32) -> Completion {
        let given = self
            .notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .given(kind, handle);
        let given_until = match given {
            Ok(position) => position,
            Err(answer) => return answer,
        };
        let tag = completion_tag(kind, handle);
        let slot = completion_offset(tag);
        let (tag_word, position_word) = (self.counter(slot), self.counter(slot + 8));
        let before = tag_word.load(Ordering::Acquire);
        let position = position_word.load(Ordering::Acquire);
        let after = tag_word.load(Ordering::Acquire);
        if before == tag && after == tag {
            return match position {
                COMPLETION_FAILED => Completion::Ask,
                done if done >= given_until => Completion::Done,
                _ => Completion::Pending,
            };
        }
        let consumed = self.counter(OFFSET_CONSUMED).load(Ordering::Acquire);
        match before {
            // Nothing published for it yet: still pending, for sure while
            // the host has not even run the command that gave it the work.
            0 => Completion::Pending,
            _ if consumed < given_until => Completion::Pending,
            // Another item holds the slot.
            _ => Completion::Ask,
        }
    }

    fn reply_seq(&self) -> u64 {
        // SAFETY: the reply record's sequence number is 8-aligned inside the
        // blob (validated layout) and written by the host with release.
        let seq = unsafe {
            AtomicU64::from_ptr(self.at(self.layout.reply_offset + REPLY_OFFSET_SEQ).cast())
        };
        seq.load(Ordering::Acquire)
    }

    /// Waits for the reply numbered `seq`: polls, then sleeps on a fenced
    /// doorbell, which completes once the host executed everything.
    fn wait_reply(&self, state: &mut State, seq: u64) -> Result<Reply, CarrierError> {
        self.wait_reply_spinning(state, seq, self.spin)
    }

    /// [`Self::wait_reply`], polling for `spin` before sleeping.
    fn wait_reply_spinning(
        &self,
        state: &mut State,
        seq: u64,
        spin: Duration,
    ) -> Result<Reply, CarrierError> {
        let awaited = state.awaited;
        state.profiled_wait(awaited, |state| self.wait_reply_polling(state, seq, spin))
    }

    /// [`Self::wait_reply_spinning`] without the profile.
    fn wait_reply_polling(
        &self,
        state: &mut State,
        seq: u64,
        spin: Duration,
    ) -> Result<Reply, CarrierError> {
        let mut window = SpinWindow::new(spin, self.wake_spin);
        'spin: loop {
            // The clock is read once per batch of polls: a read per poll
            // made each poll, and so the answer's notice, slower.
            for _ in 0..POLLS_PER_CLOCK_READ {
                if self.reply_seq() == seq {
                    break 'spin;
                }
                std::hint::spin_loop();
            }
            if window.over(|| self.host_asleep()) {
                break;
            }
        }
        if self.reply_seq() != seq {
            self.ring_doorbell(state, true)?;
            let got = self.reply_seq();
            if got != seq {
                return Err(CarrierError::ContextLost(format!(
                    "command {seq} was not answered (reply area holds {got})"
                )));
            }
        }
        let base = self.layout.reply_offset;
        // SAFETY: the reply record lies inside the blob; the acquire load of
        // its sequence number ordered these reads after the host's writes.
        let (result, len, console_len) = unsafe {
            (
                u32::from_le(
                    self.at(base + REPLY_OFFSET_RESULT)
                        .cast::<u32>()
                        .read_volatile(),
                ),
                u32::from_le(
                    self.at(base + REPLY_OFFSET_LEN)
                        .cast::<u32>()
                        .read_volatile(),
                ),
                u32::from_le(
                    self.at(base + REPLY_OFFSET_CONSOLE_LEN)
                        .cast::<u32>()
                        .read_volatile(),
                ),
            )
        };
        let capacity = self.layout.reply_size - REPLY_OFFSET_PAYLOAD;
        if u64::from(len) + u64::from(console_len) > capacity {
            return Err(CarrierError::Protocol(format!(
                "reply of {len} bytes and {console_len} console bytes is larger than the \
                 {capacity}-byte reply area"
            )));
        }
        if console_len > 0 {
            let mut console = vec![0u8; console_len as usize];
            // SAFETY: the console bytes follow the payload inside the reply
            // area (checked just above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.at(base + REPLY_OFFSET_PAYLOAD + u64::from(len)),
                    console.as_mut_ptr(),
                    console.len(),
                );
            }
            let mut kept = self.console.lock().unwrap_or_else(PoisonError::into_inner);
            match kept.as_mut() {
                Some(kept) => kept.extend_from_slice(&console),
                None => crate::console::write_stdout(&console),
            }
        }
        let mut payload = vec![0u8; len as usize];
        // SAFETY: `len` bytes from the payload offset stay inside the reply
        // area (checked just above).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.at(base + REPLY_OFFSET_PAYLOAD),
                payload.as_mut_ptr(),
                payload.len(),
            );
        }
        Ok(Reply { result, payload })
    }
}

/// A key for this channel's ring stamps: random enough that no stale byte
/// pattern matches by accident (the std hasher's keys are random per
/// process and per call).
fn random_key() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// Polls of a counter between two reads of the clock while spinning.
const POLLS_PER_CLOCK_READ: u32 = 16;

/// The longest a caller polls for an answer while the host is still
/// waking up (its doorbell passes several threads after idle: 0.25-0.35 ms
/// on an H100 host, ARCHITECTURE 7.9), before it sleeps on a fence, whose
/// wake-up comes back the same way.
pub const DEFAULT_WAKE_SPIN: Duration = Duration::from_millis(2);

/// How long a caller polls before it sleeps on a fence: `spin` from the
/// moment the host is seen awake, so a host that had gone to sleep is given
/// its wake-up on top (at most `wake_spin` in all).
struct SpinWindow {
    /// When polling ends whatever the host does.
    last: Instant,
    until: Instant,
    spin: Duration,
    /// The host was asleep at the last look.
    waking: bool,
}

impl SpinWindow {
    fn new(spin: Duration, wake_spin: Duration) -> SpinWindow {
        let started = Instant::now();
        SpinWindow {
            last: started + wake_spin.max(spin),
            until: started + spin,
            spin,
            waking: false,
        }
    }

    /// Whether to stop polling (reads the clock). A spin time of zero
    /// (`RGPU_SPIN_US=0`) polls not at all, wake-up or not.
    fn over(&mut self, host_asleep: impl FnOnce() -> bool) -> bool {
        let now = Instant::now();
        if now < self.until {
            return false;
        }
        if self.spin.is_zero() || now >= self.last {
            return true;
        }
        // Asleep: wait for it. Just seen awake after that: the spin starts
        // now (it may have woken an instant ago).
        let asleep = host_asleep();
        if asleep || std::mem::take(&mut self.waking) {
            self.waking = asleep;
            self.until = now + self.spin;
            return false;
        }
        true
    }
}

/// Copy-engine speed assumed for a copy the caller waits for (a little
/// under what the host's GPU does from pinned memory).
const EXPECTED_COPY_BYTES_PER_S: u64 = 40_000_000_000;
/// The longest wait that is spent polling rather than sleeping.
const MAX_EXPECTED_SPIN: Duration = Duration::from_millis(20);

/// How long the host will take over a copy between device and blob memory
/// that the caller waits for. The caller polls that long (as NVIDIA's
/// driver spins while the copy runs) instead of sleeping on a fence, whose
/// wake-up crosses the daemon's connection and worker processes.
fn expected_duration(command: &Command) -> Duration {
    let bytes = match command {
        Command::MemcpyHtoD { src, .. } => src.length,
        Command::MemcpyDtoH { dst, .. } => dst.length,
        _ => return Duration::ZERO,
    };
    expected_bytes_duration(bytes)
}

/// How long the host takes to copy `bytes` between device and blob memory.
fn expected_bytes_duration(bytes: u64) -> Duration {
    let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(EXPECTED_COPY_BYTES_PER_S);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).min(MAX_EXPECTED_SPIN)
}

#[cfg(test)]
mod tests;

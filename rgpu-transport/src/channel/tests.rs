//! Channel tests against an in-process fake carrier whose "host" thread
//! drains the ring as rgpu-proto `channel` says: execute while consumed <
//! produced, spin, announce idleness, sleep until a submit arrives; complete
//! fenced doorbells once consumed reaches their `until`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rgpu_proto::batch::decode_batch;
use rgpu_proto::capset::Capset;
use rgpu_proto::channel::{
    idle_mode, idle_value, CHANNEL_MAGIC, GUEST_READS_IDLE_EPOCH, GUEST_WAKES_BY_FUTEX,
    HOST_IDLE_DOORBELL, HOST_IDLE_WAKE_WORD, OFFSET_CONSUMED, OFFSET_GUEST_FEATURES,
    OFFSET_HOST_IDLE, OFFSET_MAGIC, OFFSET_PRODUCED, OFFSET_VERSION, OFFSET_WAKE, REPLY_OFFSET_LEN,
    REPLY_OFFSET_PAYLOAD, REPLY_OFFSET_RESULT, REPLY_OFFSET_SEQ,
};
use rgpu_proto::command::{padded, ChannelLayout, CommandHeader, COMMAND_HEADER_SIZE};
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use rgpu_proto::{BlobRange, Command, ControlCommand, Opcode, PROTOCOL_VERSION};

use super::{expected_duration, Channel, ChannelConfig, MAX_EXPECTED_SPIN};
use crate::carrier::{BlobMapping, Carrier, CarrierError, FenceToken};
use crate::guest_memory::GuestMemory;

const DEVICE_BYTES: usize = 16 << 20;

#[derive(Default)]
struct HostState {
    blobs: HashMap<u32, (usize, u64)>,
    contexts: HashSet<u32>,
    next_id: u32,
    next_fence: u64,
    /// Fenced doorbells not yet signalled: token -> until.
    pending_fences: HashMap<u64, u64>,
    signalled: HashSet<u64>,
    wake: bool,
    stop: bool,
    /// Everything the worker executed except padding, in order.
    executed: Vec<(Command, u64)>,
    paddings: usize,
    padding_bytes: Vec<usize>,
    fenced_doorbells: usize,
    unfenced_doorbells: usize,
    blobs_created: usize,
    violations: Vec<String>,
    module_images: Vec<Vec<u8>>,
}

struct Shared {
    state: Mutex<HostState>,
    cv: Condvar,
    consumed: AtomicU64,
    /// Delay before executing each command that wants a reply.
    reply_delay: Duration,
    /// How long the worker polls `produced` before going idle.
    host_spin: Duration,
    /// How long a woken worker takes before it runs (the real host's
    /// doorbell passes several threads), still announcing itself idle.
    wake_delay: Duration,
    /// Sleep on the wake word where the guest announced it (a host sharing
    /// the guest's kernel).
    shares_kernel: bool,
    /// Number the idle spells where the guest reads them (a host that
    /// does not: one older than the numbers).
    numbers_idle: bool,
    bound: AtomicBool,
}

struct FakeHost {
    memory: GuestMemory,
    capset: Capset,
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// Raw view of the bound channel for the worker thread.
#[derive(Clone, Copy)]
struct Bound {
    base: usize,
    layout: ChannelLayout,
}

impl Bound {
    fn ptr(&self, offset: u64) -> *mut u8 {
        (self.base + offset as usize) as *mut u8
    }
    fn counter(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: header counters inside the live channel blob, 8-aligned.
        unsafe { AtomicU64::from_ptr(self.ptr(self.layout.header_offset + offset).cast()) }
    }
    fn word32(&self, offset: u64) -> &AtomicU32 {
        // SAFETY: a 4-aligned header word inside the live channel blob.
        unsafe { AtomicU32::from_ptr(self.ptr(self.layout.header_offset + offset).cast()) }
    }
    fn ring(&self, pos: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: callers check pos + len <= ring size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr(self.layout.ring_offset + pos),
                out.as_mut_ptr(),
                len,
            )
        };
        out
    }
}

impl FakeHost {
    fn new(reply_delay: Duration, host_spin: Duration) -> Arc<Self> {
        Self::waking(reply_delay, host_spin, Duration::ZERO, false)
    }

    /// [`FakeHost::waking`] (doorbells only) that does not number its
    /// idle spells, as a host older than the numbers.
    fn unnumbered(reply_delay: Duration, host_spin: Duration, wake_delay: Duration) -> Arc<Self> {
        Self::build(reply_delay, host_spin, wake_delay, false, false)
    }

    /// [`FakeHost::new`] whose worker takes `wake_delay` to wake, and
    /// sleeps on the wake word where the guest announced it and
    /// `shares_kernel`.
    fn waking(
        reply_delay: Duration,
        host_spin: Duration,
        wake_delay: Duration,
        shares_kernel: bool,
    ) -> Arc<Self> {
        Self::build(reply_delay, host_spin, wake_delay, shares_kernel, true)
    }

    fn build(
        reply_delay: Duration,
        host_spin: Duration,
        wake_delay: Duration,
        shares_kernel: bool,
        numbers_idle: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            memory: GuestMemory::new(64 << 20).unwrap(),
            capset: Capset {
                protocol_version: PROTOCOL_VERSION,
                driver_version: 13000,
                executor: "fake".into(),
                devices: vec![],
            },
            shared: Arc::new(Shared {
                state: Mutex::new(HostState {
                    next_id: 1,
                    next_fence: 1,
                    ..HostState::default()
                }),
                cv: Condvar::new(),
                consumed: AtomicU64::new(0),
                reply_delay,
                host_spin,
                wake_delay,
                shares_kernel,
                numbers_idle,
                bound: AtomicBool::new(false),
            }),
            worker: Mutex::new(None),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.shared.state.lock().unwrap()
    }

    fn bind(&self, layout: ChannelLayout) -> Result<(), CarrierError> {
        let (base, size) =
            *self
                .state()
                .blobs
                .get(&layout.resource_id)
                .ok_or(CarrierError::DeviceError {
                    command: "SUBMIT_3D",
                    response: 0x1203,
                })?;
        rgpu_proto::channel::validate_layout(&layout, size).map_err(|_| {
            CarrierError::DeviceError {
                command: "SUBMIT_3D",
                response: 0x1205,
            }
        })?;
        let bound = Bound { base, layout };
        // SAFETY: the header lies inside the blob.
        let (magic, version) = unsafe {
            (
                bound.ptr(OFFSET_MAGIC).cast::<u32>().read_volatile(),
                bound.ptr(OFFSET_VERSION).cast::<u32>().read_volatile(),
            )
        };
        assert_eq!((magic, version), (CHANNEL_MAGIC, PROTOCOL_VERSION));
        assert_eq!(bound.counter(OFFSET_PRODUCED).load(Ordering::SeqCst), 0);
        let shared = self.shared.clone();
        shared.bound.store(true, Ordering::SeqCst);
        *self.worker.lock().unwrap() = Some(std::thread::spawn(move || worker(shared, bound)));
        Ok(())
    }

    fn stop(&self) {
        self.state().stop = true;
        self.shared.cv.notify_all();
        if let Some(worker) = self.worker.lock().unwrap().take() {
            worker.join().unwrap();
        }
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        // The worker reads the blobs, which go away with the memory.
        self.stop();
    }
}

fn signal_fences(state: &mut HostState, consumed: u64) {
    let done: Vec<u64> = state
        .pending_fences
        .iter()
        .filter(|(_, until)| **until <= consumed)
        .map(|(token, _)| *token)
        .collect();
    for token in done {
        state.pending_fences.remove(&token);
        state.signalled.insert(token);
    }
}

fn worker(shared: Arc<Shared>, bound: Bound) {
    let ring = bound.layout.ring_size;
    let mut device = vec![0u8; DEVICE_BYTES];
    let mut next_alloc = 0x1000u64;
    let mut epoch = 0u64;
    loop {
        let produced = bound.counter(OFFSET_PRODUCED).load(Ordering::SeqCst);
        let consumed = shared.consumed.load(Ordering::SeqCst);
        if consumed < produced {
            let pos = consumed % ring;
            if ring - pos < COMMAND_HEADER_SIZE as u64 {
                shared
                    .state
                    .lock()
                    .unwrap()
                    .violations
                    .push(format!("header crosses the end at {pos}"));
                return;
            }
            // The real host reads every header, padding included, with the
            // proto decoder: so does this one.
            let header = match CommandHeader::decode(&bound.ring(pos, COMMAND_HEADER_SIZE)) {
                Ok(h) => h,
                Err(e) => {
                    shared
                        .state
                        .lock()
                        .unwrap()
                        .violations
                        .push(format!("header at {pos}: {e}"));
                    return;
                }
            };
            let opcode = header.opcode;
            let body_len = header.body_len as usize;
            if opcode == Opcode::Padding as u16 {
                shared.state.lock().unwrap().padding_bytes.push(body_len);
            }
            let wire = padded(COMMAND_HEADER_SIZE + body_len) as u64;
            if pos + wire > ring {
                shared
                    .state
                    .lock()
                    .unwrap()
                    .violations
                    .push(format!("command crosses the end at {pos}"));
                return;
            }
            if opcode == Opcode::Padding as u16 {
                shared.state.lock().unwrap().paddings += 1;
            } else {
                let body = bound.ring(pos + COMMAND_HEADER_SIZE as u64, body_len);
                let command = Command::decode_body(opcode, &body).unwrap();
                if header.reply_seq != 0 {
                    std::thread::sleep(shared.reply_delay);
                }
                let (result, payload) = execute(&shared, &command, &mut device, &mut next_alloc);
                if header.reply_seq != 0 {
                    let reply = bound.layout.reply_offset;
                    // SAFETY: the reply record lies inside the blob.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            payload.as_ptr(),
                            bound.ptr(reply + REPLY_OFFSET_PAYLOAD),
                            payload.len(),
                        );
                        bound
                            .ptr(reply + REPLY_OFFSET_RESULT)
                            .cast::<u32>()
                            .write_volatile(result);
                        bound
                            .ptr(reply + REPLY_OFFSET_LEN)
                            .cast::<u32>()
                            .write_volatile(payload.len() as u32);
                        AtomicU64::from_ptr(bound.ptr(reply + REPLY_OFFSET_SEQ).cast())
                            .store(header.reply_seq, Ordering::Release);
                    }
                }
                shared
                    .state
                    .lock()
                    .unwrap()
                    .executed
                    .push((command, header.reply_seq));
            }
            let consumed = consumed + wire;
            shared.consumed.store(consumed, Ordering::SeqCst);
            bound
                .counter(OFFSET_CONSUMED)
                .store(consumed, Ordering::SeqCst);
            let mut state = shared.state.lock().unwrap();
            signal_fences(&mut state, consumed);
            shared.cv.notify_all();
            continue;
        }
        // Idle: spin, announce, re-check, sleep until a submit.
        let spin_until = Instant::now() + shared.host_spin;
        let mut busy = false;
        while Instant::now() < spin_until {
            if bound.counter(OFFSET_PRODUCED).load(Ordering::SeqCst) != produced {
                busy = true;
                break;
            }
            std::hint::spin_loop();
        }
        if busy {
            continue;
        }
        let features = bound.counter(OFFSET_GUEST_FEATURES).load(Ordering::SeqCst);
        let by_word = shared.shares_kernel && features & GUEST_WAKES_BY_FUTEX != 0;
        // Numbered idle spells where the guest reads them, as the host's.
        if shared.numbers_idle && features & GUEST_READS_IDLE_EPOCH != 0 {
            epoch += 1;
        }
        if by_word {
            let word = bound.word32(OFFSET_WAKE);
            let seen = word.load(Ordering::SeqCst);
            bound
                .counter(OFFSET_HOST_IDLE)
                .store(idle_value(HOST_IDLE_WAKE_WORD, epoch), Ordering::SeqCst);
            if bound.counter(OFFSET_PRODUCED).load(Ordering::SeqCst) == produced {
                while word.load(Ordering::SeqCst) == seen {
                    if shared.state.lock().unwrap().stop {
                        return;
                    }
                    rgpu_proto::futex::wait(word, seen, Duration::from_millis(10));
                }
            }
        } else {
            bound
                .counter(OFFSET_HOST_IDLE)
                .store(idle_value(HOST_IDLE_DOORBELL, epoch), Ordering::SeqCst);
            if bound.counter(OFFSET_PRODUCED).load(Ordering::SeqCst) == produced {
                let mut state = shared.state.lock().unwrap();
                while !state.wake && !state.stop {
                    state = shared.cv.wait(state).unwrap();
                }
                state.wake = false;
                if state.stop {
                    return;
                }
            }
        }
        std::thread::sleep(shared.wake_delay);
        bound.counter(OFFSET_HOST_IDLE).store(0, Ordering::SeqCst);
    }
}

fn blob_bytes(shared: &Shared, range: &BlobRange) -> Option<(*mut u8, usize)> {
    let state = shared.state.lock().unwrap();
    let (base, size) = *state.blobs.get(&range.resource_id)?;
    let end = range.end()?;
    if end > size {
        return None;
    }
    Some((
        (base + range.offset as usize) as *mut u8,
        range.length as usize,
    ))
}

fn execute(
    shared: &Shared,
    command: &Command,
    device: &mut [u8],
    next_alloc: &mut u64,
) -> (u32, Vec<u8>) {
    match command {
        Command::MemAlloc { size } => {
            let ptr = *next_alloc;
            *next_alloc += size;
            (CUDA_SUCCESS, ptr.to_le_bytes().to_vec())
        }
        Command::MemcpyHtoD { dst, src, .. } => {
            let Some((p, len)) = blob_bytes(shared, src) else {
                return (CUDA_ERROR_INVALID_VALUE, vec![]);
            };
            let Some(out) = device.get_mut(*dst as usize..*dst as usize + len) else {
                return (CUDA_ERROR_INVALID_VALUE, vec![]);
            };
            // SAFETY: `p` points at `len` bytes inside a live blob.
            out.copy_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
            (CUDA_SUCCESS, vec![])
        }
        Command::MemcpyDtoH { dst, src, .. } => {
            let Some((p, len)) = blob_bytes(shared, dst) else {
                return (CUDA_ERROR_INVALID_VALUE, vec![]);
            };
            let Some(from) = device.get(*src as usize..*src as usize + len) else {
                return (CUDA_ERROR_INVALID_VALUE, vec![]);
            };
            // SAFETY: `p` points at `len` bytes inside a live blob.
            unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), p, len) };
            (CUDA_SUCCESS, vec![])
        }
        Command::ModuleLoad { image, .. } => {
            let Some((p, len)) = blob_bytes(shared, image) else {
                return (CUDA_ERROR_INVALID_VALUE, vec![]);
            };
            // SAFETY: `p` points at `len` bytes inside a live blob.
            let bytes = unsafe { std::slice::from_raw_parts(p, len) }.to_vec();
            shared.state.lock().unwrap().module_images.push(bytes);
            (CUDA_SUCCESS, (len as u64).to_le_bytes().to_vec())
        }
        _ => (CUDA_SUCCESS, vec![]),
    }
}

impl Carrier for FakeHost {
    fn capset(&self) -> &Capset {
        &self.capset
    }

    fn shares_host_kernel(&self) -> bool {
        self.shared.shares_kernel
    }

    fn create_context(&self, _debug_name: &str) -> Result<u32, CarrierError> {
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.contexts.insert(id);
        Ok(id)
    }

    fn destroy_context(&self, ctx_id: u32) -> Result<(), CarrierError> {
        self.stop();
        self.state().contexts.remove(&ctx_id);
        Ok(())
    }

    fn create_blob(&self, _ctx_id: u32, size: u64) -> Result<BlobMapping, CarrierError> {
        let (_, ptr) = self
            .memory
            .alloc(size)
            .map_err(|_| CarrierError::OutOfMemory(size))?;
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.blobs_created += 1;
        state.blobs.insert(id, (ptr as usize, size));
        Ok(BlobMapping {
            resource_id: id,
            ptr,
            size,
        })
    }

    fn attach_blob(&self, _ctx_id: u32, _resource_id: u32) -> Result<(), CarrierError> {
        Ok(())
    }

    fn destroy_blob(&self, _ctx_id: u32, resource_id: u32) -> Result<(), CarrierError> {
        let (ptr, _) =
            self.state()
                .blobs
                .remove(&resource_id)
                .ok_or(CarrierError::DeviceError {
                    command: "RESOURCE_UNREF",
                    response: 0x1203,
                })?;
        let gpa = ptr as u64 - self.memory.base() as u64;
        self.memory.free(gpa).unwrap();
        Ok(())
    }

    fn submit(
        &self,
        _ctx_id: u32,
        payload: &[u8],
        fenced: bool,
    ) -> Result<Option<FenceToken>, CarrierError> {
        let commands = decode_batch(payload).map_err(CarrierError::BadCapset)?;
        let mut token = None;
        let mut state = self.state();
        if fenced {
            let t = state.next_fence;
            state.next_fence += 1;
            token = Some(FenceToken(t));
            state.signalled.insert(t);
        }
        for decoded in commands {
            match decoded.command {
                ControlCommand::BindChannel { layout } => {
                    drop(state);
                    self.bind(layout)?;
                    state = self.state();
                }
                ControlCommand::Doorbell { until } => {
                    if let Some(FenceToken(t)) = token {
                        state.fenced_doorbells += 1;
                        if self.shared.consumed.load(Ordering::SeqCst) < until {
                            state.signalled.remove(&t);
                            state.pending_fences.insert(t, until);
                        }
                    } else {
                        state.unfenced_doorbells += 1;
                    }
                }
                other => panic!("unexpected command in a batch: {other:?}"),
            }
        }
        state.wake = true;
        self.shared.cv.notify_all();
        Ok(token)
    }

    fn wait_fence(&self, _ctx_id: u32, fence: FenceToken) -> Result<(), CarrierError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut state = self.state();
        loop {
            if state.signalled.remove(&fence.0) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CarrierError::Disconnected);
            }
            state = self
                .shared
                .cv
                .wait_timeout(state, deadline - now)
                .unwrap()
                .0;
        }
    }

    fn raw_control(&self, _request: &[u8], _response_len: usize) -> Result<Vec<u8>, CarrierError> {
        Err(CarrierError::Disconnected)
    }
}

fn config(ring_size: u64, bounce_size: u64, spin: Duration) -> ChannelConfig {
    ChannelConfig {
        ring_size,
        reply_size: 4096,
        bounce_size,
        spin,
        wake_spin: super::DEFAULT_WAKE_SPIN,
        copy_threads: 1,
        wake_word: true,
    }
}

fn open(host: &Arc<FakeHost>, config: ChannelConfig) -> Channel {
    let carrier: Arc<dyn Carrier> = host.clone();
    Channel::open_with_config(carrier, "test", config).unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn call_gets_its_reply_and_close_frees_everything() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    let channel = open(&host, config(64 << 10, 4096, Duration::from_micros(50)));
    assert!(host.shared.bound.load(Ordering::SeqCst));
    assert_eq!(channel.ctx_id(), 1);
    assert_eq!(channel.layout().ring_offset, 4096);
    let reply = channel.call(&Command::MemAlloc { size: 256 }).unwrap();
    assert_eq!(reply.result, CUDA_SUCCESS);
    assert_eq!(reply.payload, 0x1000u64.to_le_bytes());
    let reply = channel.call(&Command::MemAlloc { size: 16 }).unwrap();
    assert_eq!(reply.payload, 0x1100u64.to_le_bytes());
    channel.close().unwrap();
    let state = host.state();
    assert!(state.blobs.is_empty());
    assert!(state.contexts.is_empty());
    assert!(state.violations.is_empty());
}

#[test]
fn ring_wraps_with_padding_and_keeps_order() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    let channel = open(&host, config(4096, 4096, Duration::from_micros(50)));
    for i in 1..=600u32 {
        channel
            .send(&Command::StreamCreate {
                stream: i,
                flags: 0,
                priority: 0,
            })
            .unwrap();
        // Names of varying length move the ring position by 8-byte steps.
        channel
            .send(&Command::ModuleGetFunction {
                module: i,
                function: i,
                name: vec![b'k'; (i % 13) as usize + 1],
            })
            .unwrap();
    }
    let reply = channel.call(&Command::CtxSynchronize).unwrap();
    assert_eq!(reply.result, CUDA_SUCCESS);
    let state = host.state();
    assert!(state.violations.is_empty(), "{:?}", state.violations);
    assert!(state.paddings > 0);
    let streams: Vec<u32> = state
        .executed
        .iter()
        .filter_map(|(c, _)| match c {
            Command::StreamCreate { stream, .. } => Some(*stream),
            _ => None,
        })
        .collect();
    assert_eq!(streams, (1..=600).collect::<Vec<_>>());
    assert_eq!(state.executed.len(), 1201);
    assert!(matches!(state.executed.last(), Some((Command::CtxSynchronize, s)) if *s != 0));
}

#[test]
fn inline_data_arrives_intact_and_reads_back_through_the_bounce_area() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    // Ring 16 KiB: 4 KiB chunks; bounce 4 KiB: several read-back rounds.
    let channel = open(&host, config(16 << 10, 4096, Duration::from_micros(50)));
    let data = pattern(100_003, 7);
    assert_eq!(
        channel.copy_to_device(0, 0x100, &data, false).unwrap(),
        CUDA_SUCCESS
    );
    let more = pattern(9_000, 8);
    assert_eq!(
        channel.copy_to_device(0, 0x20_0000, &more, true).unwrap(),
        CUDA_SUCCESS
    );

    let mut back = vec![0u8; data.len()];
    assert_eq!(
        channel.copy_from_device(0, &mut back, 0x100).unwrap(),
        CUDA_SUCCESS
    );
    assert!(back == data, "data read back differs");
    let mut back = vec![0u8; more.len()];
    assert_eq!(
        channel.copy_from_device(0, &mut back, 0x20_0000).unwrap(),
        CUDA_SUCCESS
    );
    assert!(back == more, "second buffer read back differs");

    // A host error stops the read and is returned.
    let mut past_end = vec![0u8; 8192];
    assert_eq!(
        channel
            .copy_from_device(0, &mut past_end, (DEVICE_BYTES - 4096) as u64)
            .unwrap(),
        CUDA_ERROR_INVALID_VALUE
    );
    let state = host.state();
    assert!(state.violations.is_empty(), "{:?}", state.violations);
    let htod = state
        .executed
        .iter()
        .filter(|(c, _)| matches!(c, Command::MemcpyHtoD { .. }))
        .count();
    assert_eq!(
        htod,
        100_003usize.div_ceil(4096) + 9_000usize.div_ceil(4096)
    );
}

#[test]
fn reply_by_polling_needs_no_fence() {
    // The host answers after 5 ms; the guest polls for up to 5 s.
    let host = FakeHost::new(Duration::from_millis(5), Duration::from_millis(50));
    let channel = open(&host, config(64 << 10, 4096, Duration::from_secs(5)));
    for _ in 0..3 {
        let reply = channel.call(&Command::MemGetInfo).unwrap();
        assert_eq!(reply.result, CUDA_SUCCESS);
    }
    assert_eq!(host.state().fenced_doorbells, 0);
}

#[test]
fn reply_by_fence_when_polling_gives_up() {
    // No polling at all: every call sleeps on a fenced doorbell.
    let host = FakeHost::new(Duration::from_millis(5), Duration::from_micros(20));
    let channel = open(&host, config(64 << 10, 4096, Duration::ZERO));
    for size in 1..=3u64 {
        let reply = channel.call(&Command::MemAlloc { size }).unwrap();
        assert_eq!(reply.result, CUDA_SUCCESS);
        assert_eq!(reply.payload.len(), 8);
    }
    assert_eq!(host.state().fenced_doorbells, 3);
}

#[test]
fn idle_host_is_woken_by_a_doorbell() {
    let host = FakeHost::new(Duration::ZERO, Duration::ZERO);
    let channel = open(&host, config(64 << 10, 4096, Duration::from_secs(5)));
    // Let the worker go idle.
    let deadline = Instant::now() + Duration::from_secs(5);
    while host.state().unfenced_doorbells == 0 {
        channel.send(&Command::CtxSynchronize).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(Instant::now() < deadline, "no doorbell was ever rung");
    }
    assert_eq!(
        channel.call(&Command::MemGetInfo).unwrap().result,
        CUDA_SUCCESS
    );
}

/// A channel that polls 20 ms once the host is awake (long enough for a
/// fake host preempted after it woke) and through a wake-up of any length.
fn open_patient(host: &Arc<FakeHost>, wake_word: bool) -> Channel {
    open(
        host,
        ChannelConfig {
            wake_word,
            wake_spin: Duration::from_secs(5),
            ..config(64 << 10, 4096, Duration::from_millis(20))
        },
    )
}

/// Waits until the host says it is idle, in mode `flag`.
fn await_host_idle(channel: &Channel, flag: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while idle_mode(channel.counter(OFFSET_HOST_IDLE).load(Ordering::SeqCst)) != flag {
        assert!(Instant::now() < deadline, "the host never went idle");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A call to a host that went idle keeps polling while the host wakes up
/// (its doorbell passes threads that slept), then its usual spin time,
/// instead of sleeping on a fence whose wake-up comes back the same way.
#[test]
fn a_call_polls_through_the_hosts_wake_up() {
    // A wake-up (50 ms) longer than the caller's spin (20 ms), which is
    // still long enough that a host preempted on a loaded test machine
    // after it woke answers within it.
    let host = FakeHost::waking(
        Duration::ZERO,
        Duration::from_micros(20),
        Duration::from_millis(50),
        false,
    );
    let channel = open_patient(&host, true);
    for _ in 0..3 {
        await_host_idle(&channel, HOST_IDLE_DOORBELL);
        assert_eq!(
            channel.call(&Command::MemGetInfo).unwrap().result,
            CUDA_SUCCESS
        );
    }
    // Each call found the host asleep, but a doorbell left over from a
    // publish that raced the host's going idle may have woken it before
    // the next: at least one doorbell, and never a fence.
    let state = host.state();
    assert_eq!(
        state.fenced_doorbells, 0,
        "a call slept through the wake-up"
    );
    assert!(state.unfenced_doorbells >= 1);
}

/// A guest sharing the host's kernel wakes an idle host through the wake
/// word: no doorbell is rung; with `RGPU_WAKE_WORD=0` (or a carrier that
/// does not share the kernel) the doorbell is.
#[test]
fn a_local_channel_wakes_the_host_by_the_wake_word() {
    for wake_word in [true, false] {
        let host = FakeHost::waking(
            Duration::ZERO,
            Duration::from_micros(20),
            Duration::ZERO,
            true,
        );
        let channel = open_patient(&host, wake_word);
        let flag = if wake_word {
            HOST_IDLE_WAKE_WORD
        } else {
            HOST_IDLE_DOORBELL
        };
        for size in 1..=3u64 {
            await_host_idle(&channel, flag);
            let reply = channel.call(&Command::MemAlloc { size }).unwrap();
            assert_eq!(reply.result, CUDA_SUCCESS);
        }
        let state = host.state();
        assert_eq!(state.fenced_doorbells, 0);
        if wake_word {
            assert_eq!(state.unfenced_doorbells, 0);
        } else {
            assert!(state.unfenced_doorbells >= 1);
        }
    }
}

/// Two publishes before an idle host is awake (a launch, then its
/// synchronize) ring one doorbell where the host numbers its idle spells,
/// two where it does not (an older host, whose value says nothing about
/// whether this spell was rung for).
#[test]
fn a_guest_rings_once_per_numbered_idle_spell() {
    for numbered in [true, false] {
        // A wake-up (50 ms) that both publishes fall within.
        let (reply, spin, wake) = (
            Duration::ZERO,
            Duration::from_micros(20),
            Duration::from_millis(50),
        );
        let host = match numbered {
            true => FakeHost::waking(reply, spin, wake, false),
            false => FakeHost::unnumbered(reply, spin, wake),
        };
        let channel = open_patient(&host, true);
        for _ in 0..3 {
            await_host_idle(&channel, HOST_IDLE_DOORBELL);
            channel.send(&Command::CtxSynchronize).unwrap();
            assert_eq!(
                channel.call(&Command::MemGetInfo).unwrap().result,
                CUDA_SUCCESS
            );
        }
        let state = host.state();
        assert_eq!(state.fenced_doorbells, 0);
        assert_eq!(
            state.unfenced_doorbells,
            if numbered { 3 } else { 6 },
            "numbered idle spells: {numbered}"
        );
    }
}

#[test]
fn call_with_data_inline_and_through_a_temporary_blob() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    let channel = open(&host, config(16 << 10, 4096, Duration::from_micros(50)));
    let small = pattern(3000, 1);
    let large = pattern(50_000, 2);
    for image in [&small, &large] {
        let reply = channel
            .call_with_data(image, &|range| Command::ModuleLoad {
                module: 9,
                image: range,
            })
            .unwrap();
        assert_eq!(reply.result, CUDA_SUCCESS);
        assert_eq!(reply.payload, (image.len() as u64).to_le_bytes());
    }
    let state = host.state();
    assert_eq!(state.module_images.len(), 2);
    assert!(state.module_images[0] == small);
    assert!(state.module_images[1] == large);
    // The channel blob plus one temporary blob, which is gone again.
    assert_eq!(state.blobs_created, 2);
    assert_eq!(state.blobs.len(), 1);
}

#[test]
fn threads_share_a_channel() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    let channel = Arc::new(open(&host, config(8192, 4096, Duration::from_micros(50))));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let channel = channel.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    channel
                        .send(&Command::StreamCreate {
                            stream: (t * 1000 + i) as u32,
                            flags: 0,
                            priority: 0,
                        })
                        .unwrap();
                    let reply = channel.call(&Command::MemGetInfo).unwrap();
                    assert_eq!(reply.result, CUDA_SUCCESS);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let state = host.state();
    assert!(state.violations.is_empty());
    assert_eq!(state.executed.len(), 800);
    // Replies are numbered in the order commands were written.
    let seqs: Vec<u64> = state
        .executed
        .iter()
        .map(|(_, s)| *s)
        .filter(|s| *s != 0)
        .collect();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
}

#[test]
fn long_tail_padding_is_one_decodable_piece() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    let channel = open(&host, config(256 << 10, 4096, Duration::from_micros(50)));
    // One 48-byte and 4914 40-byte commands leave 65536 bytes before the
    // end: less than a 64 KiB inline copy needs.
    channel
        .send(&Command::ModuleGetFunction {
            module: 1,
            function: 1,
            name: b"abcde".to_vec(),
        })
        .unwrap();
    for i in 0..4914 {
        channel
            .send(&Command::StreamCreate {
                stream: i,
                flags: 0,
                priority: 0,
            })
            .unwrap();
    }
    let data = pattern(65536, 3);
    assert_eq!(
        channel.copy_to_device(0, 0, &data, true).unwrap(),
        CUDA_SUCCESS
    );
    let mut back = vec![0u8; data.len()];
    assert_eq!(
        channel.copy_from_device(0, &mut back, 0).unwrap(),
        CUDA_SUCCESS
    );
    assert!(back == data);
    let state = host.state();
    assert!(state.violations.is_empty(), "{:?}", state.violations);
    // The tail: 65512 + 24 bytes, as one padding (Padding bodies may be as
    // long as a ring); then the staged data.
    assert_eq!(state.padding_bytes, vec![65512, 65536]);
}

#[test]
fn large_copies_split_among_copy_threads_arrive_intact() {
    let host = FakeHost::new(Duration::ZERO, Duration::from_micros(20));
    // The default ring and bounce area: 2 MiB chunks and slots, each copied
    // by four threads.
    let channel = open(
        &host,
        ChannelConfig {
            copy_threads: 4,
            ..config(8 << 20, 8 << 20, Duration::from_micros(50))
        },
    );
    let data = pattern((12 << 20) + 4099, 11);
    assert_eq!(
        channel.copy_to_device(0, 0x3000, &data, true).unwrap(),
        CUDA_SUCCESS
    );
    let mut back = vec![0u8; data.len()];
    assert_eq!(
        channel.copy_from_device(0, &mut back, 0x3000).unwrap(),
        CUDA_SUCCESS
    );
    assert!(back == data, "data read back differs");
    let state = host.state();
    assert!(state.violations.is_empty(), "{:?}", state.violations);
    let copies = |htod: bool| {
        state
            .executed
            .iter()
            .filter(|(c, _)| match c {
                Command::MemcpyHtoD { .. } => htod,
                Command::MemcpyDtoH { .. } => !htod,
                _ => false,
            })
            .count()
    };
    // 2 MiB pieces both ways.
    assert_eq!((copies(true), copies(false)), (7, 7));
}

#[test]
fn waits_for_copies_are_polled_for_their_expected_length() {
    let range = |length| BlobRange {
        resource_id: 1,
        offset: 0,
        length,
    };
    let htod = Command::MemcpyHtoD {
        stream: 0,
        dst: 0x1000,
        src: range(256 << 20),
    };
    let expected = expected_duration(&htod);
    assert!(
        expected > Duration::from_millis(6) && expected < Duration::from_millis(7),
        "{expected:?}"
    );
    let dtoh = Command::MemcpyDtoH {
        stream: 0,
        dst: range(u64::MAX),
        src: 0x1000,
    };
    assert_eq!(expected_duration(&dtoh), MAX_EXPECTED_SPIN);
    assert_eq!(expected_duration(&Command::CtxSynchronize), Duration::ZERO);
}

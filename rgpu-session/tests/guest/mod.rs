//! The guest side of a channel, played by hand for the session tests: a
//! channel blob and a data blob in anonymous "guest memory", commands
//! written into the ring with rgpu-proto's encoders, doorbells through
//! `Session::submit`.

#![allow(dead_code)] // Each test crate uses a different part of it.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_executor::sim::SimExecutor;
use rgpu_executor::{ContextExecutor, CuResult, DeviceStatus, Executor, HostRun};
use rgpu_proto::capset::DeviceInfo;
use rgpu_proto::channel::{
    idle_mode, ring_stamp, CHANNEL_MAGIC, GUEST_WAKES_BY_FUTEX, OFFSET_CONSUMED,
    OFFSET_GUEST_FEATURES, OFFSET_HOST_IDLE, OFFSET_MAGIC, OFFSET_PRODUCED, OFFSET_STAMP_KEY,
    OFFSET_VERSION, OFFSET_WAKE, REPLY_OFFSET_LEN, REPLY_OFFSET_PAYLOAD, REPLY_OFFSET_RESULT,
    REPLY_OFFSET_SEQ,
};
use rgpu_proto::command::{
    ChannelLayout, CommandHeader, Decoded, COMMAND_HEADER_SIZE, COMMAND_STAMP_OFFSET,
};
use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::virtio_gpu::MemEntry;
use rgpu_proto::wire::WireWriter;
use rgpu_proto::{BlobRange, Command, ControlCommand, PROTOCOL_VERSION};
use rgpu_session::{AtomicGuestMemory, Blob, Completion, Counters, GuestMemory, Session};
use vm_memory::GuestAddress;

pub const CHANNEL_BLOB: u32 = 1;
pub const DATA_BLOB: u32 = 2;
pub const HEADER_OFFSET: u64 = 0;
pub const RING_OFFSET: u64 = 4096;
pub const RING_SIZE: u64 = 8192;
pub const REPLY_OFFSET: u64 = 12288;
pub const REPLY_SIZE: u64 = 4096;
pub const CHANNEL_SIZE: u64 = 16384;
pub const DATA_SIZE: u64 = 256 * 1024;
pub const WAIT: Duration = Duration::from_secs(10);

/// The sim executor on a host whose NVML reports neither the memory
/// utilisation (the session answers UTILIZATION_UNKNOWN) nor per-process
/// device memory: what tests need where several guest processes, each a
/// worker process with its executor of its own in the daemon, share one
/// executor (its figure would be theirs all together).
pub struct PartialNvml(pub Arc<SimExecutor>);

impl Executor for PartialNvml {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn driver_version(&self) -> i32 {
        self.0.driver_version()
    }
    fn devices(&self) -> Vec<DeviceInfo> {
        self.0.devices()
    }
    fn create_context(&self, device: u32) -> CuResult<Box<dyn ContextExecutor>> {
        self.0.create_context(device)
    }
    fn register_host_memory(&self, run: HostRun) -> CuResult<()> {
        self.0.register_host_memory(run)
    }
    fn unregister_host_memory(&self, run: HostRun) {
        self.0.unregister_host_memory(run)
    }
    fn device_status(&self, device: u32) -> CuResult<DeviceStatus> {
        let status = self.0.device_status(device)?;
        Ok(DeviceStatus {
            memory_utilization: None,
            ..status
        })
    }
}

/// The channel blob's pages, scattered so that nothing in it is contiguous
/// on the host: header, ring (two pages), reply area.
pub fn channel_entries() -> Vec<MemEntry> {
    [0x10000, 0x15000, 0x12000, 0x11000]
        .into_iter()
        .map(|addr| MemEntry {
            addr,
            length: 0x1000,
        })
        .collect()
}

pub fn data_entries() -> Vec<MemEntry> {
    vec![MemEntry {
        addr: 0x100000,
        length: DATA_SIZE as u32,
    }]
}

pub fn layout() -> ChannelLayout {
    ChannelLayout {
        resource_id: CHANNEL_BLOB,
        header_offset: HEADER_OFFSET,
        ring_offset: RING_OFFSET,
        ring_size: RING_SIZE,
        reply_offset: REPLY_OFFSET,
        reply_size: REPLY_SIZE,
        bounce_offset: 0,
        bounce_size: 0,
    }
}

pub fn decoded<C>(command: C) -> Decoded<C> {
    Decoded {
        reply_seq: 0,
        command,
        wire_len: 0,
    }
}

pub struct Signal(mpsc::Sender<()>);

impl Completion for Signal {
    fn complete(self: Box<Self>) {
        let _ = self.0.send(());
    }
}

pub fn signal() -> (Box<dyn Completion>, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    (Box::new(Signal(tx)), rx)
}

/// The guest side: its own views of the blobs, its ring position.
pub struct Guest {
    pub memory: AtomicGuestMemory,
    pub channel: Blob,
    pub data: Blob,
    pub produced: u64,
    pub next_seq: u64,
    /// The key of the ring stamps ([`Guest::push_stamped`]).
    pub stamp_key: u64,
}

impl Guest {
    pub fn new() -> Self {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 0x200000)])
            .unwrap_or_else(|e| panic!("guest memory: {e}"));
        let memory = AtomicGuestMemory::new(mem);
        let channel = Blob::new(CHANNEL_BLOB, CHANNEL_SIZE, &channel_entries(), &memory).unwrap();
        let data = Blob::new(DATA_BLOB, DATA_SIZE, &data_entries(), &memory).unwrap();
        channel
            .write(HEADER_OFFSET + OFFSET_MAGIC, &CHANNEL_MAGIC.to_le_bytes())
            .unwrap();
        channel
            .write(
                HEADER_OFFSET + OFFSET_VERSION,
                &PROTOCOL_VERSION.to_le_bytes(),
            )
            .unwrap();
        let stamp_key: u64 = 0x5eed_0f57_a39b_1d2c;
        channel
            .write(HEADER_OFFSET + OFFSET_STAMP_KEY, &stamp_key.to_le_bytes())
            .unwrap();
        Self {
            memory,
            channel,
            data,
            produced: 0,
            next_seq: 1,
            stamp_key,
        }
    }

    /// A session with both blobs attached and the channel bound.
    pub fn start(&self, executor: Arc<dyn Executor>, counters: Arc<Counters>) -> Session {
        let session = Session::spawn(7, "test".into(), 0, executor, counters).unwrap();
        self.bind(session)
    }

    /// [`Guest::start`], the session counted in `tenant` (whose settings,
    /// the module cache among them, it runs with).
    pub fn start_in(
        &self,
        executor: Arc<dyn Executor>,
        counters: Arc<Counters>,
        tenant: Arc<rgpu_session::Tenant>,
    ) -> Session {
        let session =
            Session::spawn_in_tenant(7, "test".into(), 0, executor, counters, tenant).unwrap();
        self.bind(session)
    }

    /// Attaches both blobs to a new session and binds the channel.
    pub fn bind(&self, session: Session) -> Session {
        session.attach_blob(Arc::new(
            Blob::new(CHANNEL_BLOB, CHANNEL_SIZE, &channel_entries(), &self.memory).unwrap(),
        ));
        session.attach_blob(Arc::new(
            Blob::new(DATA_BLOB, DATA_SIZE, &data_entries(), &self.memory).unwrap(),
        ));
        let (done, rx) = signal();
        session.submit(
            vec![decoded(ControlCommand::BindChannel { layout: layout() })],
            Some(done),
        );
        rx.recv_timeout(WAIT).unwrap();
        session
    }

    pub fn counter(&self, offset: u64) -> u64 {
        self.channel
            .atomic_u64(HEADER_OFFSET + offset)
            .unwrap()
            .load(Ordering::SeqCst)
    }

    pub fn consumed(&self) -> u64 {
        self.counter(OFFSET_CONSUMED)
    }

    /// Waits until the reply numbered `seq` is in, failing with `what`
    /// after [`WAIT`]; returns its result.
    pub fn await_reply(&self, seq: u64, what: &str) -> u32 {
        let deadline = Instant::now() + WAIT;
        loop {
            let (got, result, _) = self.reply();
            if got == seq {
                return result;
            }
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the host says it sleeps, and how to wake it (`flag`,
    /// a `host_idle` mode, numbered or not); returns the value.
    pub fn await_host_idle(&self, flag: u64) -> u64 {
        let deadline = Instant::now() + WAIT;
        loop {
            let value = self.counter(OFFSET_HOST_IDLE);
            if idle_mode(value) == flag {
                return value;
            }
            assert!(Instant::now() < deadline, "host never went idle ({flag})");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Says, before the channel is bound, that this guest wakes the host
    /// through the wake word (as a local guest-lib does).
    pub fn announce_wake_word(&self) {
        self.announce_features(GUEST_WAKES_BY_FUTEX);
    }

    /// Writes the guest's feature bits, before the channel is bound.
    pub fn announce_features(&self, features: u64) {
        self.channel
            .write(
                HEADER_OFFSET + OFFSET_GUEST_FEATURES,
                &features.to_le_bytes(),
            )
            .unwrap();
    }

    /// Bumps and wakes the wake word, as a local guest-lib does after
    /// publishing to a host asleep on it.
    pub fn wake_word(&self) {
        let word = self
            .channel
            .atomic_u32(HEADER_OFFSET + OFFSET_WAKE)
            .unwrap();
        word.fetch_add(1, Ordering::SeqCst);
        rgpu_proto::futex::wake(word);
    }

    pub fn publish(&self) {
        self.channel
            .atomic_u64(HEADER_OFFSET + OFFSET_PRODUCED)
            .unwrap()
            .store(self.produced, Ordering::SeqCst);
    }

    /// Waits (fenced doorbell) until the host executed everything produced.
    pub fn kick(&self, session: &Session) {
        let (done, rx) = signal();
        session.submit(
            vec![decoded(ControlCommand::Doorbell {
                until: self.produced,
            })],
            Some(done),
        );
        rx.recv_timeout(WAIT).expect("doorbell fence");
        assert!(self.consumed() >= self.produced);
    }

    /// Ring position where `bytes` will land, after making room (waiting
    /// for the host, padding the ring's tail).
    pub fn reserve(&mut self, session: &Session, len: u64) -> u64 {
        let position = self.produced % RING_SIZE;
        let tail = RING_SIZE - position;
        let needed = if tail < len { tail + len } else { len };
        if self.produced + needed - self.consumed() > RING_SIZE {
            self.publish();
            self.kick(session);
        }
        if tail < len {
            if tail >= COMMAND_HEADER_SIZE as u64 {
                let mut w = WireWriter::new();
                CommandHeader {
                    opcode: 0,
                    flags: 0,
                    body_len: (tail - COMMAND_HEADER_SIZE as u64) as u32,
                    reply_seq: 0,
                    stamp: 0,
                }
                .encode(&mut w);
                self.channel
                    .write(RING_OFFSET + position, w.as_bytes())
                    .unwrap();
            }
            // A tail shorter than a header is skipped without a command.
            self.produced += tail;
        }
        self.produced % RING_SIZE
    }

    /// Writes raw bytes into the ring (not published).
    pub fn push_raw(&mut self, session: &Session, bytes: &[u8]) {
        let position = self.reserve(session, bytes.len() as u64);
        self.channel.write(RING_OFFSET + position, bytes).unwrap();
        self.produced += bytes.len() as u64;
    }

    /// Writes `command` with the stamp of its position (or of `stamp_at`
    /// when given: a stale one), stamp last, and does not publish it.
    pub fn push_stamped(
        &mut self,
        session: &Session,
        command: &Command,
        seq: u64,
        stamp_at: Option<u64>,
    ) {
        self.push_raw_stamped(session, &command.to_bytes(seq), stamp_at);
    }

    /// [`Guest::push_stamped`] for raw bytes (a whole header at least).
    pub fn push_raw_stamped(&mut self, session: &Session, bytes: &[u8], stamp_at: Option<u64>) {
        // (Padding that `reserve` writes at the ring's end is unstamped.)
        let position = self.reserve(session, bytes.len() as u64);
        let at = self.produced;
        self.channel.write(RING_OFFSET + position, bytes).unwrap();
        self.channel
            .atomic_u64(RING_OFFSET + position + COMMAND_STAMP_OFFSET as u64)
            .unwrap()
            .store(
                ring_stamp(self.stamp_key, stamp_at.unwrap_or(at)),
                Ordering::Release,
            );
        self.produced = at + bytes.len() as u64;
    }

    pub fn push(&mut self, session: &Session, command: &Command, seq: u64) {
        self.push_raw(session, &command.to_bytes(seq));
    }

    /// A command without reply, published but without a doorbell.
    pub fn send(&mut self, session: &Session, command: Command) {
        self.push(session, &command, 0);
        self.publish();
    }

    pub fn reply(&self) -> (u64, u32, Vec<u8>) {
        let seq = self
            .channel
            .atomic_u64(REPLY_OFFSET + REPLY_OFFSET_SEQ)
            .unwrap()
            .load(Ordering::Acquire);
        let mut word = [0u8; 4];
        self.channel
            .read(REPLY_OFFSET + REPLY_OFFSET_RESULT, &mut word)
            .unwrap();
        let result = u32::from_le_bytes(word);
        self.channel
            .read(REPLY_OFFSET + REPLY_OFFSET_LEN, &mut word)
            .unwrap();
        let mut payload = vec![0u8; u32::from_le_bytes(word) as usize];
        self.channel
            .read(REPLY_OFFSET + REPLY_OFFSET_PAYLOAD, &mut payload)
            .unwrap();
        (seq, result, payload)
    }

    /// Pushes raw command bytes carrying `seq`, waits, returns the reply.
    pub fn call_raw(&mut self, session: &Session, bytes: &[u8], seq: u64) -> (u32, Vec<u8>) {
        self.push_raw(session, bytes);
        self.publish();
        self.kick(session);
        let (got, result, payload) = self.reply();
        assert_eq!(got, seq, "reply sequence number");
        (result, payload)
    }

    /// Writes `image` into the data blob at `offset` and loads it as
    /// module `module`: the command's result.
    pub fn load_module(
        &mut self,
        session: &Session,
        module: u32,
        offset: u64,
        image: &[u8],
    ) -> u32 {
        self.data.write(offset, image).unwrap();
        let image = Guest::data_range(offset, image.len() as u64);
        self.call(session, Command::ModuleLoad { module, image }).0
    }

    pub fn call(&mut self, session: &Session, command: Command) -> (u32, Vec<u8>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.call_raw(session, &command.to_bytes(seq), seq)
    }

    /// Stages `data` in the ring as a Padding body; returns its blob range.
    pub fn stage(&mut self, session: &Session, data: &[u8]) -> BlobRange {
        let mut w = WireWriter::new();
        CommandHeader {
            opcode: 0,
            flags: 0,
            body_len: data.len() as u32,
            reply_seq: 0,
            stamp: 0,
        }
        .encode(&mut w);
        w.raw(data).pad_to(8);
        let position = self.reserve(session, w.len() as u64);
        self.channel
            .write(RING_OFFSET + position, w.as_bytes())
            .unwrap();
        self.produced += w.len() as u64;
        BlobRange {
            resource_id: CHANNEL_BLOB,
            offset: RING_OFFSET + position + COMMAND_HEADER_SIZE as u64,
            length: data.len() as u64,
        }
    }

    pub fn alloc(&mut self, session: &Session, size: u64) -> u64 {
        let (result, payload) = self.call(session, Command::MemAlloc { size });
        assert_eq!(result, CUDA_SUCCESS);
        let [ptr] = decode_u64s::<1>(&payload).unwrap();
        assert_ne!(ptr, 0);
        ptr
    }

    /// Copies `len` bytes at device address `src` into the data blob at
    /// `offset` (asserting success) and returns them.
    pub fn read_device(&mut self, session: &Session, src: u64, offset: u64, len: u64) -> Vec<u8> {
        let (result, _) = self.call(
            session,
            Command::MemcpyDtoH {
                stream: 0,
                dst: Self::data_range(offset, len),
                src,
            },
        );
        assert_eq!(result, CUDA_SUCCESS);
        let mut back = vec![0u8; len as usize];
        self.data.read(offset, &mut back).unwrap();
        back
    }

    pub fn data_range(offset: u64, length: u64) -> BlobRange {
        BlobRange {
            resource_id: DATA_BLOB,
            offset,
            length,
        }
    }
}

pub fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

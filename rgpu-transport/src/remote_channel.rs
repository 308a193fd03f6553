//! A CUDA context's channel over the network carrier: one connection to
//! the daemon's gateway, which runs a local channel for it on the host
//! (rgpu-proto `remote`). Requests are answered in order, so a call reads
//! its own answer; asynchronous commands and copies to the device are
//! written and not waited for, and large copies travel in pieces that the
//! gateway stages while the next piece is on the wire.
//!
//! Asynchronous commands are batched: queued, and written with the next
//! call, or by the channel's flusher thread within [`BATCH_WINDOW`] of the
//! first one queued (so work that another thread or process waits for
//! never stays behind).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rgpu_proto::remote::{
    HelloRole, Request, Response, MAX_COPY_FROM_DEVICE, MAX_DATA_PIECE, MAX_IMAGE, MAX_LANES,
};
use rgpu_proto::{BlobRange, Command};

use crate::carrier::remote::{FrameStream, Received, RemoteCarrier};
use crate::carrier::{Carrier, CarrierError};
use crate::channel::{Completion, QueryNotes, Reply};
use rgpu_proto::channel::CompletionKind;
use rgpu_proto::cuda_result::{CUDA_ERROR_NOT_READY, CUDA_SUCCESS};

/// How long queued asynchronous commands wait for more before the
/// flusher writes them.
pub const BATCH_WINDOW: Duration = Duration::from_micros(20);
/// Default of `RGPU_REMOTE_LANES`: data lanes a channel opens for its
/// large copies (each lane's TLS runs on a core of its own).
pub const DEFAULT_LANES: u32 = 4;
/// Copies from this size on travel on the lanes.
pub const LANE_MIN_BYTES: usize = 4 * MAX_DATA_PIECE;

/// `RGPU_REMOTE_LANES` (0: none), at most [`MAX_LANES`].
fn lanes_wanted() -> u32 {
    std::env::var("RGPU_REMOTE_LANES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(DEFAULT_LANES)
        .min(MAX_LANES)
}

/// A channel's data lanes.
enum LaneState {
    NotOpened,
    Open(Vec<FrameStream>),
    /// None wanted, or they could not be opened: copies go on the channel.
    Off,
}

/// What the channel and its flusher share.
struct Shared {
    /// The connection, or why it is unusable (every later call fails so).
    stream: Mutex<Result<FrameStream, String>>,
    /// The connection's count of requests, readable while a call holds it.
    sent: Arc<AtomicU64>,
    closed: AtomicBool,
}

/// The query connection, opened with the channel.
enum QueryConnection {
    NotOpened,
    Open(FrameStream),
    /// It could not be opened or broke: queries go through the channel.
    Failed,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Result<FrameStream, String>> {
        self.stream.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes what is queued; a failure breaks the channel.
    fn flush(&self) {
        Self::flush_locked(&mut self.lock());
    }

    /// [`Shared::flush`] unless another thread holds the connection (a
    /// thread in a call flushed the queue when it sent).
    fn try_flush(&self) {
        if let Ok(mut guard) = self.stream.try_lock() {
            Self::flush_locked(&mut guard);
        }
    }

    fn flush_locked(guard: &mut Result<FrameStream, String>) {
        if let Ok(stream) = guard.as_mut() {
            if let Err(e) = stream.flush() {
                *guard = Err(e.to_string());
            }
        }
    }
}

pub struct RemoteChannel {
    /// Where events and streams were last given work, in requests sent.
    notes: Mutex<QueryNotes>,
    /// The process's carrier: its connection must outlive the channel (the
    /// gateway ends a process's channels with it).
    _carrier: Arc<dyn Carrier>,
    ctx_id: u32,
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
    queries: Arc<Mutex<QueryConnection>>,
    /// Opened at the first large copy; held with the channel's connection
    /// during a copy on them.
    lanes: Mutex<LaneState>,
}

impl Drop for RemoteChannel {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Some(flusher) = self.flusher.take() {
            flusher.thread().unpark();
            let _ = flusher.join();
        }
        // What was queued still reaches the host before the connection
        // closes.
        self.shared.flush();
    }
}

/// Whether the daemon still serves the channel whose query connection is
/// `queries` (see [`rgpu_proto::remote::Request::Ping`]).
fn ping(queries: &Mutex<QueryConnection>) -> Result<(), CarrierError> {
    let mut queries = queries.lock().unwrap_or_else(|e| e.into_inner());
    let QueryConnection::Open(stream) = &mut *queries else {
        return Err(CarrierError::ContextLost(
            "no answer from the daemon within the timeout, and no query connection to ask".into(),
        ));
    };
    let answer = stream.send(&Request::Ping).and_then(|()| stream.receive());
    match answer {
        Ok(Response::Result {
            result: CUDA_SUCCESS,
        }) => Ok(()),
        Ok(other) => Err(CarrierError::ContextLost(format!(
            "the daemon no longer serves this context ({other:?})"
        ))),
        Err(e) => {
            *queries = QueryConnection::Failed;
            Err(CarrierError::ContextLost(format!(
                "no answer from the daemon within the timeout: {e}"
            )))
        }
    }
}

/// The flusher: parked until a command is queued on an empty queue, then
/// writes the queue after the batch window.
fn flush_batches(shared: Arc<Shared>) {
    loop {
        std::thread::park();
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(BATCH_WINDOW);
        shared.flush();
    }
}

impl RemoteChannel {
    /// Opens a channel of `carrier`'s process on the daemon (`carrier` must
    /// be a network carrier).
    pub fn open(carrier: Arc<dyn Carrier>, debug_name: &str) -> Result<Self, CarrierError> {
        let remote: &RemoteCarrier = carrier.remote().ok_or(CarrierError::Unsupported(
            "a remote channel on a carrier with shared memory",
        ))?;
        let mut stream = remote.endpoint().connect()?;
        let (_, ctx_id, _) = stream.hello(HelloRole::Channel {
            token: remote.token(),
            name: debug_name.into(),
        })?;
        // A call that waits past the timeout asks on the query connection
        // whether the daemon still serves it (a long kernel), or gives up
        // (a dead peer, a silent network).
        let queries = Arc::new(Mutex::new(QueryConnection::NotOpened));
        let pinged = Arc::clone(&queries);
        stream.set_liveness(Arc::new(move || ping(&pinged)));
        let shared = Arc::new(Shared {
            sent: stream.sent_counter(),
            stream: Mutex::new(Ok(stream)),
            closed: AtomicBool::new(false),
        });
        let flushed = Arc::clone(&shared);
        let flusher = std::thread::Builder::new()
            .name("rgpu-remote-flush".into())
            .spawn(move || flush_batches(flushed))?;
        Ok(Self {
            notes: Mutex::default(),
            _carrier: carrier,
            ctx_id,
            shared,
            flusher: Some(flusher),
            queries,
            lanes: Mutex::new(LaneState::NotOpened),
        }
        .with_query_connection())
    }

    /// Opens the query connection now (its handshake would cost the first
    /// query a millisecond); without one, queries go through the channel.
    fn with_query_connection(self) -> Self {
        let opened = match self.open_queries() {
            Ok(stream) => QueryConnection::Open(stream),
            Err(e) => {
                log::debug!("rgpu: no query connection (queries go through the channel): {e}");
                QueryConnection::Failed
            }
        };
        *self.queries.lock().unwrap_or_else(|e| e.into_inner()) = opened;
        self
    }

    /// Whether event or stream `handle` is done, from the host's completion
    /// table, on the query connection: never behind another thread's call
    /// on this channel, nor behind the requests this one sent after the
    /// item's latest work (the host answers NOT_READY while the request
    /// that gave it that work has not reached the ring).
    pub fn completion(&self, kind: CompletionKind, handle: u32) -> Completion {
        let given = self.notes().given(kind, handle);
        let after = match given {
            Ok(after) => after,
            Err(answer) => return answer,
        };
        // What this thread queued must be on its way.
        self.shared.try_flush();
        let mut queries = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        let QueryConnection::Open(stream) = &mut *queries else {
            return Completion::Ask;
        };
        let asked = stream
            .send(&Request::Query {
                after,
                stream: kind == CompletionKind::Stream,
                handle,
            })
            .and_then(|()| stream.receive());
        match asked {
            Ok(Response::Result {
                result: CUDA_SUCCESS,
            }) => Completion::Done,
            Ok(Response::Result {
                result: CUDA_ERROR_NOT_READY,
            }) => Completion::Pending,
            Ok(_) => Completion::Ask,
            Err(e) => {
                log::debug!("rgpu: the query connection broke: {e}");
                *queries = QueryConnection::Failed;
                Completion::Ask
            }
        }
    }

    fn open_queries(&self) -> Result<FrameStream, CarrierError> {
        let remote = self._carrier.remote().ok_or(CarrierError::Unsupported(
            "queries without a network carrier",
        ))?;
        let mut stream = remote.endpoint().connect()?;
        stream.hello(HelloRole::Query {
            token: remote.token(),
            ctx_id: self.ctx_id,
        })?;
        Ok(stream)
    }

    /// Whether the channel has lanes, opening them the first time (a
    /// failure is logged and leaves copies on the channel).
    fn has_lanes(&self) -> bool {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*lanes, LaneState::NotOpened) {
            let wanted = lanes_wanted();
            let opened = (0..wanted)
                .map(|_| self.open_lane())
                .collect::<Result<Vec<_>, _>>();
            *lanes = match opened {
                Ok(opened) if !opened.is_empty() => LaneState::Open(opened),
                Ok(_) => LaneState::Off,
                Err(e) => {
                    log::info!("rgpu: no data lanes ({e}): large copies go on the channel");
                    LaneState::Off
                }
            };
        }
        matches!(*lanes, LaneState::Open(_))
    }

    fn open_lane(&self) -> Result<FrameStream, CarrierError> {
        let remote = self
            ._carrier
            .remote()
            .ok_or(CarrierError::Unsupported("lanes without a network carrier"))?;
        let mut stream = remote.endpoint().connect()?;
        stream.hello(HelloRole::Lane {
            token: remote.token(),
            ctx_id: self.ctx_id,
        })?;
        // A lane waits as long as the copy's stream does.
        let pinged = Arc::clone(&self.queries);
        stream.set_liveness(Arc::new(move || ping(&pinged)));
        Ok(stream)
    }

    /// Runs `exchange` with the channel's connection and its lanes (which
    /// [`RemoteChannel::has_lanes`] opened); a failure breaks the channel.
    fn with_lanes<R>(
        &self,
        exchange: impl FnOnce(&mut FrameStream, &mut [FrameStream]) -> Result<R, CarrierError>,
    ) -> Result<R, CarrierError> {
        self.with_stream(|s| {
            let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            let LaneState::Open(open) = &mut *lanes else {
                return Err(CarrierError::Protocol(
                    "the channel's lanes are gone".into(),
                ));
            };
            let outcome = exchange(s, open);
            if outcome.is_err() {
                *lanes = LaneState::Off;
            }
            outcome
        })
    }

    /// [`RemoteChannel::copy_to_device`] on the lanes: piece `i` on lane
    /// `i % lanes`, each lane written by a thread of its own.
    fn copy_to_device_on_lanes(
        &self,
        stream: u32,
        dst: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<u32, CarrierError> {
        self.with_lanes(|s, lanes| {
            let count = lanes.len();
            s.send(&Request::CopyToDeviceLanes {
                stream,
                dst,
                length: data.len() as u64,
                sync,
                lanes: count as u32,
            })?;
            self.notes().note_stream_work(stream, self.sent());
            std::thread::scope(|scope| {
                let writers: Vec<_> = lanes
                    .iter_mut()
                    .enumerate()
                    .map(|(lane, stream)| {
                        scope.spawn(move || -> Result<(), CarrierError> {
                            for piece in data.chunks(MAX_DATA_PIECE).skip(lane).step_by(count) {
                                stream.send(&Request::LanePiece { data: piece })?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                join_lanes(writers)
            })?;
            if !sync {
                return Ok(0);
            }
            expect_result(s.receive()?)
        })
    }

    /// [`RemoteChannel::copy_from_device`] on the lanes: piece `i` comes on
    /// lane `i % lanes` (empty after a failure), then the result on the
    /// channel.
    fn copy_from_device_on_lanes(
        &self,
        stream: u32,
        dst: &mut [u8],
        src: u64,
    ) -> Result<u32, CarrierError> {
        self.with_lanes(|s, lanes| {
            let count = lanes.len();
            s.send(&Request::CopyFromDeviceLanes {
                stream,
                src,
                length: dst.len() as u64,
                lanes: count as u32,
            })?;
            self.notes().note_stream_work(stream, self.sent());
            let mut shares: Vec<Vec<&mut [u8]>> = (0..count).map(|_| Vec::new()).collect();
            for (index, piece) in dst.chunks_mut(MAX_DATA_PIECE).enumerate() {
                if let Some(share) = shares.get_mut(index % count) {
                    share.push(piece);
                }
            }
            std::thread::scope(|scope| {
                let readers: Vec<_> = lanes
                    .iter_mut()
                    .zip(shares)
                    .map(|(stream, share)| {
                        scope.spawn(move || -> Result<(), CarrierError> {
                            for piece in share {
                                let wanted = piece.len();
                                match stream.receive_into(piece)? {
                                    Received::Data(got) if got == wanted || got == 0 => {}
                                    Received::Data(got) => {
                                        return Err(CarrierError::Protocol(format!(
                                            "a lane brought {got} of {wanted} bytes"
                                        )))
                                    }
                                    Received::Other(other) => return Err(unexpected(other)),
                                }
                            }
                            Ok(())
                        })
                    })
                    .collect();
                join_lanes(readers)
            })?;
            expect_result(s.receive()?)
        })
    }

    /// The context's id on the host (log lines there name it).
    pub fn ctx_id(&self) -> u32 {
        self.ctx_id
    }

    /// Runs `exchange` on the connection; a failure that leaves the stream
    /// out of step breaks the channel for good.
    fn with_stream<R>(
        &self,
        exchange: impl FnOnce(&mut FrameStream) -> Result<R, CarrierError>,
    ) -> Result<R, CarrierError> {
        let mut guard = self.shared.lock();
        let stream = match guard.as_mut() {
            Ok(stream) => stream,
            Err(reason) => return Err(CarrierError::ContextLost(reason.clone())),
        };
        match exchange(stream) {
            Ok(value) => Ok(value),
            Err(e) => {
                *guard = Err(e.to_string());
                Err(e)
            }
        }
    }

    fn notes(&self) -> MutexGuard<'_, QueryNotes> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The count of requests sent so far (with the connection held: the
    /// count after the caller's own).
    fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Acquire)
    }

    /// Queues an asynchronous command (see the module's batching).
    pub fn send(&self, command: &Command) -> Result<(), CarrierError> {
        let bytes = command.to_bytes(0);
        let first = self.with_stream(|s| {
            let first = s.queue(&Request::Send { command: &bytes })?;
            self.notes().note(command, self.sent());
            Ok(first)
        })?;
        if first {
            if let Some(flusher) = &self.flusher {
                flusher.thread().unpark();
            }
        }
        Ok(())
    }

    pub fn call(&self, command: &Command) -> Result<Reply, CarrierError> {
        let bytes = command.to_bytes(0);
        self.with_stream(|s| {
            s.send(&Request::Call { command: &bytes })?;
            self.notes().note(command, self.sent());
            expect_reply(s.receive()?)
        })
    }

    /// As the ring channel's: pieces of at most [`MAX_DATA_PIECE`] bytes,
    /// only the last one answered when `sync`.
    pub fn copy_to_device(
        &self,
        stream: u32,
        dst: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<u32, CarrierError> {
        if data.is_empty() {
            return Ok(0);
        }
        if data.len() >= LANE_MIN_BYTES && self.has_lanes() {
            return self.copy_to_device_on_lanes(stream, dst, data, sync);
        }
        self.with_stream(|s| {
            let count = data.len().div_ceil(MAX_DATA_PIECE);
            for (i, piece) in data.chunks(MAX_DATA_PIECE).enumerate() {
                s.send(&Request::CopyToDevice {
                    stream,
                    dst: dst.wrapping_add((i * MAX_DATA_PIECE) as u64),
                    sync: sync && i + 1 == count,
                    data: piece,
                })?;
            }
            self.notes().note_stream_work(stream, self.sent());
            if !sync {
                return Ok(0);
            }
            expect_result(s.receive()?)
        })
    }

    /// As the ring channel's: synchronous; the gateway streams the bytes
    /// back in pieces.
    pub fn copy_from_device(
        &self,
        stream: u32,
        dst: &mut [u8],
        src: u64,
    ) -> Result<u32, CarrierError> {
        let request_max = usize::try_from(MAX_COPY_FROM_DEVICE).unwrap_or(usize::MAX);
        for (i, part) in dst.chunks_mut(request_max).enumerate() {
            let part_src = src.wrapping_add((i * request_max) as u64);
            if part.len() >= LANE_MIN_BYTES && self.has_lanes() {
                let result = self.copy_from_device_on_lanes(stream, part, part_src)?;
                if result != 0 {
                    return Ok(result);
                }
                continue;
            }
            let result = self.with_stream(|s| {
                s.send(&Request::CopyFromDevice {
                    stream,
                    src: part_src,
                    length: part.len() as u64,
                })?;
                self.notes().note_stream_work(stream, self.sent());
                let mut filled = 0usize;
                loop {
                    let rest = part.get_mut(filled..).unwrap_or_default();
                    match s.receive_into(rest)? {
                        Received::Data(bytes) => filled += bytes,
                        Received::Other(Response::Result { result }) => {
                            if result == 0 && filled != part.len() {
                                return Err(CarrierError::Protocol(format!(
                                    "the gateway sent {filled} of {} bytes",
                                    part.len()
                                )));
                            }
                            return Ok(result);
                        }
                        Received::Other(other) => return Err(unexpected(other)),
                    }
                }
            })?;
            if result != 0 {
                return Ok(result);
            }
        }
        Ok(0)
    }

    /// A module load with its image (the only command that names data),
    /// the image in pieces.
    pub fn call_with_data(
        &self,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
    ) -> Result<Reply, CarrierError> {
        if data.len() > MAX_IMAGE {
            return Err(CarrierError::OutOfMemory(data.len() as u64));
        }
        let command = make_command(BlobRange::default()).to_bytes(0);
        self.with_stream(|s| {
            let mut pieces: Vec<&[u8]> = data.chunks(MAX_DATA_PIECE).collect();
            let last = pieces.pop().unwrap_or_default();
            for piece in pieces {
                s.send(&Request::ImagePiece { data: piece })?;
            }
            s.send(&Request::LoadModule {
                command: &command,
                image: last,
            })?;
            expect_reply(s.receive()?)
        })
    }
}

/// Joins a copy's lane threads: the first failure, if any.
fn join_lanes(
    threads: Vec<std::thread::ScopedJoinHandle<'_, Result<(), CarrierError>>>,
) -> Result<(), CarrierError> {
    let mut outcome = Ok(());
    for thread in threads {
        let joined = thread
            .join()
            .unwrap_or_else(|_| Err(CarrierError::Protocol("a lane thread panicked".into())));
        if outcome.is_ok() {
            outcome = joined;
        }
    }
    outcome
}

/// The CUDA result a [`Response::Result`] carries.
fn expect_result(response: Response) -> Result<u32, CarrierError> {
    match response {
        Response::Result { result } => Ok(result),
        other => Err(unexpected(other)),
    }
}

fn expect_reply(response: Response) -> Result<Reply, CarrierError> {
    match response {
        Response::Reply { result, payload } => Ok(Reply { result, payload }),
        other => Err(unexpected(other)),
    }
}

/// An answer out of step, or the gateway saying the host side failed.
fn unexpected(response: Response) -> CarrierError {
    match response {
        Response::Failed { reason } => CarrierError::ContextLost(reason),
        other => CarrierError::Protocol(format!("unexpected answer from the gateway: {other:?}")),
    }
}

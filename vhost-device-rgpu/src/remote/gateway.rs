//! The gateway: serves remote guest processes by being a local client of
//! their tenant (ARCHITECTURE.md §6.3).
//!
//! A remote process's first connection (its hello says "process") opens a
//! local carrier on the tenant's own socket: one vhost-user connection, so
//! the remote process gets a connection process and workers of its own on
//! the host, under the tenant's limits and the same isolation as a local
//! process. Each of its channel connections opens a ring channel on that
//! carrier and replays the stream's requests on it. When the process
//! connection ends, its channels are shut down and the host frees
//! everything.
//!
//! Everything a remote client sends is checked here before it reaches the
//! ring: commands that name blob memory (there is none remotely) or that
//! belong to the ring's own control are refused, and every size is bounded
//! by rgpu-proto `remote`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use log::{debug, info};
use rgpu_proto::channel::CompletionKind;
use rgpu_proto::command::decode_one;
use rgpu_proto::cuda_result::{CUDA_ERROR_NOT_READY, CUDA_SUCCESS};
use rgpu_proto::remote::{
    data_head, frame_length, HelloRole, Request, Response, MAX_DATA_PIECE, MAX_IMAGE, MAX_LANES,
    QUERY_ASK, REMOTE_VERSION, TOKEN_BYTES,
};
use rgpu_proto::Command;
use rgpu_transport::carrier::local::LocalCarrier;
use rgpu_transport::{Carrier, CarrierError, Channel, Completion};

use super::lanes::Lanes;
use crate::tenants::{Endpoint, Tenants};

/// How long a new connection may take to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A byte stream in both directions (TLS or plain TCP).
pub trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

/// A remote guest process: its tenant, its host side, its channels.
struct RemoteProcess {
    tenant: String,
    carrier: Arc<dyn Carrier>,
    /// Sockets of its channel and query connections, shut down when it
    /// ends.
    channels: Mutex<Vec<TcpStream>>,
    /// Its open channels by context id, for their query connections.
    open: Mutex<HashMap<u32, OpenChannel>>,
}

/// A channel as its query and lane connections see it.
#[derive(Clone)]
struct OpenChannel {
    channel: Weak<Channel>,
    /// Requests of the channel connection that reached the ring (see
    /// [`replay`]).
    processed: Arc<AtomicU64>,
    /// Its data lanes (see [`super::lanes`]).
    lanes: Lanes,
}

/// The remote processes of every listener.
pub struct Gateway {
    tenants: Weak<Tenants>,
    processes: Mutex<HashMap<[u8; TOKEN_BYTES], Arc<RemoteProcess>>>,
}

/// One accepted, authenticated connection.
pub struct Accepted {
    pub io: Box<dyn ReadWrite>,
    /// The TCP socket underneath (for shutting it down from elsewhere).
    pub socket: TcpStream,
    /// Its tenant, or why it has none.
    pub tenant: Result<String, String>,
    pub peer: String,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Frames on one connection, as the gateway reads and writes them.
pub struct Frames {
    io: Box<dyn ReadWrite>,
    /// The length of the last frame read.
    last_len: usize,
}

impl Frames {
    /// The next request, its bytes in `body` (which keeps its size for the
    /// next frame: a copy's pieces reuse it); `None` at the end.
    pub fn read<'b>(&mut self, body: &'b mut Vec<u8>) -> std::io::Result<Option<Request<'b>>> {
        let mut header = [0u8; 4];
        match self.io.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let length = frame_length(header).map_err(invalid)?;
        if body.len() < length {
            body.resize(length, 0);
        }
        let frame = body.get_mut(..length).ok_or_else(|| invalid("frame"))?;
        self.io.read_exact(frame)?;
        self.last_len = length;
        Request::decode(frame).map(Some).map_err(invalid)
    }

    pub fn write(&mut self, response: &Response) -> std::io::Result<()> {
        self.io.write_all(&response.encode())?;
        self.io.flush()
    }

    /// Sends on the device printf output `channel` kept, if any (before the
    /// answer it came with).
    pub fn relay_console(&mut self, channel: &Channel) -> std::io::Result<()> {
        let bytes = channel.take_console();
        if bytes.is_empty() {
            return Ok(());
        }
        self.write(&Response::Console { bytes })
    }

    /// A data frame, its bytes straight from `data`.
    pub fn write_data(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.io.write_all(&data_head(data.len()))?;
        self.io.write_all(data)?;
        self.io.flush()
    }
}

fn invalid(e: impl ToString) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

/// Whether a remote client may put `command` in the ring: nothing that
/// names blob memory (copies and module images come as requests of their
/// own; the ring's own control is no ring command).
fn allowed(command: &Command) -> bool {
    !matches!(
        command,
        Command::HostDevicePointer { .. }
            | Command::MemcpyHtoD { .. }
            | Command::MemcpyDtoH { .. }
            | Command::ModuleLoad { .. }
            | Command::ModuleLoadHashed { .. }
    )
}

fn decode_command(bytes: &[u8]) -> Result<Command, String> {
    let decoded = decode_one(bytes).map_err(|e| format!("bad command: {e}"))?;
    if decoded.wire_len != bytes.len() {
        return Err("bytes after the command".into());
    }
    if !allowed(&decoded.command) {
        return Err(format!(
            "command {:?} is not allowed on a remote connection",
            decoded.command.opcode()
        ));
    }
    Ok(decoded.command)
}

fn random_token() -> [u8; TOKEN_BYTES] {
    let mut token = [0u8; TOKEN_BYTES];
    let mut filled = 0;
    while filled < token.len() {
        let rest = token.get_mut(filled..).unwrap_or_default();
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got > 0 {
            filled += got as usize;
        }
    }
    token
}

impl Gateway {
    pub fn new(tenants: Weak<Tenants>) -> Arc<Self> {
        Arc::new(Self {
            tenants,
            processes: Mutex::new(HashMap::new()),
        })
    }

    /// Serves one connection until it ends (on the caller's thread).
    pub fn serve(self: &Arc<Self>, accepted: Accepted) {
        let Accepted {
            io,
            socket,
            tenant,
            peer,
        } = accepted;
        let mut frames = Frames { io, last_len: 0 };
        let mut body = Vec::new();
        let tenant = match tenant {
            Ok(tenant) => tenant,
            Err(reason) => {
                rgpu_session::warn_limited!("remote {peer}: refused: {reason}");
                let _ = frames.write(&Response::Refused { reason });
                return;
            }
        };
        let _ = socket.set_read_timeout(Some(HELLO_TIMEOUT));
        let hello = frames.read(&mut body);
        let _ = socket.set_read_timeout(None);
        let refuse = |frames: &mut Frames, reason: String| {
            rgpu_session::warn_limited!("remote {peer} (tenant {tenant}): refused: {reason}");
            let _ = frames.write(&Response::Refused { reason });
        };
        match hello {
            Ok(Some(Request::Hello { version, role })) if version == REMOTE_VERSION => match role {
                HelloRole::Process { name } => {
                    self.serve_process(frames, &socket, &tenant, &peer, &name)
                }
                HelloRole::Channel { token, name } => {
                    self.serve_channel(frames, socket, &tenant, &peer, token, &name)
                }
                HelloRole::Query { token, ctx_id } => {
                    self.serve_queries(frames, socket, &tenant, &peer, token, ctx_id)
                }
                HelloRole::Lane { token, ctx_id } => {
                    self.add_lane(frames, socket, &tenant, &peer, token, ctx_id)
                }
            },
            Ok(Some(Request::Hello { version, .. })) => refuse(
                &mut frames,
                format!("stream version {version}, this daemon speaks {REMOTE_VERSION}"),
            ),
            Ok(Some(_)) => refuse(&mut frames, "the first frame must be a hello".into()),
            Ok(None) => debug!("remote {peer}: closed before its hello"),
            Err(e) => refuse(&mut frames, format!("no hello: {e}")),
        }
    }

    /// The tenant's socket, where its remote processes connect as local
    /// ones do.
    fn tenant_socket(&self, tenant: &str) -> Result<std::path::PathBuf, String> {
        let tenants = self.tenants.upgrade().ok_or("the daemon is stopping")?;
        let served = tenants
            .get(tenant)
            .ok_or_else(|| format!("no tenant {tenant:?} (it was removed)"))?;
        match &served.endpoint {
            Endpoint::Socket(path) => Ok(path.clone()),
            Endpoint::InheritedFd(_) => Err(format!(
                "tenant {tenant:?} listens on an inherited socket only"
            )),
        }
    }

    fn serve_process(
        self: &Arc<Self>,
        mut frames: Frames,
        socket: &TcpStream,
        tenant: &str,
        peer: &str,
        name: &str,
    ) {
        let opened = self
            .tenant_socket(tenant)
            .and_then(|path| LocalCarrier::connect(&path).map_err(|e| e.to_string()));
        let carrier: Arc<dyn Carrier> = match opened {
            Ok(carrier) => Arc::new(carrier),
            Err(reason) => {
                let _ = frames.write(&Response::Refused { reason });
                return;
            }
        };
        let token = random_token();
        let capset = carrier.capset().encode();
        let process = Arc::new(RemoteProcess {
            tenant: tenant.to_owned(),
            carrier,
            channels: Mutex::new(Vec::new()),
            open: Mutex::new(HashMap::new()),
        });
        lock(&self.processes).insert(token, Arc::clone(&process));
        info!("remote {peer}: process {name:?} of tenant {tenant} connected");
        if frames
            .write(&Response::Welcome {
                token,
                ctx_id: 0,
                capset,
            })
            .is_ok()
        {
            // Nothing more comes on this connection: it stands for the
            // process, until the process (or the network) ends it.
            let mut byte = [0u8; 1];
            let _ = frames.io.read(&mut byte);
        }
        lock(&self.processes).remove(&token);
        for channel in lock(&process.channels).drain(..) {
            let _ = channel.shutdown(Shutdown::Both);
        }
        let _ = socket.shutdown(Shutdown::Both);
        info!("remote {peer}: process {name:?} of tenant {tenant} ended");
    }

    /// The process that got `token`, if it is `tenant`'s (another
    /// tenant's token is as good as none).
    fn process(&self, token: [u8; TOKEN_BYTES], tenant: &str) -> Option<Arc<RemoteProcess>> {
        lock(&self.processes)
            .get(&token)
            .filter(|p| p.tenant == tenant)
            .cloned()
    }

    fn serve_channel(
        self: &Arc<Self>,
        mut frames: Frames,
        socket: TcpStream,
        tenant: &str,
        peer: &str,
        token: [u8; TOKEN_BYTES],
        name: &str,
    ) {
        let Some(process) = self.process(token, tenant) else {
            rgpu_session::warn_limited!(
                "remote {peer} (tenant {tenant}): a channel with an unknown process token"
            );
            let _ = frames.write(&Response::Refused {
                reason: "unknown process token".into(),
            });
            return;
        };
        let channel = match Channel::open(Arc::clone(&process.carrier), name) {
            Ok(channel) => {
                // Device printf output goes to the application's stdout.
                channel.keep_console();
                Arc::new(channel)
            }
            Err(e) => {
                let _ = frames.write(&Response::Refused {
                    reason: format!("cannot open a channel on the host: {e}"),
                });
                return;
            }
        };
        if let Ok(clone) = socket.try_clone() {
            lock(&process.channels).push(clone);
        }
        let ctx_id = channel.ctx_id();
        let processed = Arc::new(AtomicU64::new(0));
        let lanes = Lanes::default();
        lock(&process.open).insert(
            ctx_id,
            OpenChannel {
                channel: Arc::downgrade(&channel),
                processed: Arc::clone(&processed),
                lanes: Arc::clone(&lanes),
            },
        );
        let welcomed = frames.write(&Response::Welcome {
            token,
            ctx_id,
            capset: Vec::new(),
        });
        if welcomed.is_ok() {
            if let Err(reason) = replay(&mut frames, &channel, &processed, &lanes) {
                debug!("remote {peer}: channel {ctx_id}: {reason}");
                let _ = frames.write(&Response::Failed { reason });
            }
        }
        lock(&process.open).remove(&ctx_id);
        // Its lanes close with it.
        lock(&lanes).clear();
        // A query may hold the channel for a moment.
        let mut channel = channel;
        for _ in 0..1000 {
            match Arc::try_unwrap(channel) {
                Ok(owned) => {
                    let _ = owned.close();
                    break;
                }
                Err(shared) => {
                    channel = shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let _ = socket.shutdown(Shutdown::Both);
    }

    /// The process that got `token` (if it is `tenant`'s) and its open
    /// channel `ctx_id`; else `what` (a query or lane connection) is
    /// refused on `frames`.
    fn open_channel(
        &self,
        frames: &mut Frames,
        tenant: &str,
        peer: &str,
        token: [u8; TOKEN_BYTES],
        ctx_id: u32,
        what: &str,
    ) -> Option<(Arc<RemoteProcess>, OpenChannel)> {
        let process = self.process(token, tenant);
        let open = process
            .as_ref()
            .and_then(|p| lock(&p.open).get(&ctx_id).cloned());
        let found = process.zip(open);
        if found.is_none() {
            rgpu_session::warn_limited!(
                "remote {peer} (tenant {tenant}): {what} for an unknown channel"
            );
            let _ = frames.write(&Response::Refused {
                reason: "unknown process token or channel".into(),
            });
        }
        found
    }

    /// A data lane of a channel: kept with the channel, whose connection's
    /// thread reads and writes it during copies on lanes (this thread is
    /// done once it is welcomed).
    fn add_lane(
        self: &Arc<Self>,
        mut frames: Frames,
        socket: TcpStream,
        tenant: &str,
        peer: &str,
        token: [u8; TOKEN_BYTES],
        ctx_id: u32,
    ) {
        let Some((process, open)) =
            self.open_channel(&mut frames, tenant, peer, token, ctx_id, "a lane")
        else {
            return;
        };
        let mut lanes = lock(&open.lanes);
        if lanes.len() >= MAX_LANES as usize {
            let _ = frames.write(&Response::Refused {
                reason: format!("a channel has at most {MAX_LANES} lanes"),
            });
            return;
        }
        let welcomed = frames.write(&Response::Welcome {
            token,
            ctx_id,
            capset: Vec::new(),
        });
        if welcomed.is_ok() {
            lanes.push(frames);
            if let Ok(clone) = socket.try_clone() {
                lock(&process.channels).push(clone);
            }
        }
    }

    /// A channel's query connection: event and stream queries answered
    /// at once, from its completion table (see [`answer_query`]).
    fn serve_queries(
        self: &Arc<Self>,
        mut frames: Frames,
        socket: TcpStream,
        tenant: &str,
        peer: &str,
        token: [u8; TOKEN_BYTES],
        ctx_id: u32,
    ) {
        let Some((process, open)) =
            self.open_channel(&mut frames, tenant, peer, token, ctx_id, "queries")
        else {
            return;
        };
        if let Ok(clone) = socket.try_clone() {
            lock(&process.channels).push(clone);
        }
        if frames
            .write(&Response::Welcome {
                token,
                ctx_id,
                capset: Vec::new(),
            })
            .is_err()
        {
            return;
        }
        let mut body = Vec::new();
        loop {
            let result = match frames.read(&mut body) {
                Ok(Some(Request::Query {
                    after,
                    stream,
                    handle,
                })) => answer_query(&open, after, stream, handle),
                // Alive as long as the channel is open.
                Ok(Some(Request::Ping)) => match open.channel.upgrade() {
                    Some(_) => CUDA_SUCCESS,
                    None => QUERY_ASK,
                },
                _ => break,
            };
            if frames.write(&Response::Result { result }).is_err() {
                break;
            }
        }
        let _ = socket.shutdown(Shutdown::Both);
    }
}

/// A query connection's answer, never waiting: `after` counts the channel
/// connection's requests up to the one that gave the event or stream its
/// latest work. While that one has not reached the ring the item cannot be
/// done (NOT_READY, as the driver answers for work it has not run); once it
/// has, the completion table says.
fn answer_query(open: &OpenChannel, after: u64, stream: bool, handle: u32) -> u32 {
    if open.processed.load(Ordering::Acquire) < after {
        return CUDA_ERROR_NOT_READY;
    }
    let Some(channel) = open.channel.upgrade() else {
        return QUERY_ASK;
    };
    let kind = if stream {
        CompletionKind::Stream
    } else {
        CompletionKind::Event
    };
    table_answer(&channel, kind, handle).unwrap_or(QUERY_ASK)
}

/// The query's CUDA result as the channel's completion table gives it;
/// `None` when only the host can tell.
fn table_answer(channel: &Channel, kind: CompletionKind, handle: u32) -> Option<u32> {
    match channel.completion(kind, handle) {
        Completion::Done => Some(CUDA_SUCCESS),
        Completion::Pending => Some(CUDA_ERROR_NOT_READY),
        Completion::Ask => None,
    }
}

/// What the host's completion table says of an event or stream query,
/// as the query's reply; `None` when only the host can tell (then the
/// query goes through the ring, behind what is queued).
fn query_answer(channel: &Channel, command: &Command) -> Option<Response> {
    let (kind, handle) = match command {
        Command::EventQuery { event } => (CompletionKind::Event, *event),
        Command::StreamQuery { stream } => (CompletionKind::Stream, *stream),
        _ => return None,
    };
    Some(Response::Reply {
        result: table_answer(channel, kind, handle)?,
        payload: Vec::new(),
    })
}

/// Replays a channel connection's requests on `channel` until the client
/// closes it (`Ok`) or something fails (the reason).
/// `processed` counts the requests whose commands are in the ring: an
/// asynchronous one once it is, one that waits as it starts (what it waits
/// for is in the ring by then).
fn replay(
    frames: &mut Frames,
    channel: &Channel,
    processed: &AtomicU64,
    lanes: &Lanes,
) -> Result<(), String> {
    std::thread::scope(|scope| {
        let mut stager = Stager::start(scope, channel, processed);
        let outcome = replay_with(frames, channel, processed, &mut stager, lanes);
        let drained = stager.drain();
        outcome.and(drained)
    })
}

/// A piece of an asynchronous copy to the device, for the stager.
struct StageJob {
    frame: Vec<u8>,
    data: std::ops::Range<usize>,
    stream: u32,
    dst: u64,
}

/// Stages asynchronous copies to the device on a thread of its own, so
/// that this connection's thread decrypts the next piece meanwhile (one
/// thread doing both in turn reached 0.7 of a plain TLS stream). Every
/// other request waits until the stager is done ([`Stager::drain`]), which
/// keeps the channel's order.
struct Stager {
    jobs: Option<std::sync::mpsc::SyncSender<StageJob>>,
    results: std::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
    in_flight: usize,
    spare: Vec<Vec<u8>>,
}

/// Pieces staged at once (each a frame buffer of up to 4 MiB).
const STAGED_AHEAD: usize = 2;

impl Stager {
    fn start<'scope, 'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        channel: &'env Channel,
        processed: &'env AtomicU64,
    ) -> Self {
        let (jobs, incoming) = std::sync::mpsc::sync_channel::<StageJob>(STAGED_AHEAD);
        let (done, results) = std::sync::mpsc::sync_channel(STAGED_AHEAD + 1);
        scope.spawn(move || {
            for job in incoming {
                let staged = job
                    .frame
                    .get(job.data.clone())
                    .ok_or_else(|| "a staged piece out of its frame".to_owned())
                    .and_then(|data| {
                        channel
                            .copy_to_device(job.stream, job.dst, data, false)
                            .map_err(|e| format!("the host side failed: {e}"))
                    });
                processed.fetch_add(1, Ordering::AcqRel);
                if done.send(staged.map(|_| job.frame)).is_err() {
                    return;
                }
            }
        });
        Self {
            jobs: Some(jobs),
            results,
            in_flight: 0,
            spare: Vec::new(),
        }
    }

    /// Waits for one staged piece; its buffer becomes spare.
    fn wait_one(&mut self) -> Result<(), String> {
        let result = self
            .results
            .recv()
            .map_err(|_| "the stager ended".to_owned())?;
        self.in_flight -= 1;
        self.spare.push(result?);
        Ok(())
    }

    /// Hands `frame` (holding the piece at `data`) over; returns a buffer
    /// for the next frame.
    fn stage(
        &mut self,
        frame: Vec<u8>,
        data: std::ops::Range<usize>,
        stream: u32,
        dst: u64,
    ) -> Result<Vec<u8>, String> {
        let jobs = self.jobs.as_ref().ok_or("the stager ended")?;
        jobs.send(StageJob {
            frame,
            data,
            stream,
            dst,
        })
        .map_err(|_| "the stager ended".to_owned())?;
        self.in_flight += 1;
        if self.spare.is_empty() && self.in_flight >= STAGED_AHEAD {
            self.wait_one()?;
        }
        Ok(self.spare.pop().unwrap_or_default())
    }

    /// Waits until everything handed over is staged.
    fn drain(&mut self) -> Result<(), String> {
        while self.in_flight > 0 {
            self.wait_one()?;
        }
        Ok(())
    }
}

fn replay_with(
    frames: &mut Frames,
    channel: &Channel,
    processed: &AtomicU64,
    stager: &mut Stager,
    lanes: &Lanes,
) -> Result<(), String> {
    let lost = |e: CarrierError| format!("the host side failed: {e}");
    let write = |frames: &mut Frames, response: Response| {
        frames
            .relay_console(channel)
            .and_then(|()| frames.write(&response))
            .map_err(|e| format!("write: {e}"))
    };
    // The module image in pieces, until its load.
    let mut image: Vec<u8> = Vec::new();
    let mut body = Vec::new();
    loop {
        let request = match frames.read(&mut body) {
            Ok(Some(request)) => request,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("read: {e}")),
        };
        if let Request::CopyToDevice {
            stream,
            dst,
            sync: false,
            data,
        } = request
        {
            // The piece is the frame's tail.
            let start = frames
                .last_len
                .checked_sub(data.len())
                .ok_or("a copy piece longer than its frame")?;
            let range = start..frames.last_len;
            let frame = std::mem::take(&mut body);
            body = stager.stage(frame, range, stream, dst)?;
            continue;
        }
        stager.drain()?;
        let waits = match &request {
            Request::Call { .. }
            | Request::CopyFromDevice { .. }
            | Request::LoadModule { .. }
            | Request::Query { .. }
            | Request::Ping
            | Request::CopyFromDeviceLanes { .. } => true,
            Request::CopyToDevice { sync, .. } | Request::CopyToDeviceLanes { sync, .. } => *sync,
            _ => false,
        };
        if waits {
            processed.fetch_add(1, Ordering::AcqRel);
        }
        match request {
            Request::Send { command } => channel.send(&decode_command(command)?).map_err(lost)?,
            Request::Call { command } => {
                let command = decode_command(command)?;
                // Queries never wait behind queued work when the table can
                // answer (as guest-lib answers them locally).
                let response = match query_answer(channel, &command) {
                    Some(answer) => answer,
                    None => {
                        let reply = channel.call(&command).map_err(lost)?;
                        Response::Reply {
                            result: reply.result,
                            payload: reply.payload,
                        }
                    }
                };
                write(frames, response)?;
            }
            Request::CopyToDevice {
                stream,
                dst,
                sync,
                data,
            } => {
                let result = channel
                    .copy_to_device(stream, dst, data, sync)
                    .map_err(lost)?;
                if sync {
                    write(frames, Response::Result { result })?;
                }
            }
            Request::CopyFromDevice {
                stream,
                src,
                length,
            } => copy_from_device(frames, channel, stream, src, length)?,
            Request::ImagePiece { data } => {
                if image.len() + data.len() > MAX_IMAGE {
                    return Err(format!("a module image past {MAX_IMAGE} bytes"));
                }
                image.extend_from_slice(data);
            }
            Request::LoadModule {
                command,
                image: last,
            } => {
                if image.len() + last.len() > MAX_IMAGE {
                    return Err(format!("a module image past {MAX_IMAGE} bytes"));
                }
                image.extend_from_slice(last);
                let decoded = decode_one(command).map_err(|e| format!("bad command: {e}"))?;
                let Command::ModuleLoadHashed { module, hash, .. } = decoded.command else {
                    return Err("a module load must be ModuleLoadHashed".into());
                };
                let reply = channel
                    .call_with_data(&image, &|range| Command::ModuleLoadHashed {
                        module,
                        hash,
                        image: range,
                    })
                    .map_err(lost)?;
                image = Vec::new();
                write(
                    frames,
                    Response::Reply {
                        result: reply.result,
                        payload: reply.payload,
                    },
                )?;
            }
            Request::CopyToDeviceLanes {
                stream,
                dst,
                length,
                sync,
                lanes: count,
            } => {
                let result =
                    super::lanes::copy_to_device(lanes, channel, stream, dst, length, sync, count)?;
                if sync {
                    write(frames, Response::Result { result })?;
                }
            }
            Request::CopyFromDeviceLanes {
                stream,
                src,
                length,
                lanes: count,
            } => {
                super::lanes::copy_from_device(frames, lanes, channel, stream, src, length, count)?
            }
            Request::LanePiece { .. } => {
                return Err("a lane piece on the channel connection".into())
            }
            Request::Hello { .. } => return Err("a second hello".into()),
            Request::Query { .. } | Request::Ping => {
                return Err("a query on the channel connection".into())
            }
        }
        if !waits {
            processed.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Streams `length` bytes of device memory at `src` to the client: one
/// thread reads the next piece from the GPU while this one sends the last,
/// so the copy and the network overlap. Two buffers go back and forth.
fn copy_from_device(
    frames: &mut Frames,
    channel: &Channel,
    stream: u32,
    src: u64,
    length: u64,
) -> Result<(), String> {
    let piece_size = MAX_DATA_PIECE as u64;
    let pieces = length.div_ceil(piece_size);
    // Reads piece `index` into `buffer`: its data, or the CUDA error.
    let read = |index: u64, buffer: &mut Vec<u8>| -> Result<u32, String> {
        let offset = index * piece_size;
        let size = (length - offset).min(piece_size) as usize;
        buffer.resize(size, 0);
        channel
            .copy_from_device(stream, buffer, src.wrapping_add(offset))
            .map_err(|e| format!("the host side failed: {e}"))
    };
    let finish = |frames: &mut Frames, result: u32| {
        frames
            .relay_console(channel)
            .and_then(|()| frames.write(&Response::Result { result }))
            .map_err(|e| format!("write: {e}"))
    };
    if pieces <= 1 {
        let mut buffer = Vec::new();
        let result = read(0, &mut buffer)?;
        if result == 0 {
            frames
                .write_data(&buffer)
                .map_err(|e| format!("write: {e}"))?;
        }
        return finish(frames, result);
    }
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Result<u32, String>, Vec<u8>)>(1);
        let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
        let _ = empty_tx.send(Vec::new());
        let _ = empty_tx.send(Vec::new());
        let reader = scope.spawn(move || {
            for index in 0..pieces {
                let Ok(mut buffer) = empty_rx.recv() else {
                    return;
                };
                let outcome = read(index, &mut buffer);
                let stop = !matches!(outcome, Ok(0));
                if full_tx.send((outcome, buffer)).is_err() || stop {
                    return;
                }
            }
        });
        let mut outcome = Ok(0);
        for (piece, buffer) in full_rx.iter() {
            match piece {
                Ok(0) => {
                    if let Err(e) = frames.write_data(&buffer) {
                        outcome = Err(format!("write: {e}"));
                        break;
                    }
                    let _ = empty_tx.send(buffer);
                }
                other => {
                    outcome = other;
                    break;
                }
            }
        }
        // The reader stops at its next send or receive once these are gone.
        drop(full_rx);
        drop(empty_tx);
        let _ = reader.join();
        let result = outcome?;
        finish(frames, result)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_proto::BlobRange;

    #[test]
    fn a_query_whose_work_has_not_reached_the_ring_is_not_ready_at_once() {
        // Three of the channel's requests replayed; the event was recorded
        // by the fifth. (A query used to wait here until the fifth arrived,
        // or two seconds.)
        let open = OpenChannel {
            channel: Weak::new(),
            processed: Arc::new(AtomicU64::new(3)),
            lanes: Lanes::default(),
        };
        assert_eq!(answer_query(&open, 5, false, 7), CUDA_ERROR_NOT_READY);
        assert_eq!(answer_query(&open, 5, true, 7), CUDA_ERROR_NOT_READY);
        // Recorded by the third, which reached the ring: the table answers
        // (here the channel is gone, so only the host could tell).
        assert_eq!(answer_query(&open, 3, false, 7), QUERY_ASK);
    }

    #[test]
    fn remote_clients_cannot_name_blob_memory_or_ring_control() {
        let refused = [
            Command::MemcpyHtoD {
                stream: 0,
                dst: 0x1000,
                src: BlobRange::default(),
            },
            Command::MemcpyDtoH {
                stream: 0,
                dst: BlobRange::default(),
                src: 0x1000,
            },
            Command::ModuleLoad {
                module: 1,
                image: BlobRange::default(),
            },
        ];
        for command in refused {
            let err = decode_command(&command.to_bytes(0)).unwrap_err();
            assert!(err.contains("not allowed"), "{err}");
        }
        // The ring's control is no ring command at all.
        let doorbell = rgpu_proto::ControlCommand::Doorbell { until: 0 }.to_bytes(0);
        let err = decode_command(&doorbell).unwrap_err();
        assert!(err.contains("unknown opcode"), "{err}");
        let fine = Command::EventQuery { event: 1 };
        assert_eq!(decode_command(&fine.to_bytes(0)), Ok(fine));
        // Garbage and trailing bytes.
        assert!(decode_command(&[1, 2, 3]).is_err());
        let mut padded = Command::EventQuery { event: 1 }.to_bytes(0);
        padded.extend_from_slice(&[0; 8]);
        assert!(decode_command(&padded).is_err());
    }
}

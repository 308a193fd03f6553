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
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use log::{debug, info};
use rgpu_proto::command::decode_one;
use rgpu_proto::remote::{
    frame_length, HelloRole, Request, Response, MAX_DATA_PIECE, MAX_IMAGE, REMOTE_VERSION,
    TOKEN_BYTES,
};
use rgpu_proto::Command;
use rgpu_transport::carrier::local::LocalCarrier;
use rgpu_transport::{Carrier, CarrierError, Channel};

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
    /// Sockets of its channel connections, shut down when it ends.
    channels: Mutex<Vec<TcpStream>>,
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
struct Frames {
    io: Box<dyn ReadWrite>,
}

impl Frames {
    fn read(&mut self) -> std::io::Result<Option<Request>> {
        let mut header = [0u8; 4];
        match self.io.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let length = frame_length(header).map_err(invalid)?;
        let mut body = vec![0u8; length];
        self.io.read_exact(&mut body)?;
        Request::decode(&body).map(Some).map_err(invalid)
    }

    fn write(&mut self, response: &Response) -> std::io::Result<()> {
        self.io.write_all(&response.encode())?;
        self.io.flush()
    }
}

fn invalid(e: impl ToString) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

/// Whether a remote client may put `command` in the ring: not the ring's
/// own control, and nothing that names blob memory (copies and module
/// images come as requests of their own).
fn allowed(command: &Command) -> bool {
    !matches!(
        command,
        Command::BindChannel { .. }
            | Command::Doorbell { .. }
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
        let mut frames = Frames { io };
        let tenant = match tenant {
            Ok(tenant) => tenant,
            Err(reason) => {
                rgpu_session::warn_limited!("remote {peer}: refused: {reason}");
                let _ = frames.write(&Response::Refused { reason });
                return;
            }
        };
        let _ = socket.set_read_timeout(Some(HELLO_TIMEOUT));
        let hello = frames.read();
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

    fn serve_channel(
        self: &Arc<Self>,
        mut frames: Frames,
        socket: TcpStream,
        tenant: &str,
        peer: &str,
        token: [u8; TOKEN_BYTES],
        name: &str,
    ) {
        let process = lock(&self.processes).get(&token).cloned();
        // Another tenant's token is as good as none.
        let Some(process) = process.filter(|p| p.tenant == tenant) else {
            rgpu_session::warn_limited!(
                "remote {peer} (tenant {tenant}): a channel with an unknown process token"
            );
            let _ = frames.write(&Response::Refused {
                reason: "unknown process token".into(),
            });
            return;
        };
        let channel = match Channel::open(Arc::clone(&process.carrier), name) {
            Ok(channel) => channel,
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
        let welcomed = frames.write(&Response::Welcome {
            token,
            ctx_id: channel.ctx_id(),
            capset: Vec::new(),
        });
        if welcomed.is_ok() {
            if let Err(reason) = replay(&mut frames, &channel) {
                debug!("remote {peer}: channel {}: {reason}", channel.ctx_id());
                let _ = frames.write(&Response::Failed { reason });
            }
        }
        let _ = channel.close();
        let _ = socket.shutdown(Shutdown::Both);
    }
}

/// Replays a channel connection's requests on `channel` until the client
/// closes it (`Ok`) or something fails (the reason).
fn replay(frames: &mut Frames, channel: &Channel) -> Result<(), String> {
    let lost = |e: CarrierError| format!("the host side failed: {e}");
    let write = |frames: &mut Frames, response: Response| {
        frames.write(&response).map_err(|e| format!("write: {e}"))
    };
    // The module image in pieces, until its load.
    let mut image: Vec<u8> = Vec::new();
    loop {
        let request = match frames.read() {
            Ok(Some(request)) => request,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("read: {e}")),
        };
        match request {
            Request::Send { command } => channel.send(&decode_command(&command)?).map_err(lost)?,
            Request::Call { command } => {
                let reply = channel.call(&decode_command(&command)?).map_err(lost)?;
                write(
                    frames,
                    Response::Reply {
                        result: reply.result,
                        payload: reply.payload,
                    },
                )?;
            }
            Request::CopyToDevice {
                stream,
                dst,
                sync,
                data,
            } => {
                let result = channel
                    .copy_to_device(stream, dst, &data, sync)
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
                image.extend_from_slice(&data);
            }
            Request::LoadModule {
                command,
                image: last,
            } => {
                if image.len() + last.len() > MAX_IMAGE {
                    return Err(format!("a module image past {MAX_IMAGE} bytes"));
                }
                image.extend_from_slice(&last);
                let decoded = decode_one(&command).map_err(|e| format!("bad command: {e}"))?;
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
            Request::Hello { .. } => return Err("a second hello".into()),
        }
    }
}

/// Streams `length` bytes of device memory at `src` to the client: one
/// thread reads the next piece from the GPU while this one sends the last,
/// so the copy and the network overlap.
fn copy_from_device(
    frames: &mut Frames,
    channel: &Channel,
    stream: u32,
    src: u64,
    length: u64,
) -> Result<(), String> {
    let piece_size = MAX_DATA_PIECE as u64;
    let pieces = length.div_ceil(piece_size);
    let read = |index: u64| -> Result<Result<Vec<u8>, u32>, String> {
        let offset = index * piece_size;
        let size = (length - offset).min(piece_size) as usize;
        let mut piece = vec![0u8; size];
        match channel.copy_from_device(stream, &mut piece, src.wrapping_add(offset)) {
            Ok(0) => Ok(Ok(piece)),
            Ok(result) => Ok(Err(result)),
            Err(e) => Err(format!("the host side failed: {e}")),
        }
    };
    let send = |frames: &mut Frames, response: Response| {
        frames.write(&response).map_err(|e| format!("write: {e}"))
    };
    if pieces <= 1 {
        let result = match read(0)? {
            Ok(data) => {
                send(frames, Response::Data { data })?;
                0
            }
            Err(result) => result,
        };
        return send(frames, Response::Result { result });
    }
    std::thread::scope(|scope| {
        // Two pieces in flight at most: one being sent, one being read.
        let (pieces_tx, pieces_rx) = std::sync::mpsc::sync_channel(1);
        let reader = scope.spawn(move || {
            for index in 0..pieces {
                let piece = read(index);
                let stop = !matches!(piece, Ok(Ok(_)));
                if pieces_tx.send(piece).is_err() || stop {
                    return;
                }
            }
        });
        let mut outcome = Ok(0);
        for piece in pieces_rx.iter() {
            match piece {
                Ok(Ok(data)) => {
                    if let Err(e) = send(frames, Response::Data { data }) {
                        outcome = Err(e);
                        break;
                    }
                }
                Ok(Err(result)) => {
                    outcome = Ok(result);
                    break;
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // The reader stops at its next send once the receiver is gone.
        drop(pieces_rx);
        let _ = reader.join();
        let result = outcome?;
        send(frames, Response::Result { result })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_proto::BlobRange;

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
            Command::Doorbell { until: 0 },
        ];
        for command in refused {
            let err = decode_command(&command.to_bytes(0)).unwrap_err();
            assert!(err.contains("not allowed"), "{err}");
        }
        let fine = Command::EventQuery { event: 1 };
        assert_eq!(decode_command(&fine.to_bytes(0)), Ok(fine));
        // Garbage and trailing bytes.
        assert!(decode_command(&[1, 2, 3]).is_err());
        let mut padded = Command::EventQuery { event: 1 }.to_bytes(0);
        padded.extend_from_slice(&[0; 8]);
        assert!(decode_command(&padded).is_err());
    }
}

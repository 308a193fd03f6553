//! The network carrier (`RGPU_SERVER=tls://HOST:PORT`, or `tcp://` where
//! the daemon allows plaintext): the command stream over TCP, with mutual
//! TLS 1.3 (rustls), to a daemon started with `--listen`.
//!
//! Nothing is shared across the network, so this carrier has no blobs: the
//! process holds one connection that names it (its host process lives as
//! long as that connection), and each CUDA context a connection of its own
//! ([`crate::remote_channel::RemoteChannel`]) that carries commands and the bytes
//! of every copy (rgpu-proto `remote`).
//!
//! Environment:
//! - `RGPU_TLS_CA`: PEM file of the CA that signed the daemon's certificate;
//! - `RGPU_TLS_CERT`, `RGPU_TLS_KEY`: this client's certificate and key
//!   (PEM), which the daemon checks against its `--tls-client-ca`;
//! - `RGPU_REMOTE_TIMEOUT_S`: after how long without an answer from the
//!   peer's TCP stack a connection counts as dropped (default 20): calls
//!   then fail instead of hanging.
//! - `RGPU_REMOTE_LANES`: data lanes each context opens for copies of
//!   16 MiB and more (default 4, at most 8; 0: none), so that their TLS
//!   runs on several cores ([`crate::remote_channel::RemoteChannel`]).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rgpu_proto::capset::{device_attribute, Capset, DeviceInfo};
use rgpu_proto::remote::{
    frame_length, is_data, HelloRole, Request, Response, REMOTE_VERSION, TOKEN_BYTES,
};
use rgpu_proto::PROTOCOL_VERSION;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{BlobMapping, Carrier, CarrierError, FenceToken};

/// Default of `RGPU_REMOTE_TIMEOUT_S`.
pub const DEFAULT_TIMEOUT_S: u64 = 20;
/// How long connecting (TCP and the TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the daemon is and how to speak to it.
#[derive(Clone)]
pub struct RemoteEndpoint {
    /// `HOST:PORT` as given.
    address: String,
    /// The TLS client configuration; `None` for `tcp://`.
    tls: Option<Arc<rustls::ClientConfig>>,
    server_name: ServerName<'static>,
    timeout: Duration,
}

impl std::fmt::Debug for RemoteEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEndpoint")
            .field("address", &self.address)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

fn setup(message: String) -> CarrierError {
    CarrierError::RemoteSetup(message)
}

/// The certificates of a PEM file, with an error that names the variable.
fn certificates(variable: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, CarrierError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| setup(format!("{variable}={}: {e}", path.display())))?;
    if certificates.is_empty() {
        return Err(setup(format!(
            "{variable}={}: no certificate in the file",
            path.display()
        )));
    }
    Ok(certificates)
}

fn env_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(Into::into)
}

impl RemoteEndpoint {
    /// Parses `tls://HOST:PORT` or `tcp://HOST:PORT`, reading the TLS files
    /// the environment names.
    pub fn from_url(url: &str) -> Result<Self, CarrierError> {
        let timeout = std::env::var("RGPU_REMOTE_TIMEOUT_S")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_TIMEOUT_S);
        Self::with_files(
            url,
            [
                env_path("RGPU_TLS_CA"),
                env_path("RGPU_TLS_CERT"),
                env_path("RGPU_TLS_KEY"),
            ],
            Duration::from_secs(timeout),
        )
    }

    /// [`RemoteEndpoint::from_url`] with the CA, certificate and key files
    /// given (`[ca, cert, key]`) instead of the environment's.
    pub fn with_files(
        url: &str,
        files: [Option<std::path::PathBuf>; 3],
        timeout: Duration,
    ) -> Result<Self, CarrierError> {
        let (tls, address) = if let Some(rest) = url.strip_prefix("tls://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("tcp://") {
            (false, rest)
        } else {
            return Err(setup(format!(
                "RGPU_SERVER={url:?}: give tls://HOST:PORT (or tcp://HOST:PORT where the \
                 daemon allows plaintext)"
            )));
        };
        let address = address.trim_end_matches('/');
        let host = match address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                host.trim_start_matches('[').trim_end_matches(']')
            }
            _ => {
                return Err(setup(format!(
                    "RGPU_SERVER={url:?}: the address needs a host and a port"
                )))
            }
        };
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|e| setup(format!("RGPU_SERVER={url:?}: bad host name: {e}")))?;
        let [ca, cert, key] = files;
        let tls = if tls {
            Some(Arc::new(client_config(
                ca.as_deref(),
                cert.as_deref(),
                key.as_deref(),
            )?))
        } else {
            None
        };
        Ok(Self {
            address: address.to_owned(),
            tls,
            server_name,
            timeout,
        })
    }

    /// The address as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A new connection to the daemon, TLS handshake done.
    pub fn connect(&self) -> Result<FrameStream, CarrierError> {
        let addrs: Vec<_> = self
            .address
            .to_socket_addrs()
            .map_err(|e| self.connect_error(e))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT.min(self.timeout)) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| {
            self.connect_error(last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into()))
        })?;
        stream.set_nodelay(true)?;
        // A peer that vanishes (host down, network cut) is noticed by TCP
        // within the timeout, and the call waiting on it fails.
        let socket = socket2::SockRef::from(&stream);
        let probe = (self.timeout / 4).max(Duration::from_secs(1));
        socket.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(probe)
                .with_interval(probe)
                .with_retries(3),
        )?;
        socket.set_tcp_user_timeout(Some(self.timeout))?;
        // A read or write that makes no progress this long asks whether
        // the daemon is still there (FrameStream::liveness).
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        let stream = SpinningSocket::new(stream, spin_from_env());
        let io: Box<dyn ReadWrite> = match &self.tls {
            Some(config) => {
                let connection =
                    rustls::ClientConnection::new(Arc::clone(config), self.server_name.clone())
                        .map_err(|e| setup(format!("TLS client: {e}")))?;
                let mut tls = rustls::StreamOwned::new(connection, stream);
                // The handshake within the connect timeout.
                tls.sock
                    .get_ref()
                    .set_read_timeout(Some(CONNECT_TIMEOUT.min(self.timeout)))?;
                while tls.conn.is_handshaking() {
                    tls.conn
                        .complete_io(&mut tls.sock)
                        .map_err(|e| self.tls_error(e))?;
                }
                tls.sock.get_ref().set_read_timeout(Some(self.timeout))?;
                tls.sock.get_ref().set_write_timeout(Some(self.timeout))?;
                Box::new(tls)
            }
            None => Box::new(stream),
        };
        Ok(FrameStream {
            io,
            peer: self.address.clone(),
            pending: Vec::new(),
            sent: Arc::default(),
            timeout: self.timeout,
            liveness: None,
        })
    }

    fn connect_error(&self, source: std::io::Error) -> CarrierError {
        CarrierError::Connect {
            path: self.address.clone(),
            source,
        }
    }

    /// What a failed TLS handshake means, in words.
    fn tls_error(&self, e: std::io::Error) -> CarrierError {
        let text = e.to_string();
        let hint = if text.contains("InvalidContentType") || text.contains("corrupt message") {
            "the daemon did not answer TLS (is it a plaintext-only listener? then use tcp://)"
        } else if text.contains("invalid peer certificate") {
            "the daemon's certificate is not one RGPU_TLS_CA vouches for"
        } else {
            "TLS handshake failed"
        };
        CarrierError::Refused(format!("{hint}: {} ({text})", self.address))
    }
}

/// Builds the TLS client side: the daemon is trusted through `ca`, and this
/// client shows `cert` with `key`.
pub fn client_config(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<rustls::ClientConfig, CarrierError> {
    let ca = ca.ok_or_else(|| {
        setup(
            "tls:// needs RGPU_TLS_CA, the PEM file of the CA that signed the daemon's certificate"
                .into(),
        )
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates("RGPU_TLS_CA", ca)? {
        roots
            .add(certificate)
            .map_err(|e| setup(format!("RGPU_TLS_CA={}: {e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup(format!("TLS 1.3: {e}")))?
        .with_root_certificates(roots);
    let config = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = certificates("RGPU_TLS_CERT", cert)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| setup(format!("RGPU_TLS_KEY={}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| setup(format!("RGPU_TLS_CERT and RGPU_TLS_KEY: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(setup(
                "give both RGPU_TLS_CERT and RGPU_TLS_KEY (this client's certificate and key)"
                    .into(),
            ))
        }
    };
    Ok(config)
}

/// A TCP stream as both ends of the network carrier use it: writes never
/// raise SIGPIPE (this library lives in applications that keep the default
/// action, which would end them when the daemon goes away mid-write), and a
/// read that finds nothing polls for a while before it sleeps, as the ring
/// channel does: an answer on loopback comes back in microseconds, sooner
/// than a sleeping thread wakes.
pub struct SpinningSocket {
    socket: TcpStream,
    spin: Duration,
}

impl SpinningSocket {
    pub fn new(socket: TcpStream, spin: Duration) -> Self {
        Self { socket, spin }
    }

    pub fn get_ref(&self) -> &TcpStream {
        &self.socket
    }
}

impl Read for SpinningSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let socket = socket2::SockRef::from(&self.socket);
        let start = std::time::Instant::now();
        loop {
            // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and recv
            // only writes initialised bytes into the buffer.
            let uninit = unsafe {
                &mut *(std::ptr::from_mut::<[u8]>(buf) as *mut [std::mem::MaybeUninit<u8>])
            };
            match socket.recv_with_flags(uninit, libc::MSG_DONTWAIT) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= self.spin {
                        return self.socket.read(buf);
                    }
                    std::hint::spin_loop();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }
}

impl Write for SpinningSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        socket2::SockRef::from(&self.socket).send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How long a read polls before it sleeps (`RGPU_SPIN_US`, as the ring
/// channel's).
pub fn spin_from_env() -> Duration {
    crate::channel::ChannelConfig::from_env().spin
}

/// What [`FrameStream::receive_into`] got.
#[derive(Debug)]
pub enum Received {
    /// This many bytes of data, now at the start of the destination.
    Data(usize),
    Other(Response),
}

/// A byte stream in both directions (TLS or plain TCP).
pub trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

/// Frames (rgpu-proto `remote`) over one connection.
pub struct FrameStream {
    io: Box<dyn ReadWrite>,
    peer: String,
    /// Frames queued but not written yet (asynchronous commands, sent in
    /// batches: one record and one system call for many launches).
    pending: Vec<u8>,
    /// Requests queued or sent so far (a query on another connection says
    /// how many must have reached the host before it is answered).
    sent: Arc<AtomicU64>,
    /// After how long without progress a read or write asks
    /// [`FrameStream::liveness`] (the socket's timeouts).
    timeout: Duration,
    /// Whether the daemon still serves this connection, asked when a read
    /// or write made no progress for the timeout (a long kernel is not a
    /// dead peer); `None`: the timeout fails the call.
    liveness: Option<Liveness>,
}

/// Asks whether the daemon still serves a connection (an answer on
/// another connection): `Ok` to keep waiting.
pub type Liveness = Arc<dyn Fn() -> Result<(), CarrierError> + Send + Sync>;

fn stalled(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Frames with more bytes than this are written on their own, never
/// queued (copy data).
const QUEUE_MAX_FRAME: usize = 64 << 10;
/// Queued bytes past which the queue is written at once.
const QUEUE_FLUSH_BYTES: usize = 256 << 10;

impl FrameStream {
    /// The count of requests queued or sent, shared.
    pub fn sent_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.sent)
    }

    /// Writes `bytes` as they are (tests of the gateway's checks send
    /// frames no client would).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), CarrierError> {
        self.write_full(bytes)?;
        self.flush_io()
    }

    /// Sends `request` now, after whatever was queued.
    pub fn send(&mut self, request: &Request<'_>) -> Result<(), CarrierError> {
        if !matches!(request, Request::Hello { .. }) {
            self.sent.fetch_add(1, Ordering::AcqRel);
        }
        if request.tail().len() <= QUEUE_MAX_FRAME {
            // Writing to a vector cannot fail.
            let _ = request.write_to(&mut self.pending);
            return self.flush();
        }
        self.flush()?;
        // The head, then the data from where it is.
        self.write_full(&request.head())?;
        self.write_full(request.tail())?;
        self.flush_io()
    }

    /// Queues a small `request` to be written with the next send or flush;
    /// true if the queue was empty before (someone must flush it soon).
    pub fn queue(&mut self, request: &Request<'_>) -> Result<bool, CarrierError> {
        if request.tail().len() > QUEUE_MAX_FRAME {
            self.send(request)?;
            return Ok(false);
        }
        self.sent.fetch_add(1, Ordering::AcqRel);
        let was_empty = self.pending.is_empty();
        // Writing to a vector cannot fail.
        let _ = request.write_to(&mut self.pending);
        if self.pending.len() >= QUEUE_FLUSH_BYTES {
            self.flush()?;
            return Ok(false);
        }
        Ok(was_empty)
    }

    /// Writes what is queued.
    pub fn flush(&mut self) -> Result<(), CarrierError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let written = self.write_full(&pending).and_then(|()| self.flush_io());
        self.pending = pending;
        self.pending.clear();
        written
    }

    /// Sets what a stalled read or write asks (see [`Liveness`]).
    pub fn set_liveness(&mut self, liveness: Liveness) {
        self.liveness = Some(liveness);
    }

    /// A read or write made no progress for the timeout: keep waiting if
    /// the daemon says it still serves this connection.
    fn stalled(&self) -> Result<(), CarrierError> {
        match &self.liveness {
            Some(alive) => alive(),
            None => Err(CarrierError::ContextLost(format!(
                "no answer from {} within {:?}",
                self.peer, self.timeout
            ))),
        }
    }

    fn write_full(&mut self, mut bytes: &[u8]) -> Result<(), CarrierError> {
        while !bytes.is_empty() {
            match self.io.write(bytes) {
                Ok(0) => return Err(self.broken(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => bytes = bytes.get(n..).unwrap_or_default(),
                Err(e) if stalled(&e) => self.stalled()?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.broken(e)),
            }
        }
        Ok(())
    }

    fn flush_io(&mut self) -> Result<(), CarrierError> {
        loop {
            match self.io.flush() {
                Ok(()) => return Ok(()),
                Err(e) if stalled(&e) => self.stalled()?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.broken(e)),
            }
        }
    }

    fn read_full(&mut self, buf: &mut [u8]) -> Result<(), CarrierError> {
        let mut filled = 0;
        while filled < buf.len() {
            let rest = buf.get_mut(filled..).unwrap_or_default();
            match self.io.read(rest) {
                Ok(0) => return Err(self.broken(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => filled += n,
                Err(e) if stalled(&e) => self.stalled()?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.broken(e)),
            }
        }
        Ok(())
    }

    /// The next frame from the gateway.
    /// Device printf output on the way is printed here, as the ring
    /// channel prints it.
    pub fn receive(&mut self) -> Result<Response, CarrierError> {
        loop {
            let length = self.frame_length()?;
            let mut body = vec![0u8; length];
            self.read_full(&mut body)?;
            match Response::decode(&body).map_err(|e| self.protocol(e))? {
                Response::Console { bytes } => crate::console::write_stdout(&bytes),
                other => return Ok(other),
            }
        }
    }

    /// The next frame from the gateway; a data frame's bytes go straight
    /// into `dst` (it must fit there).
    pub fn receive_into(&mut self, dst: &mut [u8]) -> Result<Received, CarrierError> {
        let length = self.frame_length()?;
        let mut kind = [0u8; 1];
        self.read_full(&mut kind)?;
        let rest = length - 1;
        if is_data(kind[0]) {
            let target = dst.get_mut(..rest).ok_or_else(|| {
                CarrierError::Protocol(format!("{} sent more data than asked", self.peer))
            })?;
            self.read_full(target)?;
            return Ok(Received::Data(rest));
        }
        let mut body = vec![0u8; length];
        body[0] = kind[0];
        self.read_full(&mut body[1..])?;
        match Response::decode(&body).map_err(|e| self.protocol(e))? {
            Response::Console { bytes } => {
                crate::console::write_stdout(&bytes);
                self.receive_into(dst)
            }
            other => Ok(Received::Other(other)),
        }
    }

    fn frame_length(&mut self) -> Result<usize, CarrierError> {
        let mut header = [0u8; 4];
        self.read_full(&mut header)?;
        frame_length(header).map_err(|e| self.protocol(e))
    }

    fn protocol(&self, e: rgpu_proto::DecodeError) -> CarrierError {
        CarrierError::Protocol(format!("from {}: {e}", self.peer))
    }

    /// What a failed read or write means: the connection is gone (or the
    /// daemon refused this client's certificate, which TLS 1.3 says at the
    /// first read after the handshake).
    fn broken(&self, e: std::io::Error) -> CarrierError {
        let text = e.to_string();
        if text.contains("CertificateRequired")
            || text.contains("BadCertificate")
            || text.contains("UnknownCA")
            || text.contains("CertificateExpired")
            || text.contains("AccessDenied")
        {
            return CarrierError::Refused(format!(
                "the daemon at {} refused this client's certificate ({text}): set RGPU_TLS_CERT \
                 and RGPU_TLS_KEY to a valid certificate that its --tls-client-ca signed",
                self.peer
            ));
        }
        CarrierError::ContextLost(format!("the connection to {} broke: {text}", self.peer))
    }

    /// Says hello as `role`; returns the token, the context id and the
    /// capset bytes of the welcome.
    pub fn hello(
        &mut self,
        role: HelloRole,
    ) -> Result<([u8; TOKEN_BYTES], u32, Vec<u8>), CarrierError> {
        self.send(&Request::Hello {
            version: REMOTE_VERSION,
            role,
        })?;
        match self.receive() {
            Ok(Response::Welcome {
                token,
                ctx_id,
                capset,
            }) => Ok((token, ctx_id, capset)),
            Ok(Response::Refused { reason }) => Err(CarrierError::Refused(format!(
                "the daemon at {} refused the connection: {reason}",
                self.peer
            ))),
            Ok(other) => Err(CarrierError::Protocol(format!(
                "{} answered a hello with {other:?}",
                self.peer
            ))),
            // A daemon that closes at once after the handshake refused us.
            Err(CarrierError::ContextLost(text)) => Err(CarrierError::Refused(format!(
                "the daemon closed the connection during the hello: {text}"
            ))),
            Err(e) => Err(e),
        }
    }
}

/// The carrier of a remote process: its process connection and the
/// daemon's capset.
pub struct RemoteCarrier {
    endpoint: RemoteEndpoint,
    capset: Capset,
    token: [u8; TOKEN_BYTES],
    /// Held open: the gateway keeps this process's host side as long as
    /// it is.
    _process: Mutex<FrameStream>,
}

impl RemoteCarrier {
    /// Connects to the daemon at `url` as the process `name`.
    pub fn connect(url: &str, name: &str) -> Result<Self, CarrierError> {
        let endpoint = RemoteEndpoint::from_url(url)?;
        let mut process = endpoint.connect()?;
        let (token, _, capset) = process.hello(HelloRole::Process { name: name.into() })?;
        let mut capset = Capset::decode(&capset).map_err(CarrierError::BadCapset)?;
        if capset.protocol_version != PROTOCOL_VERSION {
            return Err(CarrierError::VersionMismatch {
                guest: PROTOCOL_VERSION,
                host: capset.protocol_version,
            });
        }
        capset.devices.iter_mut().for_each(without_host_mapping);
        Ok(Self {
            endpoint,
            capset,
            token,
            _process: Mutex::new(process),
        })
    }

    pub fn endpoint(&self) -> &RemoteEndpoint {
        &self.endpoint
    }

    /// The token that ties a channel connection to this process.
    pub fn token(&self) -> [u8; TOKEN_BYTES] {
        self.token
    }
}

/// A remote GPU cannot reach this process's memory: page-locked memory is
/// the process's own, so the device neither maps host memory nor shares
/// one address space with it. Saying so keeps programs that check from
/// handing a kernel a host pointer (XLA's timing kernel spins on a
/// page-locked flag when unified addressing is on, and faulted the
/// context).
fn without_host_mapping(device: &mut DeviceInfo) {
    device.set_attribute(device_attribute::CAN_MAP_HOST_MEMORY, 0);
    device.set_attribute(device_attribute::UNIFIED_ADDRESSING, 0);
}

fn no_blobs() -> CarrierError {
    CarrierError::Unsupported(
        "shared memory (the network carrier moves every byte on its connection)",
    )
}

impl Carrier for RemoteCarrier {
    fn capset(&self) -> &Capset {
        &self.capset
    }

    fn create_context(&self, _debug_name: &str) -> Result<u32, CarrierError> {
        Err(CarrierError::Unsupported(
            "virtio-gpu contexts (a remote channel opens its own connection)",
        ))
    }

    fn destroy_context(&self, _ctx_id: u32) -> Result<(), CarrierError> {
        Err(no_blobs())
    }

    fn create_blob(&self, _ctx_id: u32, _size: u64) -> Result<BlobMapping, CarrierError> {
        Err(no_blobs())
    }

    fn attach_blob(&self, _ctx_id: u32, _resource_id: u32) -> Result<(), CarrierError> {
        Err(no_blobs())
    }

    fn destroy_blob(&self, _ctx_id: u32, _resource_id: u32) -> Result<(), CarrierError> {
        Err(no_blobs())
    }

    fn submit(
        &self,
        _ctx_id: u32,
        _payload: &[u8],
        _fenced: bool,
    ) -> Result<Option<FenceToken>, CarrierError> {
        Err(no_blobs())
    }

    fn wait_fence(&self, _ctx_id: u32, _fence: FenceToken) -> Result<(), CarrierError> {
        Err(no_blobs())
    }

    fn raw_control(&self, _request: &[u8], _response_len: usize) -> Result<Vec<u8>, CarrierError> {
        Err(CarrierError::Unsupported("the virtio-gpu control queue"))
    }

    fn remote(&self) -> Option<&RemoteCarrier> {
        Some(self)
    }
}

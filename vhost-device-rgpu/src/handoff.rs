//! Handing a connection from the parent to the process that serves it, and
//! serving it there.
//!
//! The parent accepts every connection itself ([`crate::gate`]) and passes
//! each one whose frontend spoke to its standby child, as a descriptor over
//! a Unix socket the two share ([`send_connection`], [`receive_connection`]).
//! vhost-user-backend's `VhostUserDaemon` only serves a connection it
//! accepts itself (`start(&mut Listener)`), so the child listens on a
//! private socket ([`private_connection`]: a fresh 0700 directory, removed
//! as soon as we are connected), lets the daemon accept our connection
//! there, and [`relay`]s between it and the frontend's stream.
//!
//! The relay forwards whole vhost-user messages, each with the descriptors
//! that came with it (memory regions, eventfds, the backend-request
//! socket), in one `sendmsg`. Forwarding raw reads would not do: a read
//! that starts in stream data queued before a message that carries
//! descriptors goes on into that message and returns its descriptors (the
//! kernel stops a read only *after* such data), so they would arrive with
//! the message before theirs, which the backend rejects. Reading exactly a
//! header, then exactly its body, as the backend itself does, never reaches
//! into the next message. Only set-up and control messages cross this
//! socket; the data path is shared memory and eventfds.

use std::io::{self, IoSlice};
use std::mem::{size_of, size_of_val};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;

use log::{debug, warn};

/// A vhost-user message header: request, flags, payload size (u32 each,
/// little-endian).
const HEADER_SIZE: usize = 12;
/// Where the payload size is in the header.
const SIZE_OFFSET: usize = 8;
/// The largest payload relayed. vhost-user messages are at most 4 KiB
/// (vhost's `MAX_MSG_SIZE`); a larger size means a broken or hostile peer,
/// and we need not buffer it to let the backend say so.
const MAX_PAYLOAD: usize = 64 * 1024;
/// The most descriptors one message may carry: vhost's
/// `MAX_ATTACHED_FD_ENTRIES`, which the backend enforces too.
const MAX_FDS: usize = 32;
/// Control-message buffer for [`MAX_FDS`] descriptors, in u64s (aligned as
/// a `cmsghdr` must be).
// SAFETY: CMSG_SPACE is arithmetic on its argument.
const CMSG_WORDS: usize =
    unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<RawFd>()) as u32) } as usize / 8 + 1;

/// Name prefix of the child's private directory (under /dev/shm).
const PRIVATE_DIRECTORY_PREFIX: &str = "rgpu-conn";

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("descriptor {0} is not a connected Unix stream socket: {1}")]
    BadFd(RawFd, io::Error),
    #[error("cannot receive the connection from the parent: {0}")]
    Receive(io::Error),
    #[error("the parent's message came without a connection")]
    NoConnection,
    #[error("cannot create the private socket to serve the connection on: {0}")]
    Private(io::Error),
    #[error("cannot start a relay thread: {0}")]
    Thread(io::Error),
}

/// Takes over the inherited hand-off socket `fd` (`--fd` of a connection
/// process). The caller must not use `fd` otherwise afterwards.
pub fn inherit_control(fd: RawFd) -> Result<UnixStream, HandoffError> {
    let bad = |e| HandoffError::BadFd(fd, e);
    let domain = socket_option(fd, libc::SO_DOMAIN).map_err(bad)?;
    let kind = socket_option(fd, libc::SO_TYPE).map_err(bad)?;
    let listening = socket_option(fd, libc::SO_ACCEPTCONN).map_err(bad)?;
    if domain != libc::AF_UNIX || kind != libc::SOCK_STREAM || listening != 0 {
        return Err(bad(io::Error::other("wrong kind of socket")));
    }
    // SAFETY: fd is an open Unix stream socket (checked above) that the
    // caller hands over to us.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // Inherited descriptors lack close-on-exec; nothing we start needs it.
    // SAFETY: fcntl on a descriptor we now own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(stream)
}

fn socket_option(fd: RawFd, option: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`, a valid
    // c_int; a bad fd only makes it fail.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// The parent's side: passes `stream` to the child at the other end of
/// `control` (one byte, one descriptor). Never blocks: the child reads one
/// message, and a socket buffer holds many.
pub fn send_connection(control: &UnixStream, stream: &UnixStream) -> io::Result<()> {
    let sent = send_with_fds(
        control,
        &[IoSlice::new(&[0])],
        &[stream.as_raw_fd()],
        libc::MSG_DONTWAIT,
    )?;
    if sent != 1 {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "nothing sent"));
    }
    Ok(())
}

/// The child's side: waits for the connection to serve; `None` if the
/// parent closed `control` first (it is going away, or gave up on us).
pub fn receive_connection(control: &UnixStream) -> Result<Option<UnixStream>, HandoffError> {
    let mut receiver = Receiver::new();
    let mut fds = Vec::new();
    let mut byte = [0u8; 1];
    let read = receiver
        .recv(control, &mut byte, &mut fds)
        .map_err(HandoffError::Receive)?;
    if read == 0 {
        return Ok(None);
    }
    // Exactly one descriptor: anything else is not what the parent sends.
    match (fds.pop(), fds.is_empty()) {
        (Some(fd), true) => Ok(Some(UnixStream::from(fd))),
        _ => Err(HandoffError::NoConnection),
    }
}

/// A listener only this process can reach, and our connection to it, which
/// the listener will accept. Its socket file is gone by the time this
/// returns (the listener and the connection live on without it).
pub fn private_connection() -> Result<(UnixListener, UnixStream), HandoffError> {
    let dir = crate::supervisor::private_directory(PRIVATE_DIRECTORY_PREFIX)
        .map_err(HandoffError::Private)?;
    let connected = connect_in(&dir);
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        warn!("cannot remove {}: {e}", dir.display());
    }
    connected.map_err(HandoffError::Private)
}

fn connect_in(dir: &Path) -> io::Result<(UnixListener, UnixStream)> {
    let path: PathBuf = dir.join("s");
    let listener = UnixListener::bind(&path)?;
    // Completes at once: the connection waits in the listener's backlog.
    let stream = UnixStream::connect(&path)?;
    Ok((listener, stream))
}

/// Relays vhost-user messages between the frontend's stream and ours to
/// the daemon, on two threads (one per direction), until either side
/// closes; then shuts both down, so the other side sees the end too.
/// Connection `id` names the threads and the log lines.
pub fn relay(id: u64, frontend: UnixStream, daemon: UnixStream) -> Result<(), HandoffError> {
    let frontend = Arc::new(frontend);
    let daemon = Arc::new(daemon);
    for (from, to, name) in [
        (Arc::clone(&frontend), Arc::clone(&daemon), "requests"),
        (daemon, frontend, "replies"),
    ] {
        thread::Builder::new()
            .name(format!("rgpu-relay-{name}"))
            .spawn(move || {
                match pump(&from, &to) {
                    Ok(()) => debug!("connection {id}: {name} ended"),
                    // A side that exits with bytes unread resets the other:
                    // an ordinary end (a VM killed, say).
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                        ) =>
                    {
                        debug!("connection {id}: {name} ended: {e}")
                    }
                    Err(e) => {
                        warn!("connection {id}: relaying {name}: {e}; closing the connection")
                    }
                }
                // Ending both sockets wakes the other direction too.
                let _ = from.shutdown(Shutdown::Both);
                let _ = to.shutdown(Shutdown::Both);
            })
            .map_err(HandoffError::Thread)?;
    }
    Ok(())
}

/// Forwards messages from `from` to `to` until `from` ends (`Ok`) or
/// either fails.
fn pump(from: &UnixStream, to: &UnixStream) -> io::Result<()> {
    let mut receiver = Receiver::new();
    let mut message = vec![0u8; HEADER_SIZE + MAX_PAYLOAD];
    loop {
        let mut fds = Vec::new();
        if !receiver.recv_exact(from, &mut message[..HEADER_SIZE], &mut fds)? {
            return Ok(());
        }
        let mut size = [0u8; 4];
        size.copy_from_slice(&message[SIZE_OFFSET..HEADER_SIZE]);
        let size = u32::from_le_bytes(size) as usize;
        if size > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message of {size} bytes (at most {MAX_PAYLOAD})"),
            ));
        }
        let end = HEADER_SIZE + size;
        if !receiver.recv_exact(from, &mut message[HEADER_SIZE..end], &mut fds)? {
            // The peer went away mid-message: nothing to pass on.
            return Ok(());
        }
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message with {} descriptors", fds.len()),
            ));
        }
        send_all(to, &message[..end], &fds)?;
        // Our copies of the descriptors close here; `to`'s reader has its own.
    }
}

/// Sends all of `bytes`, the descriptors with the first part.
fn send_all(to: &UnixStream, bytes: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut sent = send_with_fds(to, &[IoSlice::new(bytes)], &raw, 0)?;
    while sent < bytes.len() {
        let more = send_with_fds(to, &[IoSlice::new(&bytes[sent..])], &[], 0)?;
        if more == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "nothing sent"));
        }
        sent += more;
    }
    Ok(())
}

/// One `sendmsg` of `bufs` with `fds` attached (none: no control message);
/// never raises SIGPIPE. Retried on EINTR.
fn send_with_fds(
    socket: &UnixStream,
    bufs: &[IoSlice<'_>],
    fds: &[RawFd],
    flags: libc::c_int,
) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    let mut control = [0u64; CMSG_WORDS];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec; sendmsg only reads through it.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    if !fds.is_empty() {
        let data_len = size_of_val(fds) as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is arithmetic; the result fits `control`
        // (sized for MAX_FDS, checked above).
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as _;
        // SAFETY: msg_control points at `control`, large enough for one
        // header and `fds`, aligned for cmsghdr (u64 words); CMSG_FIRSTHDR
        // is non-null as msg_controllen covers a header.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                data_len as usize,
            );
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers (`bufs`, `control`) for the
        // duration of the call.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, flags | libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives bytes with the descriptors that come with them (close-on-exec:
/// the connection process starts workers, which must not inherit a
/// frontend's memory or eventfds).
struct Receiver {
    control: Box<[u64; CMSG_WORDS]>,
}

impl Receiver {
    fn new() -> Self {
        Self {
            control: Box::new([0; CMSG_WORDS]),
        }
    }

    /// Fills `buf` completely, appending descriptors to `fds`. `Ok(false)`
    /// if the stream ended first (a clean end if nothing was read).
    fn recv_exact(
        &mut self,
        from: &UnixStream,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
    ) -> io::Result<bool> {
        let mut filled = 0;
        while filled < buf.len() {
            let read = self.recv(from, &mut buf[filled..], fds)?;
            if read == 0 {
                return Ok(false);
            }
            filled += read;
        }
        Ok(true)
    }

    /// One `recvmsg` into `buf`; `Ok(0)` at end of stream. Descriptors that
    /// came are appended to `fds`; if more came than fit, the ones that
    /// did are closed and it is an error.
    fn recv(
        &mut self,
        from: &UnixStream,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
    ) -> io::Result<usize> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = self.control.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; CMSG_WORDS]>() as _;
        let read = loop {
            // SAFETY: `msg` points at `buf` and `self.control`, both live
            // and writable for the lengths given.
            let read = unsafe { libc::recvmsg(from.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if read >= 0 {
                break read as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG
        // macros walk only within them, and each SCM_RIGHTS payload is an
        // array of descriptors now ours (read unaligned: CMSG_DATA need not
        // be aligned for c_int).
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg);
                    let count = ((*cmsg).cmsg_len as usize)
                        .saturating_sub(libc::CMSG_LEN(0) as usize)
                        / size_of::<RawFd>();
                    for i in 0..count {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {MAX_FDS} descriptors at once"),
            ));
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    /// A vhost-user-shaped message: header (request, flags, size), payload.
    fn message(request: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&request.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    fn pipe_fd() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors, ours alone.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn is_cloexec(fd: &OwnedFd) -> bool {
        // SAFETY: F_GETFD on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        flags & libc::FD_CLOEXEC != 0
    }

    /// Messages queued back to back, one of them with descriptors, arrive
    /// through the relay each with its own descriptors, in both directions;
    /// closing one end closes the other.
    #[test]
    fn relay_keeps_descriptors_with_their_message() {
        let (frontend, frontend_far) = UnixStream::pair().unwrap();
        let (daemon_far, daemon) = UnixStream::pair().unwrap();

        let (read_end, write_end) = pipe_fd();
        let first = message(1, &[]);
        let second = message(2, &[9; 40]);
        let third = message(3, &[8; 8]);
        // All three queued before the relay reads: the kernel would hand
        // the second's descriptor out with the first's bytes.
        let mut plain = frontend.try_clone().unwrap();
        plain.write_all(&first).unwrap();
        send_with_fds(
            &frontend,
            &[IoSlice::new(&second)],
            &[write_end.as_raw_fd()],
            0,
        )
        .unwrap();
        plain.write_all(&third).unwrap();
        drop(write_end);
        relay(7, frontend_far, daemon_far).unwrap();

        let mut receiver = Receiver::new();
        for (expected, fd_count) in [(&first, 0), (&second, 1), (&third, 0)] {
            let mut fds = Vec::new();
            let mut header = [0u8; HEADER_SIZE];
            assert!(receiver.recv_exact(&daemon, &mut header, &mut fds).unwrap());
            assert_eq!(
                fds.len(),
                fd_count,
                "descriptors with the header of {expected:?}"
            );
            let mut payload = vec![0u8; expected.len() - HEADER_SIZE];
            assert!(receiver
                .recv_exact(&daemon, &mut payload, &mut fds)
                .unwrap());
            assert_eq!(fds.len(), fd_count);
            assert_eq!([&header[..], &payload[..]].concat(), **expected);
            if let Some(fd) = fds.first() {
                assert!(is_cloexec(fd));
                // The relayed descriptor is the pipe's write end.
                let mut file = std::fs::File::from(fd.as_fd().try_clone_to_owned().unwrap());
                file.write_all(b"x").unwrap();
                let mut byte = [0u8; 1];
                std::fs::File::from(read_end.try_clone().unwrap())
                    .read_exact(&mut byte)
                    .unwrap();
                assert_eq!(&byte, b"x");
            }
        }

        // A reply with a descriptor, the other way.
        let (_r, w) = pipe_fd();
        let reply = message(4, &[1, 2, 3, 4, 5, 6, 7, 8]);
        send_with_fds(&daemon, &[IoSlice::new(&reply)], &[w.as_raw_fd()], 0).unwrap();
        let mut fds = Vec::new();
        let mut got = vec![0u8; reply.len()];
        assert!(receiver.recv_exact(&frontend, &mut got, &mut fds).unwrap());
        assert_eq!(got, reply);
        assert_eq!(fds.len(), 1);

        // The frontend leaves: the daemon's side ends.
        drop(plain);
        drop(frontend);
        let mut rest = Vec::new();
        (&daemon).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn relay_refuses_oversized_messages() {
        let (frontend, frontend_far) = UnixStream::pair().unwrap();
        let (daemon_far, daemon) = UnixStream::pair().unwrap();
        relay(8, frontend_far, daemon_far).unwrap();
        let mut header = message(1, &[]);
        header[SIZE_OFFSET..].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        (&frontend).write_all(&header).unwrap();
        // Both sides closed, nothing forwarded.
        let mut rest = Vec::new();
        (&daemon).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        (&frontend).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn connections_are_handed_over_once() {
        let (parent, child) = UnixStream::pair().unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        send_connection(&parent, &theirs).unwrap();
        drop(theirs);
        let received = receive_connection(&child).unwrap().unwrap();
        (&received).write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        (&ours).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        // The parent closing the socket is a clean "no connection".
        drop(parent);
        assert!(receive_connection(&child).unwrap().is_none());
    }

    #[test]
    fn the_private_listener_accepts_our_connection_and_leaves_no_file() {
        let (listener, stream) = private_connection().unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (&stream).write_all(b"ok").unwrap();
        let mut got = [0u8; 2];
        (&accepted).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ok");
        let path = listener.local_addr().unwrap();
        let path = path.as_pathname().unwrap();
        assert!(!path.exists() && !path.parent().unwrap().exists());
    }

    #[test]
    fn only_stream_sockets_are_inherited() {
        let (r, _w) = pipe_fd();
        assert!(matches!(
            inherit_control(r.as_raw_fd()),
            Err(HandoffError::BadFd(..))
        ));
    }
}

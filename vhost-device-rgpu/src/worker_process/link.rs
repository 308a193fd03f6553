//! The socket between a connection process and one worker process: a
//! `SOCK_SEQPACKET` pair, so each message is one datagram and the end of
//! the peer is a zero-length read; descriptors travel with a message
//! (`SCM_RIGHTS`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::message::MAX_MESSAGE_BYTES;

/// Descriptors accepted with one message.
const MAX_FDS: usize = 4;

/// One end of the pair.
#[derive(Debug)]
pub struct Link {
    // A connected SEQPACKET socket: UnixDatagram's send and recvmsg are the
    // calls it needs; nothing here depends on datagram semantics.
    socket: UnixDatagram,
}

/// A connected pair: one end for this process, one (close-on-exec, to be
/// made inheritable in the child) for the worker.
pub fn pair() -> io::Result<(Link, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors that nothing else owns.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((Link::from_fd(ours), theirs))
}

impl Link {
    /// Takes over an end of a pair (in the worker: the inherited one).
    pub fn from_fd(fd: OwnedFd) -> Link {
        Link {
            socket: UnixDatagram::from(fd),
        }
    }

    /// Sends one message with `fds`; an error means the peer is gone (or
    /// the message is too long, which is a bug here).
    pub fn send(&self, message: &[u8], fds: &[RawFd]) -> io::Result<()> {
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(io::Error::other(format!(
                "message of {} bytes exceeds {MAX_MESSAGE_BYTES}",
                message.len()
            )));
        }
        let sent = if fds.is_empty() {
            self.socket.send(message)?
        } else {
            self.socket.send_with_fds(&[message], fds)?
        };
        if sent != message.len() {
            return Err(io::Error::other("message sent in part"));
        }
        Ok(())
    }

    /// Receives one message into `buf` (at least [`MAX_MESSAGE_BYTES`] + 1
    /// long); `None` when the peer has gone.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let mut raw = [-1 as RawFd; MAX_FDS];
        let (len, count) = loop {
            // SAFETY: the iovec describes `buf`, which is ours to write.
            let received = unsafe { self.socket.recv_with_fds(&mut iov, &mut raw) };
            match received {
                Ok(got) => break got,
                Err(e) if e.errno() == libc::EINTR => continue,
                Err(e) => return Err(io::Error::from_raw_os_error(e.errno())),
            }
        };
        let fds = raw
            .iter()
            .take(count)
            .filter(|fd| **fd >= 0)
            // SAFETY: recvmsg gave us these descriptors; we own them now.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(*fd) })
            .collect();
        if len == 0 {
            return Ok(None);
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(io::Error::other("message longer than the limit"));
        }
        Ok(Some((len, fds)))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Makes the peer see the end, from any thread (the reader then ends).
    pub fn shutdown(&self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Tells the peer nothing more comes, while still reading its answers.
    pub fn shutdown_write(&self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn messages_keep_their_bounds_and_carry_descriptors() {
        let (a, b) = pair().expect("socketpair");
        let b = Link::from_fd(b);
        let mut file = tempfile_with(b"hello");
        a.send(b"one", &[]).expect("send");
        a.send(b"two!", &[file.as_raw_fd()]).expect("send with fd");
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES + 1];
        let (len, fds) = b.recv(&mut buf).expect("recv").expect("message");
        assert_eq!((&buf[..len], fds.len()), (&b"one"[..], 0));
        let (len, mut fds) = b.recv(&mut buf).expect("recv").expect("message");
        assert_eq!(&buf[..len], b"two!");
        let mut got = std::fs::File::from(fds.pop().expect("a descriptor"));
        let mut text = String::new();
        got.rewind().expect("rewind");
        got.read_to_string(&mut text).expect("read");
        assert_eq!(text, "hello");
        file.flush().expect("flush");
        assert!(a.send(&vec![0; MAX_MESSAGE_BYTES + 1], &[]).is_err());
        drop(a);
        assert!(b.recv(&mut buf).expect("recv").is_none());
    }

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        // SAFETY: a fresh anonymous file; the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"rgpu-link-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor owned by nothing else.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(bytes).expect("write");
        file
    }
}

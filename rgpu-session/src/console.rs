//! Console output of the GPU driver: what a kernel's device `printf` prints.
//!
//! NVIDIA's driver prints a context's printf buffer on the stdout of the
//! process that owns the context (the daemon's connection process) at
//! synchronisation points, from inside the synchronising call. A connection
//! process therefore turns its fd 1 into a pipe ([`capture_stdout`]); after
//! each command that may have synchronised, the session worker collects what
//! arrived ([`collect`]) and sends it to the guest with the next reply
//! (rgpu_proto::channel, `REPLY_OFFSET_CONSOLE_LEN`).
//!
//! A reader thread keeps the pipe empty so that the driver never blocks on a
//! full pipe while a worker waits inside the synchronising call; every read,
//! the thread's and the workers', happens under one lock, so the bytes keep
//! their order.
//!
//! Attribution: the bytes go to the session whose command was running when
//! they were printed. Several sessions of one connection (processes of one
//! VM) that synchronise at the same time may receive each other's output,
//! and output printed outside any command goes to the next session that
//! collects. Both are bounded ([`MAX_PENDING`]); the excess is dropped,
//! counted and logged.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Most console bytes held for one session, and in the process-wide buffer
/// (the driver's default printf FIFO is 1 MiB).
pub const MAX_PENDING: usize = 1 << 20;

struct Console {
    /// The pipe's read end, non-blocking.
    read_end: OwnedFd,
    /// Bytes read but not yet collected by a session.
    buffer: Mutex<Vec<u8>>,
    dropped: AtomicU64,
}

static CONSOLE: OnceLock<Console> = OnceLock::new();

extern "C" {
    /// glibc's C stdio `stdout` stream.
    static mut stdout: *mut libc::FILE;
}

/// Appends `bytes` to `out`, keeping at most [`MAX_PENDING`] bytes; returns
/// how many were dropped.
pub fn append_bounded(out: &mut Vec<u8>, bytes: &[u8]) -> usize {
    let room = MAX_PENDING.saturating_sub(out.len());
    let kept = bytes.len().min(room);
    out.extend_from_slice(bytes.get(..kept).unwrap_or_default());
    bytes.len() - kept
}

impl Console {
    /// Moves what the pipe holds now into `buffer` (the caller holds its
    /// lock).
    fn read_pipe(&self, buffer: &mut Vec<u8>) {
        let mut chunk = [0u8; 16384];
        loop {
            // SAFETY: `chunk` is writable for its length; the fd is ours.
            let n = unsafe {
                libc::read(
                    self.read_end.as_raw_fd(),
                    chunk.as_mut_ptr().cast(),
                    chunk.len(),
                )
            };
            if n > 0 {
                let got = chunk.get(..n as usize).unwrap_or_default();
                self.count_dropped(append_bounded(buffer, got));
                continue;
            }
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // 0: no writer left; -1 EAGAIN: empty for now.
            return;
        }
    }

    fn count_dropped(&self, dropped: usize) {
        if dropped > 0 {
            let total = self.dropped.fetch_add(dropped as u64, Ordering::Relaxed) + dropped as u64;
            log::warn!(
                "console: {dropped} bytes of GPU printf output dropped (more than {MAX_PENDING} \
                 bytes waiting; {total} dropped in all)"
            );
        }
    }

    /// The reader thread: waits for data, then reads it under the lock.
    fn pump(&self) {
        loop {
            let mut poll = libc::pollfd {
                fd: self.read_end.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, -1) };
            if ready < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("console: poll failed: {}", io::Error::last_os_error());
                return;
            }
            if poll.revents & libc::POLLIN != 0 {
                let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
                self.read_pipe(&mut buffer);
            } else if poll.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                return;
            }
        }
    }
}

/// Turns this process's fd 1 into a pipe that [`collect`] reads. Called once,
/// at start-up of a connection process, before any thread writes to stdout.
pub fn capture_stdout() -> io::Result<()> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_fd, write_fd] = fds;
    // SAFETY: both descriptors were just created and are owned here.
    let (read_end, write_end) = unsafe {
        (
            OwnedFd::from_raw_fd(read_fd),
            OwnedFd::from_raw_fd(write_fd),
        )
    };
    // SAFETY: plain fcntl on our own descriptor.
    if unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Whatever is buffered for the old stdout goes there first.
    // SAFETY: fflush(NULL) flushes every C stdio output stream.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    // SAFETY: dup2 onto fd 1; `write_end` stays valid for the call.
    if unsafe { libc::dup2(write_end.as_raw_fd(), libc::STDOUT_FILENO) } < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(write_end);
    // The driver may print through C stdio, which fully buffers a pipe:
    // unbuffered, every byte reaches the pipe inside the printing call.
    // SAFETY: glibc's `stdout` stream, valid for the process's lifetime;
    // setvbuf before any output through it since the dup2.
    unsafe { libc::setvbuf(stdout, std::ptr::null_mut(), libc::_IONBF, 0) };
    let console = Console {
        read_end,
        buffer: Mutex::new(Vec::new()),
        dropped: AtomicU64::new(0),
    };
    if CONSOLE.set(console).is_err() {
        return Err(io::Error::other("stdout is captured already"));
    }
    std::thread::Builder::new()
        .name("rgpu-console".into())
        .spawn(|| {
            if let Some(console) = CONSOLE.get() {
                console.pump();
            }
        })?;
    Ok(())
}

/// Moves the console output printed so far into `pending` (bounded by
/// [`MAX_PENDING`]). Does nothing in a process whose stdout is not captured.
pub fn collect(pending: &mut Vec<u8>) {
    let Some(console) = CONSOLE.get() else {
        return;
    };
    let mut buffer = console.buffer.lock().unwrap_or_else(|e| e.into_inner());
    console.read_pipe(&mut buffer);
    if buffer.is_empty() {
        return;
    }
    let dropped = append_bounded(pending, &buffer);
    buffer.clear();
    console.count_dropped(dropped);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_is_bounded() {
        let mut out = vec![0u8; MAX_PENDING - 3];
        assert_eq!(append_bounded(&mut out, b"abcdef"), 3);
        assert_eq!(out.len(), MAX_PENDING);
        assert_eq!(out.get(MAX_PENDING - 3..), Some(&b"abc"[..]));
        assert_eq!(append_bounded(&mut out, b"x"), 1);
    }

    #[test]
    fn collect_without_capture_is_a_no_op() {
        let mut pending = Vec::new();
        collect(&mut pending);
        assert!(pending.is_empty());
    }
}

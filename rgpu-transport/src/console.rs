//! The host driver's console output (device `printf`) arriving with replies
//! (rgpu_proto::channel, `REPLY_OFFSET_CONSOLE_LEN`): written to the
//! application's stdout before the call that synchronised returns, as
//! NVIDIA's driver prints it there natively.

use std::io;

/// Writes `bytes` to fd 1. The application's own C stdio output is flushed
/// first, so the device text lands after what the program printed before
/// the synchronisation (natively both go through the same stdio buffer).
/// Errors (a closed stdout) are ignored, as the driver ignores them.
pub fn write_stdout(bytes: &[u8]) {
    // SAFETY: fflush(NULL) flushes every C stdio output stream.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is readable for its length.
        let n = unsafe { libc::write(libc::STDOUT_FILENO, rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            rest = rest.get(n as usize..).unwrap_or_default();
        } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            log::debug!(
                "cannot write {} bytes of GPU console output to stdout: {}",
                rest.len(),
                io::Error::last_os_error()
            );
            return;
        }
    }
}

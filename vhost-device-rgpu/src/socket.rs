//! The daemon's listening sockets: created with restrictive permissions
//! (ARCHITECTURE.md §8) after removing a stale one, or inherited from the
//! process that started us (`--fd`, as virtiofsd does).

use std::fs;
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Mode of the vhost-user socket: the owner and its group (the VMM may run
/// as another user of the same group); nobody else.
const SOCKET_MODE: u32 = 0o660;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("another daemon is listening on {0}")]
    InUse(PathBuf),
    #[error("cannot remove the stale socket {0}: {1}")]
    RemoveStale(PathBuf, io::Error),
    #[error("cannot listen on {0}: {1}")]
    Bind(PathBuf, io::Error),
    #[error("cannot set the permissions of {0}: {1}")]
    Chmod(PathBuf, io::Error),
    #[error("file descriptor {0} is not a listening Unix socket: {1}")]
    BadFd(RawFd, io::Error),
}

/// Mode of the control socket: the daemon's user alone (a tenant's VMM,
/// in the group, must not change its own limits).
const OWNER_ONLY_MODE: u32 = 0o600;

/// Listens on `path`: a socket left behind by a daemon that died is
/// replaced; a live one or any other file is an error. The socket is created
/// with mode 0600 (no window where others could connect), then opened to the
/// group.
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    bind_with_mode(path, SOCKET_MODE)
}

/// Like [`bind`], for the daemon's user alone (mode 0600).
pub fn bind_owner_only(path: &Path) -> Result<UnixListener, SocketError> {
    bind_with_mode(path, OWNER_ONLY_MODE)
}

fn bind_with_mode(path: &Path, mode: u32) -> Result<UnixListener, SocketError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(SocketError::NotASocket(path.to_owned()))
        }
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.to_owned()));
            }
            fs::remove_file(path).map_err(|e| SocketError::RemoveStale(path.to_owned(), e))?;
        }
        Err(_) => {}
    }
    // SAFETY: umask only changes this process's file-creation mask; it is
    // restored right after the bind.
    let old = unsafe { libc::umask(0o177) };
    let listener = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = listener.map_err(|e| SocketError::Bind(path.to_owned(), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| SocketError::Chmod(path.to_owned(), e))?;
    Ok(listener)
}

/// Takes over an inherited listening socket. The caller must not use `fd`
/// otherwise afterwards.
pub fn inherit(fd: RawFd) -> Result<UnixListener, SocketError> {
    let bad = |e| SocketError::BadFd(fd, e);
    let mut accepting: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `accepting`, which
    // is a valid c_int; a bad fd only makes it fail.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut accepting as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(bad(io::Error::last_os_error()));
    }
    if accepting == 0 {
        return Err(bad(io::Error::other("not listening")));
    }
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut domain as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(bad(io::Error::last_os_error()));
    }
    if domain != libc::AF_UNIX {
        return Err(bad(io::Error::other("not a Unix socket")));
    }
    // SAFETY: fd is an open listening Unix socket (checked above) that the
    // caller hands over to us.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    // Inherited descriptors may lack close-on-exec; nothing we start needs it.
    // SAFETY: fcntl on a descriptor we now own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn bind_replaces_stale_refuses_live_and_files() {
        let dir = std::env::temp_dir().join(format!("rgpu-socket-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");

        let live = bind(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
        assert!(matches!(bind(&path), Err(SocketError::InUse(_))));
        drop(live);
        // The file stays behind: a stale socket, replaced.
        let again = bind(&path).unwrap();
        drop(again);

        fs::remove_file(&path).unwrap();
        fs::write(&path, b"x").unwrap();
        assert!(matches!(bind(&path), Err(SocketError::NotASocket(_))));
        let file = fs::File::open(&path).unwrap();
        assert!(matches!(
            inherit(file.as_raw_fd()),
            Err(SocketError::BadFd(..))
        ));

        let listener = bind(&dir.join("t")).unwrap();
        let inherited = inherit(listener.into_raw_fd()).unwrap();
        drop(inherited);

        let private = dir.join("control");
        let listener = bind_owner_only(&private).unwrap();
        let mode = fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, OWNER_ONLY_MODE);
        let inherited = inherit(listener.into_raw_fd()).unwrap();
        drop(inherited);
        fs::remove_dir_all(&dir).unwrap();
    }
}

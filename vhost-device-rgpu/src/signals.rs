//! SIGINT/SIGTERM: stop the connection processes, remove the sockets we
//! created and exit 0.
//!
//! Tenants come and go while the daemon runs (`ctl add`, `ctl remove`), so
//! the sockets to remove are a list that changes ([`CreatedFiles`]).
//!
//! The signals are blocked in every thread and taken by one thread with
//! `sigwait`, so the cleanup runs as ordinary code, not in a handler.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;

use log::info;

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; these calls only fail for invalid
    // signal numbers, and SIGINT/SIGTERM are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    set
}

/// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread
/// it starts afterwards. Call first thing in `main`.
pub fn block_termination() -> io::Result<()> {
    let set = termination_set();
    // SAFETY: `set` is a valid, initialised signal set; the old mask is not
    // asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Files this process created and removes at exit: its sockets. Clones
/// share one list.
#[derive(Debug, Clone, Default)]
pub struct CreatedFiles(Arc<Mutex<Vec<PathBuf>>>);

impl CreatedFiles {
    fn lock(&self) -> MutexGuard<'_, Vec<PathBuf>> {
        // A list of paths: nothing a panicking holder leaves half-done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `path` (a file, or a directory that only holds such paths added
    /// after it) was created: remove it at exit.
    pub fn add(&self, path: PathBuf) {
        self.lock().push(path);
    }

    /// Removes `path` now, and forgets it.
    pub fn remove(&self, path: &Path) {
        let mut paths = self.lock();
        if let Some(i) = paths.iter().position(|p| p == path) {
            paths.swap_remove(i);
            let _ = std::fs::remove_file(path);
        }
    }

    /// Removes every path created, the last first (a directory after what
    /// it holds).
    pub fn remove_all(&self) {
        for path in self.lock().drain(..).rev() {
            if std::fs::remove_file(&path).is_err() {
                let _ = std::fs::remove_dir(&path);
            }
        }
    }
}

/// Starts the thread that waits for SIGINT/SIGTERM, runs `before_exit`,
/// removes the files in `created` and exits the process with status 0.
pub fn exit_on_termination(
    created: CreatedFiles,
    before_exit: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    thread::Builder::new()
        .name("rgpu-signals".into())
        .spawn(move || {
            let set = termination_set();
            let mut signal: libc::c_int = 0;
            // SAFETY: `set` is valid and the signals are blocked (see
            // `block_termination`), as sigwait requires.
            let rc = unsafe { libc::sigwait(&set, &mut signal) };
            if rc != 0 {
                log::error!("sigwait failed: {}", io::Error::from_raw_os_error(rc));
                return;
            }
            info!("signal {signal}: exiting");
            before_exit();
            created.remove_all();
            std::process::exit(0);
        })
        .map(|_| ())
}

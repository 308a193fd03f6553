//! SIGINT/SIGTERM: stop the connection processes, remove the sockets we
//! created and exit 0.
//!
//! The signals are blocked in every thread and taken by one thread with
//! `sigwait`, so the cleanup runs as ordinary code, not in a handler.

use std::io;
use std::path::PathBuf;
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

/// Starts the thread that waits for SIGINT/SIGTERM, runs `before_exit`,
/// removes `paths` and exits the process with status 0.
pub fn exit_on_termination(
    paths: Vec<PathBuf>,
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
            for path in &paths {
                let _ = std::fs::remove_file(path);
            }
            std::process::exit(0);
        })
        .map(|_| ())
}

//! What a worker process may do (ARCHITECTURE.md §8): it runs one guest
//! process's CUDA work, so it gets no new privileges, no capabilities, and
//! resource limits. Applied between fork and exec ([`apply_in_child`]), so
//! the worker starts contained.
//!
//! The seccomp allow-list comes later, once the executor has started
//! ([`super::seccomp`]).

use std::io;

/// Resource limits of a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLimits {
    /// Open files (NVIDIA's driver opens a few per context; guest memory
    /// files and the module cache add some).
    pub open_files: u64,
    /// Core dumps: none (a worker holds guest memory).
    pub core_bytes: u64,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        Self {
            open_files: 4096,
            core_bytes: 0,
        }
    }
}

/// Highest capability number the kernel may know (CAP_LAST_CAP is 40 in
/// Linux 6.x; dropping unknown numbers fails harmlessly with EINVAL).
const CAP_LAST: libc::c_ulong = 63;

/// Runs in the forked child before exec: only async-signal-safe system
/// calls, no allocation.
///
/// # Safety
/// Call only between fork and exec.
pub unsafe fn apply_in_child(limits: WorkerLimits) -> io::Result<()> {
    // No set-uid or file-capability gains through exec, ever.
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    // Empty the bounding set (root only; EPERM elsewhere, where there is
    // nothing to drop) and the ambient set, so exec grants no capability
    // even to uid 0.
    for cap in 0..=CAP_LAST {
        libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
    }
    libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
        0,
        0,
    );
    for (resource, value) in [
        (libc::RLIMIT_NOFILE, limits.open_files),
        (libc::RLIMIT_CORE, limits.core_bytes),
    ] {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(resource, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Only ever lowered: an unprivileged daemon cannot raise a hard limit.
        let value = value.min(limit.rlim_max);
        limit.rlim_cur = value;
        limit.rlim_max = value;
        if libc::setrlimit(resource, &limit) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// How the worker is contained, as its /proc status says: no new
/// privileges, the seccomp mode, no capabilities in its effective,
/// permitted or bounding sets.
pub fn describe_self() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("?")
            .to_owned()
    };
    format!(
        "NoNewPrivs {} Seccomp {} CapEff {} CapPrm {} CapBnd {}",
        field("NoNewPrivs:"),
        field("Seccomp:"),
        field("CapEff:"),
        field("CapPrm:"),
        field("CapBnd:")
    )
}

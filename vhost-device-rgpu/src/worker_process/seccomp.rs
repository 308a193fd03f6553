//! The worker's seccomp allow-list (ARCHITECTURE.md §8): installed once the
//! executor has started (NVIDIA's driver is loaded and its devices open),
//! for every thread of the worker.
//!
//! The list is what a worker was measured to call on the GPU host (driver
//! 580.159, CUDA 13.0) while the driver-API test, nvcc-built programs, the
//! compatibility suite (cuBLAS, cuRAND, PyTorch, Triton, CuPy, a faulting
//! kernel, device printf) and the kernel watchdog ran through it
//! (tests/gpu-tools/syscall_census.c), plus what this program's own paths
//! need that a run may not reach (signal return, aborts, the link's send).
//! System calls are allowed by number; their arguments are not filtered
//! (the driver's ioctls differ between driver versions). Anything else
//! ends the worker, which ends only its guest process's contexts: the
//! daemon logs the signal (SIGSYS) it died of.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// What a worker does about system calls outside the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SeccompMode {
    /// End the worker.
    Enforce,
    /// Allow, and have the kernel log the call (audit log).
    Log,
    /// No filter.
    Off,
}

impl SeccompMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Log => "log",
            Self::Off => "off",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("cannot build the seccomp filter: {0}")]
    Build(seccompiler::BackendError),
    #[error("cannot install the seccomp filter: {0}")]
    Install(seccompiler::Error),
    #[error("no seccomp allow-list for this architecture")]
    Architecture,
}

/// The allowed system calls (x86_64).
#[cfg(target_arch = "x86_64")]
const ALLOWED: &[libc::c_long] = &[
    // Files and memory.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_close,
    libc::SYS_stat,
    libc::SYS_fstat,
    libc::SYS_lstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_openat,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_getcwd,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_ftruncate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_ioctl,
    libc::SYS_pipe2,
    libc::SYS_eventfd2,
    libc::SYS_memfd_create,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_mbind,
    libc::SYS_membarrier,
    // The driver's JIT cache (~/.nv/ComputeCache).
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_symlink,
    libc::SYS_utimensat,
    // Waiting and polling.
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_futex,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_sched_yield,
    libc::SYS_restart_syscall,
    // Sockets: the link to the connection process, and the driver's own
    // (it connects to local sockets of NVIDIA's services).
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept4,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_shutdown,
    // Threads, signals, process.
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_tid_address,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_arch_prctl,
    libc::SYS_prctl,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_getrusage,
    libc::SYS_prlimit64,
    libc::SYS_getrandom,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_tkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Installs the allow-list for every thread of this process.
pub fn install(mode: SeccompMode) -> Result<(), SeccompError> {
    let action = match mode {
        SeccompMode::Off => return Ok(()),
        SeccompMode::Enforce => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
    };
    let program = program(action)?;
    seccompiler::apply_filter_all_threads(&program).map_err(SeccompError::Install)
}

fn program(mismatch: SeccompAction) -> Result<BpfProgram, SeccompError> {
    #[cfg(target_arch = "x86_64")]
    {
        let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
            ALLOWED.iter().map(|call| (*call, Vec::new())).collect();
        let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
            .map_err(SeccompError::Build)?;
        filter.try_into().map_err(SeccompError::Build)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = mismatch;
        Err(SeccompError::Architecture)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_compiles_and_leaves_out_what_a_worker_never_needs() {
        let program = program(SeccompAction::KillProcess).expect("a BPF program");
        assert!(program.len() > ALLOWED.len());
        for forbidden in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_kill,
            libc::SYS_mount,
            libc::SYS_setuid,
            libc::SYS_bpf,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_init_module,
            libc::SYS_kexec_load,
            libc::SYS_keyctl,
        ] {
            assert!(!ALLOWED.contains(&forbidden), "{forbidden} is allowed");
        }
    }

    /// A process under the filter that calls something off the list dies of
    /// SIGSYS; one that stays on it lives.
    #[test]
    fn a_call_off_the_list_ends_the_process() {
        let program = program(SeccompAction::KillProcess).expect("a BPF program");
        let run = |forbidden: bool| {
            // SAFETY: the child makes only system calls (prctl, seccomp,
            // getppid, execve, _exit) before it ends; it touches no lock
            // another thread of the test harness may hold.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // SAFETY: in the child, as above.
                unsafe {
                    libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                    if seccompiler::apply_filter(&program).is_err() {
                        libc::_exit(3);
                    }
                    if forbidden {
                        let path = c"/bin/true";
                        let argv = [path.as_ptr(), std::ptr::null()];
                        libc::execve(path.as_ptr(), argv.as_ptr(), std::ptr::null());
                    }
                    libc::getppid();
                    libc::_exit(0);
                }
            }
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            status
        };
        let status = run(true);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "status {status:#x}"
        );
        let status = run(false);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "status {status:#x}"
        );
    }
}

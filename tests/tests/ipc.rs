//! CUDA IPC within a tenant (issue 10), through a real daemon serving two
//! tenants with the sim executor (tests/programs/ipc_test.c).
//!
//! The sim executor cannot map another worker's memory (each worker's
//! device memory is host memory of its own process), so a handle that the
//! tenant's registry lets through fails there with
//! `CUDA_ERROR_NOT_SUPPORTED`, while one the registry refuses fails with
//! `CUDA_ERROR_INVALID_HANDLE` before any executor sees it; the daemon's
//! log says which (`rgpu_session::ipc` at debug level). Each refusal below
//! would be a NOT_SUPPORTED without the registry. The opening itself, data
//! and events crossing processes, runs on the GPU
//! (tests/gpu/run-gpu-suite.sh, "ipc_test" steps).

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use rgpu_tests::daemon::TWO_TENANTS;
use rgpu_tests::guest::GuestOutcome;
use rgpu_tests::{Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

const MEMORY_ACCEPTED: &str = "IPC Memory handle accepted by the tenant's registry";
const EVENT_ACCEPTED: &str = "IPC Event handle accepted by the tenant's registry";
const MEMORY_REFUSED: &str = "IPC Memory handle refused: no process of this tenant exported it";
const EVENT_REFUSED: &str = "IPC Event handle refused: no process of this tenant exported it";

struct Ipc {
    guest: GuestLib,
    program: std::path::PathBuf,
    daemon: Daemon,
}

impl Ipc {
    fn new() -> Self {
        let guest = GuestLib::new();
        let program = guest.build_program("ipc_test.c");
        let daemon = Daemon::start_with_config(
            "sim",
            TWO_TENANTS,
            &[],
            &[("RGPU_LOG", "info,rgpu_session::ipc=debug")],
        );
        Self {
            guest,
            program,
            daemon,
        }
    }

    fn alpha(&self) -> std::path::PathBuf {
        self.daemon.socket().to_owned()
    }

    fn beta(&self) -> std::path::PathBuf {
        self.daemon.dir().join("beta.sock")
    }

    /// A folder for one exporter's handles.
    fn handles(&self, name: &str) -> std::path::PathBuf {
        let dir = self.daemon.dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn spawn(&self, socket: &Path, mode: &str, dir: &Path, args: &[&str]) -> GuestProcess {
        let mut command = self.guest.command(&self.program, &self.daemon);
        command
            .env("RGPU_SOCKET", socket)
            .arg(mode)
            .arg(dir)
            .args(args);
        GuestProcess::spawn(command)
    }

    /// An exporter of `dir`'s handles on `socket`, once it exported them.
    fn exporter(&self, socket: &Path, dir: &Path) -> GuestProcess {
        let mut exporter = self.spawn(socket, "export", dir, &[]);
        exporter.wait_for_line("exported", RUN_TIMEOUT);
        exporter
    }

    /// Opens `dir`'s handles on `socket`; the program checks `expect`.
    fn open(&self, socket: &Path, dir: &Path, expect: &str, args: &[&str]) -> GuestOutcome {
        let mut all = vec!["--expect", expect];
        all.extend_from_slice(args);
        let outcome = self.spawn(socket, "open", dir, &all).finish(RUN_TIMEOUT);
        assert!(
            outcome.passed("ipc_test"),
            "open {} on {} expecting {expect} {args:?} failed ({}):\n{}\n{}\ndaemon log:\n{}",
            dir.display(),
            socket.display(),
            outcome.status,
            outcome.stdout,
            outcome.stderr,
            self.daemon.log()
        );
        outcome
    }

    /// How many lines of the daemon's log say `what`.
    fn logged(&self, what: &str) -> usize {
        self.daemon
            .log()
            .lines()
            .filter(|line| line.contains(what))
            .count()
    }
}

fn has_line(stdout: &str, line: &str) -> bool {
    stdout.lines().any(|l| l == line)
}

/// A process of the exporter's tenant gets both handles past the registry;
/// one of another tenant, a forged handle, and the handles of freed memory
/// and a destroyed event are refused before the executor sees them.
#[test]
fn handles_open_only_in_their_tenant_and_only_while_their_objects_live() {
    let ipc = Ipc::new();
    let (alpha, beta) = (ipc.alpha(), ipc.beta());
    let dir = ipc.handles("a");
    let mut exporter = ipc.exporter(&alpha, &dir);

    // Same tenant: accepted by the registry, then the fixture's NOT_SUPPORTED.
    let same = ipc.open(&alpha, &dir, "unsupported", &[]);
    assert!(
        has_line(&same.stdout, "open memory: rc 801 CUDA_ERROR_NOT_SUPPORTED")
            && has_line(&same.stdout, "open event: rc 801 CUDA_ERROR_NOT_SUPPORTED"),
        "{}",
        same.stdout
    );
    assert_eq!(ipc.logged(MEMORY_ACCEPTED), 1, "{}", ipc.daemon.log());
    assert_eq!(ipc.logged(EVENT_ACCEPTED), 1, "{}", ipc.daemon.log());

    // Another tenant, with the very same bytes: refused.
    let other = ipc.open(&beta, &dir, "refused", &[]);
    assert!(
        has_line(
            &other.stdout,
            "open memory: rc 400 CUDA_ERROR_INVALID_HANDLE"
        ) && has_line(
            &other.stdout,
            "open event: rc 400 CUDA_ERROR_INVALID_HANDLE"
        ),
        "{}",
        other.stdout
    );
    // Forged in the exporter's own tenant: one byte changed (at either
    // end and inside), or random bytes.
    for flip in ["0", "37", "63"] {
        ipc.open(&alpha, &dir, "refused", &["--flip", flip]);
    }
    ipc.open(&alpha, &dir, "refused", &["--random"]);
    assert_eq!(ipc.logged(MEMORY_REFUSED), 5, "{}", ipc.daemon.log());
    assert_eq!(ipc.logged(EVENT_REFUSED), 5, "{}", ipc.daemon.log());
    assert_eq!(
        ipc.logged(MEMORY_ACCEPTED),
        1,
        "a refusal reached the executor"
    );

    // The exporter frees its memory and destroys its event: the same
    // bytes, which opened a moment ago, are refused now.
    std::fs::write(dir.join("free"), b"").unwrap();
    exporter.wait_for_line("freed", RUN_TIMEOUT);
    ipc.open(&alpha, &dir, "refused", &[]);
    assert_eq!(ipc.logged(MEMORY_REFUSED), 6);
    assert_eq!(ipc.logged(EVENT_REFUSED), 6);
    std::fs::write(dir.join("exit"), b"").unwrap();
    exporter.finish(RUN_TIMEOUT).assert_passed("ipc_test");
}

/// An exporter killed without freeing anything: its handles go with it
/// (whoever tears down its worker withdraws them).
#[test]
fn a_killed_exporters_handles_go_with_it() {
    let ipc = Ipc::new();
    let alpha = ipc.alpha();
    let dir = ipc.handles("killed");
    let mut exporter = ipc.exporter(&alpha, &dir);
    ipc.open(&alpha, &dir, "unsupported", &[]);
    exporter.kill();
    ipc.daemon
        .wait_for_stats(ACCOUNTING_TIMEOUT, "the exporter gone", |s| {
            s.get("sessions_active") == 0 && s.get("device_memory_bytes") == 0
        });
    ipc.open(&alpha, &dir, "refused", &[]);
    assert_eq!(ipc.logged(MEMORY_ACCEPTED), 1, "{}", ipc.daemon.log());
    assert_eq!(ipc.logged(MEMORY_REFUSED), 1, "{}", ipc.daemon.log());
}

//! Shareable handles of the virtual-memory API within a tenant (issue 10),
//! through a real daemon serving two tenants with the sim executor
//! (tests/programs/shareable_test.c): a process exports a physical
//! allocation as a file descriptor, a child process imports it, maps it,
//! reads what the parent wrote and writes what the parent reads back (the
//! sim's physical memory is a memfd, so the data crosses processes as on a
//! GPU). A forged descriptor, an altered token, the true descriptor in
//! another tenant, and the descriptor after its exporter released the
//! allocation are refused.
//!
//! Shared memory counts against the tenant's memory limit once, for as
//! long as anyone holds it (tests/programs/shared_limit_test.c): otherwise
//! a tenant could allocate, share, free and allocate again past its limit.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::daemon::TWO_TENANTS;
use rgpu_tests::{Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

const REFUSED: &str = "shareable handle refused: no process of this tenant exported it";

#[test]
fn a_descriptor_imports_in_its_tenant_only_while_its_exporter_holds_it() {
    let guest = GuestLib::new();
    let program = guest.build_program("shareable_test.c");
    let daemon = Daemon::start_with_config("sim", TWO_TENANTS, &[], &[("RGPU_LOG", "info")]);
    let beta = daemon.dir().join("beta.sock");
    let mut command = guest.command(&program, &daemon);
    command.arg("--other-socket").arg(&beta);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    assert!(
        outcome.passed("shareable_test"),
        "shareable_test failed ({}):\n{}\n{}\ndaemon log:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    // The child that mapped the memory, then the refusals: an altered
    // token, another tenant, a released allocation (the random descriptor
    // is refused in the guest: it is not rgpu's).
    let children = |what: &str| {
        outcome
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!("shareable_test child ({what}):")))
            .count()
    };
    assert_eq!(
        (children("mapped"), children("refused")),
        (1, 4),
        "{}",
        outcome.stdout
    );
    let refused = daemon.log().lines().filter(|l| l.contains(REFUSED)).count();
    assert_eq!(refused, 3, "{}", daemon.log());
    // Everything imported and exported is back.
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "everything freed", |s| {
        s.get("sessions_active") == 0 && s.get("device_memory_bytes") == 0
    });
}

#[test]
fn imports_count_against_the_limit_after_their_exporter_freed_them() {
    let guest = GuestLib::new();
    let program = guest.build_program("shared_limit_test.c");
    // Four rounds of 24 MiB under a 64 MiB limit: the child would hold 96
    // MiB if imports were free once their exporter let go (it did before
    // the fix).
    let daemon = Daemon::start_with("sim", &["--memory-limit", "64MiB"], &[]);
    let mut command = guest.command(&program, &daemon);
    command.args([
        "--via",
        "shareable",
        "--mib",
        "24",
        "--rounds",
        "4",
        "--limit-mib",
        "64",
    ]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    assert!(
        outcome.passed("shared_limit_test"),
        "shared_limit_test failed ({}):\n{}\n{}\ndaemon log:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    // Charged once: to the parent while it holds it, to the tenant's
    // ledger once only the child does. Two rounds fit; the third
    // allocation passes the limit.
    let rounds: Vec<&str> = outcome
        .stdout
        .lines()
        .filter(|l| l.starts_with("round "))
        .collect();
    assert_eq!(
        rounds,
        [
            "round 1: the child held; it holds 24 MiB",
            "round 2: the child held; it holds 48 MiB",
            "round 3: the child holds 48 MiB; 24 MiB more: 2 (CUDA_ERROR_OUT_OF_MEMORY)",
            "round 4: the child holds 48 MiB; 24 MiB more: 2 (CUDA_ERROR_OUT_OF_MEMORY)",
        ],
        "{}",
        outcome.stdout
    );
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "everything freed", |s| {
        s.get("sessions_active") == 0 && s.get("device_memory_bytes") == 0
    });
}

//! One process per connection: a tenant whose kernel faults breaks only its
//! own process. NVIDIA's driver makes such a fault fatal for the whole
//! process (every later context creation fails); the sim executor imitates
//! that when RGPU_SIM_FAULT_POISONS_PROCESS=1 and a kernel named
//! `rgpu_fault` is launched.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

#[test]
fn a_faulting_tenant_breaks_only_its_own_process() {
    let guest = GuestLib::new();
    let fault_test = guest.build_program("fault_test.c");
    let driver_test = guest.build_program("driver_api_test.c");
    let mut daemon = Daemon::start_with_env("sim", &[("RGPU_SIM_FAULT_POISONS_PROCESS", "1")]);
    let stop_file = daemon.dir().join("stop");
    let run_driver_test = |who: &str| {
        let mut command = guest.command(&driver_test, &daemon);
        command
            .arg("--ptx")
            .arg(reference_ptx())
            .args(["--big-mb", "4"]);
        GuestProcess::spawn(command)
            .finish(RUN_TIMEOUT)
            .assert_checks_passed(who);
    };

    // The faulting tenant: its process is poisoned, and it stays connected.
    let mut command = guest.command(&fault_test, &daemon);
    command
        .arg("--ptx")
        .arg(reference_ptx())
        .arg("--stop-file")
        .arg(&stop_file);
    let mut faulty = GuestProcess::spawn(command);
    faulty.wait_for_line("poisoned", RUN_TIMEOUT);
    let during = daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "the faulting tenant", |s| {
        s.get("connections_active") == 1 && s.get("command_errors") > 0
    });

    // Another tenant, while the poisoned process still serves the first.
    run_driver_test("driver_api_test beside a poisoned tenant");
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "the second tenant gone", |s| {
        s.get("connections_active") == 1 && s.get("connections_total") == 2
    });

    // The faulting tenant ends: its process with it; what it counted stays.
    std::fs::write(&stop_file, b"stop").expect("create the stop file");
    let outcome = faulty.finish(RUN_TIMEOUT);
    assert!(
        outcome.passed("fault_test"),
        "fault_test failed ({}):\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    let after = daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert_eq!(after.get("device_memory_bytes"), 0, "{after:?}");
    assert!(
        after.get("command_errors") >= during.get("command_errors"),
        "{during:?} -> {after:?}"
    );

    // And a newcomer still works.
    run_driver_test("driver_api_test after the poisoned tenant left");
    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
    let log = daemon.log();
    assert!(
        log.contains("rgpu_fault launched"),
        "the fault was not simulated:\n{log}"
    );
}

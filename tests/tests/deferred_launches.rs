//! Launches made late are ordered before everything after them. The cuda
//! executor hands launches to a thread of each context's own, so the
//! driver may get one after the session has moved on; the session fences
//! (waits for the launch thread) before every other command. The sim
//! executor holds launches back until a fence with
//! `RGPU_SIM_DEFER_LAUNCHES=1`, so a command the session ran without
//! fencing would see the kernels before it not yet run: copies would read
//! stale memory, events and queries would be early, printf would be
//! missing. These programs check all of that, as they do without it.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn launches_made_late_come_before_every_later_command() {
    let guest = GuestLib::new();
    let mut daemon = Daemon::start_with_env("sim", &[("RGPU_SIM_DEFER_LAUNCHES", "1")]);
    let ptx = reference_ptx();

    let driver_api = guest.build_program("driver_api_test.c");
    let mut command = guest.command(&driver_api, &daemon);
    command.arg("--ptx").arg(&ptx);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test with launches held back");

    for program in ["graph_api_test", "query_test"] {
        let built = guest.build_c(
            &rgpu_tests::programs_dir().join(format!("{program}.c")),
            &["-lcuda", "-lpthread"],
        );
        let mut command = guest.command(&built, &daemon);
        command.arg("--ptx").arg(&ptx);
        GuestProcess::spawn(command)
            .finish(RUN_TIMEOUT)
            .assert_passed(program);
    }

    // Device printf comes at the synchronisation after the kernel.
    let printf = guest.build_program("printf_test.c");
    let mut command = guest.command(&printf, &daemon);
    command.arg(&ptx).arg("4242");
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    let lines: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "printf_test: before the launch",
            "rgpu_printf 4242",
            "printf_test: after the synchronisation",
        ],
        "{outcome:?}"
    );
    assert!(daemon.is_alive());
}

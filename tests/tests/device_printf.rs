//! Device printf through a sim daemon: the driver prints a kernel's printf
//! output on the stdout of the process that owns the context (the daemon's
//! connection process); rgpu must deliver it to the application's stdout at
//! the synchronisation, in order with the program's own output, and leave
//! nothing of it in the daemon's output.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn kernel_printf_reaches_the_application_stdout_in_order() {
    let guest = GuestLib::new();
    let program = guest.build_program("printf_test.c");
    let daemon = Daemon::start("sim");

    let mut command = guest.command(&program, &daemon);
    command.arg(reference_ptx()).arg("4242");
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    assert!(
        outcome.status.success(),
        "printf_test failed ({}):\nstdout:\n{}\nstderr:\n{}\ndaemon:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    let lines: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "printf_test: before the launch",
            "rgpu_printf 4242",
            "printf_test: after the synchronisation",
        ],
        "stdout:\n{}\nstderr:\n{}",
        outcome.stdout,
        outcome.stderr
    );
    let log = daemon.log();
    assert!(
        !log.contains("rgpu_printf 4242"),
        "the kernel's output reached the daemon's output:\n{log}"
    );
}

//! The kernel watchdog (`--kernel-timeout-s`): GPU work that keeps a call
//! waiting past the limit ends its guest process's worker, the waiting call
//! answers CUDA_ERROR_LAUNCH_TIMEOUT (sticky, as natively) and the context
//! is gone,
//! while other guest processes go on. Work under the limit is untouched.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

#[test]
fn a_kernel_past_the_timeout_ends_only_its_process() {
    let guest = GuestLib::new();
    let spin = guest.build_program("spin_test.c");
    let driver_test = guest.build_program("driver_api_test.c");
    let daemon = Daemon::start_with("sim", &["--kernel-timeout-s", "1"], &[]);
    let run_spin = |ms: &str| {
        let mut command = guest.command(&spin, &daemon);
        command
            .arg("--ptx")
            .arg(reference_ptx())
            .args(["--spin-ms", ms]);
        GuestProcess::spawn(command).finish(RUN_TIMEOUT)
    };

    // Under the limit: nothing happens.
    let short = run_spin("300");
    assert!(
        short.stdout.contains("spin: synchronize rc 0 CUDA_SUCCESS")
            && short.stdout.contains("after: rc 0 CUDA_SUCCESS"),
        "a kernel under the limit was cut:\n{}\ndaemon log:\n{}",
        short.stdout,
        daemon.log()
    );

    // Forever: the watchdog answers the waiting call, the context is gone.
    let started = Instant::now();
    let endless = run_spin("0");
    let took = started.elapsed();
    assert!(
        endless
            .stdout
            .contains("spin: synchronize rc 702 CUDA_ERROR_LAUNCH_TIMEOUT")
            // Sticky, as natively: the context is unusable afterwards.
            && (endless.stdout.contains("after: rc 702 CUDA_ERROR_LAUNCH_TIMEOUT")
                || endless
                    .stdout
                    .contains("after: rc 709 CUDA_ERROR_CONTEXT_IS_DESTROYED")),
        "no launch timeout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        endless.stdout,
        endless.stderr,
        daemon.log()
    );
    assert!(took < Duration::from_secs(30), "the watchdog took {took:?}");
    assert!(
        daemon.log().contains("ran past the 1s kernel timeout"),
        "{}",
        daemon.log()
    );

    // Another guest process is unaffected, and nothing is left behind.
    let mut command = guest.command(&driver_test, &daemon);
    command
        .arg("--ptx")
        .arg(reference_ptx())
        .args(["--big-mb", "4"]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test after the watchdog fired");
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "every worker gone", |s| {
        s.get("workers_active") == 0 && s.get("sessions_active") == 0
    });
}

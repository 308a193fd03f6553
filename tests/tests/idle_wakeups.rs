//! A call that finds its session's host thread asleep (ARCHITECTURE 7.9):
//! in local mode guest-lib wakes it through the channel's wake word, a
//! futex in the channel blob, which the guest process and its worker
//! process map from one memory file; with `RGPU_WAKE_WORD=0` (as for a
//! guest in a VM) through a doorbell on the device's queue, which passes
//! the connection process and the worker's serving thread first. The
//! daemon's counters say which way each sleeping session was woken.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{programs_dir, reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
/// idle_calls_test's calls, each after 2 ms idle (the host spins 50 us).
const CALLS: u64 = 20;

#[test]
fn a_local_guest_wakes_its_sleeping_session_through_the_wake_word() {
    let guest = GuestLib::new();
    let program = guest.build_c(&programs_dir().join("idle_calls_test.c"), &["-lcuda"]);
    for wake_word in [true, false] {
        let daemon = Daemon::start("sim");
        let mut command = guest.command(&program, &daemon);
        command
            .arg("--ptx")
            .arg(reference_ptx())
            .arg("--calls")
            .arg(CALLS.to_string());
        if !wake_word {
            command.env("RGPU_WAKE_WORD", "0");
        }
        let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
        outcome.assert_passed("idle_calls_test");
        let stats = daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
        // Each call after a gap finds the session asleep; a loaded machine
        // may delay a call into the next, hence half.
        if wake_word {
            assert!(stats.get("wake_word_wakeups") >= CALLS / 2, "{stats:?}");
        } else {
            assert_eq!(stats.get("wake_word_wakeups"), 0, "{stats:?}");
            assert!(stats.get("doorbell_wakeups") >= CALLS / 2, "{stats:?}");
        }
        assert_eq!(stats.get("command_errors"), 0, "{stats:?}");
    }
}

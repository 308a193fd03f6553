//! Queries that never wait (issue 9): cuEventQuery and cuStreamQuery are
//! answered from the completion table the host publishes, so they return
//! NOT_READY at once behind queued launches of a slow kernel and while
//! another thread of the process waits in a synchronize, and SUCCESS once
//! the work is done (tests/programs/query_test.c checks every answer and
//! its time). Before the table, each of those queries waited in the ring
//! behind the queued commands or the other thread's synchronize.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

#[test]
fn event_and_stream_queries_never_wait() {
    let guest = GuestLib::new();
    let program = guest.build_c(
        &rgpu_tests::programs_dir().join("query_test.c"),
        &["-lcuda", "-lpthread"],
    );
    let daemon = Daemon::start("sim");
    let mut command = guest.command(&program, &daemon);
    command.arg("--ptx").arg(reference_ptx());
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    for line in outcome.stdout.lines().filter(|l| l.starts_with("MEASURED")) {
        println!("{line}");
    }
    outcome.assert_passed("query_test");
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let stats = daemon.stats();
    assert_eq!(stats.get("command_errors"), 0, "{stats:?}");
}

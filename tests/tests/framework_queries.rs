//! The queries CuPy, Triton and PyTorch make of the driver (pointer
//! attributes, capture state, stream and context identity, occupancy,
//! function attributes, cache configuration) end to end through a sim
//! daemon: tests/programs/framework_queries_test.c checks every value.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

#[test]
fn framework_queries_answer_like_the_driver() {
    let guest = GuestLib::new();
    let program = guest.build_program("framework_queries_test.c");
    let daemon = Daemon::start("sim");
    let mut command = guest.command(&program, &daemon);
    command
        .arg("--image")
        .arg(reference_ptx())
        .arg("--require-clusters")
        .arg("--mapped-host")
        // The channel's profile counts the commands it wrote.
        .env("RGPU_PROFILE_CALLS", "1")
        .env("RGPU_LOG", "info");
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    outcome.assert_passed("framework_queries_test");
    // Setting a kernel's dynamic shared memory and reading its attributes,
    // 20 times over (PyTorch's pattern), asked the host for none of them:
    // a set no longer empties the function's cache of attributes (it took
    // three round trips a round before).
    let attribute_round_trips = commands_written(&outcome.stderr, "FuncGetAttribute");
    assert!(
        (1..20).contains(&attribute_round_trips),
        "{attribute_round_trips} cuFuncGetAttribute round trips\n{}",
        outcome.stderr
    );
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let stats = daemon.stats();
    // Refused attribute values were refused in the guest: nothing failed on
    // the host, and no allocation was left behind.
    assert_eq!(stats.get("command_errors"), 0, "{stats:?}");
    assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
}

/// How many `name` commands the guest library's channels wrote, by their
/// call profiles (`RGPU_PROFILE_CALLS=1`, logged as each channel closes).
fn commands_written(stderr: &str, name: &str) -> u64 {
    let entry = format!("{name} ");
    stderr
        .lines()
        .filter(|line| line.contains("call profile:"))
        .filter_map(|line| line.split("; commands: ").nth(1))
        .filter_map(|commands| commands.split(';').next())
        .flat_map(|commands| commands.split(", "))
        .filter_map(|command| command.strip_prefix(&entry)?.parse::<u64>().ok())
        .sum()
}

/// CUDA graphs by stream capture (issue 10): captured work is recorded,
/// not run; launching the instantiated graph runs it, as often as asked,
/// on any stream; host functions run in stream order, captured ones once
/// per replay (tests/programs/graph_test.c checks the values).
#[test]
fn stream_capture_records_a_graph_that_launches_replay() {
    let guest = GuestLib::new();
    let program = guest.build_program("graph_test.c");
    let daemon = Daemon::start("sim");
    let mut command = guest.command(&program, &daemon);
    command.arg("--ptx").arg(reference_ptx());
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    outcome.assert_passed("graph_test");
    // Host functions, captured ones too, went through their gates: no
    // refusal, no fallback said.
    assert!(
        !outcome.stderr.contains("not supported"),
        "{}\n{}",
        outcome.stdout,
        outcome.stderr
    );
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let stats = daemon.stats();
    // The launch of the destroyed graph failed in the guest, not on the host.
    assert_eq!(stats.get("command_errors"), 0, "{stats:?}");
    assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
}

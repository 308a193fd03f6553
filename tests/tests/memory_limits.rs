//! A tenant's memory limit (`--memory-limit`), through a real daemon with
//! the sim executor: its guests see the limit as the device's memory, all
//! of its processes together stop at it with CUDA_ERROR_OUT_OF_MEMORY, what
//! a killed process held comes back, and a tenant without a limit is not
//! held by it.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

fn has_line(stdout: &str, line: &str) -> bool {
    stdout.lines().any(|l| l == line)
}

#[test]
fn a_tenant_stops_at_its_limit_and_sees_it_as_total_memory() {
    let guest = GuestLib::new();
    let program = guest.build_program("memory_limit_test.c");
    let limited = Daemon::start_with("sim", &["--memory-limit", "256MiB"], &[]);
    let unlimited = Daemon::start("sim");
    let run = |daemon: &Daemon, args: &[&str]| {
        let mut command = guest.command(&program, daemon);
        command.args(args);
        GuestProcess::spawn(command).finish(RUN_TIMEOUT)
    };

    // Alone: 256 MiB in 16 MiB blocks, then out of memory; 256 MiB total.
    let alone = run(&limited, &[]);
    let out = &alone.stdout;
    assert!(
        has_line(out, "total MiB 256")
            && has_line(out, "info free 256 total 256")
            && has_line(out, "allocated 256 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY")
            && has_line(out, "after free: info free 256")
            && has_line(out, "again: rc 0 CUDA_SUCCESS"),
        "{out}\n{}",
        alone.stderr
    );

    // Two processes of the tenant share it: one holds 160 MiB, the other
    // gets the remaining 96.
    let hold = limited.dir().join("release");
    let mut command = guest.command(&program, &limited);
    command.args(["--max-mb", "160", "--hold-file"]).arg(&hold);
    let mut holder = GuestProcess::spawn(command);
    holder.wait_for_line("holding", RUN_TIMEOUT);
    let second = run(&limited, &[]);
    assert!(
        has_line(&second.stdout, "info free 96 total 256")
            && has_line(
                &second.stdout,
                "allocated 96 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"
            ),
        "{}",
        second.stdout
    );
    // A holder killed without freeing gives its memory back with its end.
    holder.kill();
    limited.wait_for_stats(ACCOUNTING_TIMEOUT, "the holder gone", |s| {
        s.get("sessions_active") == 0 && s.get("device_memory_bytes") == 0
    });
    let after = run(&limited, &[]);
    assert!(
        has_line(
            &after.stdout,
            "allocated 256 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"
        ),
        "the killed holder's memory did not come back:\n{}",
        after.stdout
    );

    // Another tenant, no limit: a GiB is nothing.
    let free = run(&unlimited, &[]);
    assert!(
        has_line(&free.stdout, "allocated 1024 MiB, then rc 0 CUDA_SUCCESS")
            && !has_line(&free.stdout, "total MiB 256"),
        "{}",
        free.stdout
    );
}

/// What the driver takes beside allocations counts too: a context's own
/// memory (32 MiB in this sim) and module globals (64 MiB each). Under a
/// 256 MiB limit, a fresh context leaves 224 MiB; three modules load and
/// the fourth fails with CUDA_ERROR_OUT_OF_MEMORY; an unload gives its
/// global back; allocations, plain and pitched, then stop at what is left,
/// and arrays (none in rgpu yet) take nothing
/// (tests/programs/driver_memory_test.c). When the process is gone, so is
/// every byte it was charged.
#[test]
fn context_overhead_and_module_globals_count_against_the_limit() {
    let guest = GuestLib::new();
    let program = guest.build_program("driver_memory_test.c");
    let overhead = (32u64 << 20).to_string();
    let daemon = Daemon::start_with(
        "sim",
        &["--memory-limit", "256MiB"],
        &[("RGPU_SIM_CONTEXT_OVERHEAD", &overhead)],
    );
    let mut command = guest.command(&program, &daemon);
    command.args([
        "--limit-mb",
        "256",
        "--global-mb",
        "64",
        "--overhead-mb",
        "32",
    ]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    outcome.assert_passed("driver_memory_test");
    let out = &outcome.stdout;
    assert!(
        has_line(out, "start: free 224 total 256")
            && has_line(
                out,
                "loaded 3 modules of 64 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY; free 32"
            )
            && has_line(out, "after one unload: free 96")
            && has_line(out, "allocated 224 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY")
            && has_line(out, "pitched 224 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY")
            && has_line(out, "array: rc 801 CUDA_ERROR_NOT_SUPPORTED"),
        "{out}"
    );
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert_eq!(daemon.stats().get("device_memory_bytes"), 0);
}

/// The virtual-memory API (issue 10) through a sim daemon whose tenant is
/// limited to 64 MiB: one physical allocation mapped at two addresses,
/// copies and a kernel through both, handles, access, misuse refused, and
/// cuMemCreate counted against the limit (tests/programs/vmm_test.c).
#[test]
fn virtual_memory_maps_one_allocation_twice_and_counts_against_the_limit() {
    let guest = GuestLib::new();
    let program = guest.build_program("vmm_test.c");
    let daemon = Daemon::start_with("sim", &["--memory-limit", "64MiB"], &[]);
    let mut command = guest.command(&program, &daemon);
    command
        .arg("--ptx")
        .arg(rgpu_tests::reference_ptx())
        .args(["--limit-mb", "64"]);
    let outcome = GuestProcess::spawn(command).finish(Duration::from_secs(120));
    assert!(
        outcome.passed("vmm_test"),
        "vmm_test failed ({}):\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    daemon.wait_until_idle(Duration::from_secs(15));
    let stats = daemon.stats();
    assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
}

/// Stream-ordered memory and pools (issue 10) through a sim daemon whose
/// tenant is limited to 64 MiB: pool statistics follow cuMemAllocAsync and
/// cuMemFreeAsync, created pools serve and become current, pool
/// allocations count against the limit, and a pool and its pointer are
/// exported to a child process, whose forged pointer is refused
/// (tests/programs/pool_test.c).
#[test]
fn stream_ordered_allocations_come_from_pools_and_count_against_the_limit() {
    let guest = GuestLib::new();
    let program = guest.build_program("pool_test.c");
    let daemon = Daemon::start_with("sim", &["--memory-limit", "64MiB"], &[]);
    let mut command = guest.command(&program, &daemon);
    // The sim's workers cannot map each other's memory: the child's
    // import of a pool pointer passes the registry, then is not supported.
    command.args(["--limit-mb", "64", "--pool-ipc", "not-supported"]);
    let outcome = GuestProcess::spawn(command).finish(Duration::from_secs(120));
    outcome.assert_passed("pool_test");
    let children: Vec<&str> = outcome
        .stdout
        .lines()
        .filter(|l| l.starts_with("pool_test child"))
        .collect();
    assert_eq!(
        children,
        [
            "pool_test child (not-supported): 4 checks passed, 0 failed",
            "pool_test child (refused): 4 checks passed, 0 failed",
        ],
        "{}",
        outcome.stdout
    );
    daemon.wait_until_idle(Duration::from_secs(15));
    assert_eq!(daemon.stats().get("device_memory_bytes"), 0);
}

/// Page-locked memory whose pages are too scattered for its worker to map
/// (tests/programs/pinned_limit_test.c): the worker may map 3000 page runs
/// here, the context's own blobs take about 920 of them (local blobs of
/// runs of 1-8 pages), 64 MiB would take about 3600 more. cuMemAllocHost
/// fails at once with CUDA_ERROR_OUT_OF_MEMORY (it used to succeed, and
/// the first copy failed with CUDA_ERROR_INVALID_VALUE), and 1 MiB works
/// afterwards.
#[test]
fn page_locked_memory_the_host_cannot_map_is_refused_at_allocation() {
    let guest = GuestLib::new();
    let program = guest.build_program("pinned_limit_test.c");
    let daemon = Daemon::start_with("sim", &["--max-mapped-runs", "3000"], &[]);
    let mut command = guest.command(&program, &daemon);
    command.env("RGPU_LOCAL_SCATTER_BLOBS", "1").arg("64");
    let outcome = GuestProcess::spawn(command).finish(Duration::from_secs(120));
    assert!(
        outcome.passed("pinned_limit_test"),
        "pinned_limit_test failed ({}):\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    assert!(
        outcome
            .stderr
            .contains("the host cannot map 67108864 bytes of page-locked memory"),
        "{}",
        outcome.stderr
    );
    assert!(
        daemon.log().contains("would map") && daemon.log().contains("more than 3000"),
        "{}",
        daemon.log()
    );
}

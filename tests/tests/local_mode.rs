//! Local mode end to end with the sim executor: the C driver-API test program,
//! linked against guest-lib's libcuda.so.1, runs through a real daemon.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rgpu_tests::{reference_ptx, DriverApiFixture, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
const MIB: u64 = 1024 * 1024;

/// Waits until the daemon's accounting shows `sessions` sessions and
/// `connections` connections alive.
fn wait_for_active(f: &DriverApiFixture, sessions: u64, connections: u64) {
    f.daemon.wait_for_stats(
        ACCOUNTING_TIMEOUT,
        &format!("sessions_active == {sessions} and connections_active == {connections}"),
        |s| s.get("sessions_active") == sessions && s.get("connections_active") == connections,
    );
}

#[test]
fn one_program_passes_and_frees_everything() {
    let f = DriverApiFixture::new(&[]);
    let before = f.daemon.stats();
    assert_eq!(before.executor, "sim");

    f.spawn(&[])
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test");

    f.daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let after = f.daemon.stats();
    assert_eq!(
        after.get("device_memory_bytes"),
        0,
        "device memory leaked: {after:?}"
    );
    assert!(after.get("sessions_total") > before.get("sessions_total"));
    assert!(after.get("connections_total") > before.get("connections_total"));
    assert!(after.get("commands_executed") > 0);
    // The 64 MiB pageable copy went through the ring both ways; the pinned
    // copies were DMA'd straight from guest blobs.
    assert!(after.get("staged_bytes") >= 2 * 64 * MIB, "{after:?}");
    assert!(after.get("zero_copy_bytes") > 0, "{after:?}");
}

#[test]
fn four_programs_at_once() {
    let f = DriverApiFixture::new(&[]);
    let guests: Vec<GuestProcess> = (0..4)
        .map(|_| f.spawn(&["--iterations", "2", "--big-mb", "32"]))
        .collect();
    for (i, guest) in guests.into_iter().enumerate() {
        guest
            .finish(RUN_TIMEOUT)
            .assert_checks_passed(&format!("driver_api_test #{i}"));
    }
    f.daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert!(f.daemon.stats().get("sessions_total") >= 4);
}

#[test]
fn killed_program_leaves_the_others_running_and_its_session_freed() {
    let mut f = DriverApiFixture::new(&[]);
    let stop_file = f.daemon.dir().join("stop");
    // They repeat until told to stop, so that the accounting below sees
    // exactly the survivors.
    let mut guests: Vec<GuestProcess> = (0..4).map(|_| f.spawn_until_stopped(&stop_file)).collect();
    for guest in guests.iter_mut() {
        guest.wait_for_line("running", RUN_TIMEOUT);
    }
    // One CUDA context (the primary one) per process: one session each.
    wait_for_active(&f, 4, 4);

    let mut victim = guests.remove(1);
    victim.kill();
    wait_for_active(&f, 3, 3);
    assert!(f.daemon.is_alive(), "the daemon died:\n{}", f.daemon.log());

    std::fs::write(&stop_file, b"stop").expect("create the stop file");
    for (i, guest) in guests.into_iter().enumerate() {
        guest
            .finish(RUN_TIMEOUT)
            .assert_checks_passed(&format!("surviving driver_api_test #{i}"));
    }
    f.daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let stats = f.daemon.stats();
    assert_eq!(
        stats.get("device_memory_bytes"),
        0,
        "device memory leaked: {stats:?}"
    );

    // The daemon still serves a newcomer.
    f.spawn(&["--big-mb", "4"])
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test after the kill");
    assert!(f.daemon.is_alive());
}

/// The first two CPUs this process may run on.
fn two_allowed_cpus() -> Option<(usize, usize)> {
    // SAFETY: an all-zero cpu_set_t is the empty set (plain data).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; `set` is valid for writes of its size.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return None;
    }
    // SAFETY: reads bits of the set, below CPU_SETSIZE.
    let mut allowed =
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((allowed.next()?, allowed.next()?))
}

/// The benchmark program works through rgpu (tiny counts: on CI it only
/// proves the program runs; figures are taken on the GPU host). rgpu's
/// library stands in for the native one too, so that the runs taken in
/// turn run, the second side's from the calling thread and from a thread
/// of its own, and (on a machine of two CPUs or more) with the driver's
/// side pinned to one CPU and rgpu's caller to another.
#[test]
fn benchmark_runs_through_sim() {
    let f = DriverApiFixture::new(&[]);
    let bench = f.guest.build_c(
        &rgpu_tests::workspace_root().join("tests/bench/rgpu_bench.c"),
        &["-ldl"],
    );
    let mut runs: Vec<(&str, Vec<String>, String)> = vec![
        ("caller", vec![], "runs in turn (native/rgpu, 1/s):".into()),
        (
            "thread",
            vec![],
            "runs in turn (native/rgpu from a second thread, 1/s):".into(),
        ),
    ];
    if let Some((driver, caller)) = two_allowed_cpus() {
        runs.push((
            "thread",
            vec![
                "--driver-cpu".into(),
                driver.to_string(),
                "--caller-cpu".into(),
                caller.to_string(),
            ],
            format!(
                "runs in turn (native/rgpu from a second thread, driver on CPU {driver}, \
                 rgpu caller on {caller}, 1/s):"
            ),
        ));
    }
    for (launcher, pinning, in_turn) in runs {
        let mut command = f.guest.command(&bench, &f.daemon);
        command
            .arg("--native")
            .arg(f.guest.lib_dir().join("libcuda.so.1"))
            .arg("--rgpu")
            .arg(f.guest.lib_dir().join("libcuda.so.1"))
            .arg("--ptx")
            .arg(reference_ptx())
            .args([
                "--sync-iters",
                "200",
                "--launches",
                "2000",
                "--mib",
                "4",
                "--repeats",
                "2",
                "--rgpu-side-launcher",
                launcher,
            ])
            .args(&pinning);
        let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
        // The launch after idle measured on both sides: figures, not "-".
        let idle_row_measured = outcome.stdout.lines().any(|line| {
            line.strip_prefix("launch + sync after 1 ms idle (us)")
                .is_some_and(|figures| {
                    figures
                        .split_whitespace()
                        .take(3)
                        .all(|figure| figure.parse::<f64>().is_ok())
                })
        });
        assert!(
            outcome.status.success()
                && outcome.stdout.contains("HtoD from pinned (GB/s)")
                && idle_row_measured
                && outcome.stdout.contains(&in_turn),
            "rgpu_bench --rgpu-side-launcher {launcher} failed ({}):\n{}\n{}",
            outcome.status,
            outcome.stdout,
            outcome.stderr
        );
    }
}

/// Blobs made of short page runs in shuffled order, as a VM that has run
/// for a while hands them out (`RGPU_LOCAL_SCATTER_BLOBS=1`: the channel,
/// pinned buffers, everything from 64 KiB up): every copy through the
/// ring, the bounce area and pinned memory still moves the right bytes
/// (the daemon maps each blob's runs contiguously, so one DMA serves a
/// copy whatever the layout). On the GPU host the same knob gives the
/// benchmark's scattered-blob rows.
#[test]
fn scattered_blobs_copy_the_right_bytes() {
    let f = DriverApiFixture::new(&[]);
    let mut command = f.guest.command(&f.program, &f.daemon);
    command
        .env("RGPU_LOCAL_SCATTER_BLOBS", "1")
        .arg("--ptx")
        .arg(reference_ptx())
        .args(["--big-mb", "16", "--bulk-pinned-mb", "64"]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    outcome.assert_checks_passed("driver_api_test with scattered blobs");
    assert!(
        outcome
            .stdout
            .contains("bulk: 64 MiB host-to-device from pinned memory, checked on the device"),
        "{}",
        outcome.stdout
    );
    f.daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert_eq!(f.daemon.stats().get("device_memory_bytes"), 0);
}

/// A kernel the sim executor cannot run: the application is told why,
/// with the device output of its next synchronisation (issue 12), not
/// only the daemon's log.
#[test]
fn the_sim_tells_the_application_which_kernel_it_cannot_run() {
    let f = DriverApiFixture::new(&[]);
    let program = f.guest.build_c(
        &rgpu_tests::workspace_root().join("tests/bench/share_tenant.c"),
        &["-lcuda"],
    );
    let mut command = f.guest.command(&program, &f.daemon);
    // Calibration launches rgpu_fixed_work, which the sim does not have.
    command
        .arg("--ptx")
        .arg(reference_ptx())
        .args(["calibrate", "1"]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    assert!(
        outcome.stdout.contains(
            "rgpu sim executor: kernel rgpu_fixed_work did not run: this test fixture runs only \
             its reference kernels"
        ),
        "{}{}",
        outcome.stdout,
        outcome.stderr
    );
}

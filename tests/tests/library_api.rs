//! The CUDA 12+ library/kernel API (cuLibrary*, cuKernel*, a CUkernel
//! launched as a CUfunction, cuLaunchKernelEx, __device__ variables through
//! cuLibraryGetGlobal) end to end through a sim daemon, and the daemon's
//! module cache: an image crosses from the guest once, later loads in any
//! context or process come from the cache.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

fn run_program(guest: &GuestLib, program: &Path, daemon: &Daemon, image: &Path, args: &[&str]) {
    let mut command = guest.command(program, daemon);
    command
        .arg("--image")
        .arg(image)
        .arg("--check-stale-handles")
        .args(args);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    outcome.assert_passed("library_api_test");
}

#[test]
fn library_api_runs_and_images_cross_once() {
    let guest = GuestLib::new();
    let program = guest.build_program("library_api_test.c");
    let daemon = Daemon::start("sim");

    run_program(&guest, &program, &daemon, &reference_ptx(), &[]);
    // The connection's end makes its counts final (a live one publishes
    // its workers' counts a moment late).
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    // One image, loaded in the primary context, in a second context, and by
    // a second library from the file: sent once, then served by hash.
    let first = daemon.stats();
    assert!(first.get("module_cache_hits") >= 2, "{first:?}");
    // The program's two lookups of missing names fail; the cache miss is
    // an answer, not an error.
    assert_eq!(first.get("command_errors"), 2, "{first:?}");
    assert_eq!(first.get("device_memory_bytes"), 0, "{first:?}");

    // Another process: every load of the image is a hit now.
    let copied = first.get("host_cpu_copy_bytes");
    run_program(&guest, &program, &daemon, &reference_ptx(), &[]);
    // The connection's end makes its counts final (a live one publishes
    // its workers' counts a moment late).
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let second = daemon.stats();
    assert!(
        second.get("module_cache_hits") >= first.get("module_cache_hits") + 3,
        "{second:?}"
    );
    let image_len = std::fs::metadata(reference_ptx())
        .map(|m| m.len())
        .unwrap_or(0);
    // Replies still cost a little; the image itself did not cross again.
    assert!(
        second.get("host_cpu_copy_bytes") - copied < image_len,
        "the image was sent again: {first:?} -> {second:?}"
    );
}

/// nvcc's PTX of tests/fixtures/fatbin/kernels.cu (committed by the lead from
/// make-fixtures.sh): its __constant__ array and __device__ variable are
/// readable and writable through the sim executor.
#[test]
fn nvcc_fixture_module_globals_through_sim() {
    let image = rgpu_tests::workspace_root().join("tests/fixtures/fatbin/kernels.ptx");
    assert!(image.exists(), "{} is missing", image.display());
    let guest = GuestLib::new();
    let program = guest.build_program("library_api_test.c");
    let daemon = Daemon::start("sim");
    run_program(&guest, &program, &daemon, &image, &["--fixture"]);
}

//! VM mode end to end with the sim executor: QEMU (>= 10.2, software
//! emulation) boots the stock Debian guest kernel with the daemon attached as
//! `vhost-user-test-device-pci` through `qemu-configs/`'s command line, and
//! the stock virtio_gpu driver carries guest-lib's command stream.
//!
//! Needs `tests/vm/setup-host.sh` (tests/run.sh runs it); without its chroot
//! and QEMU these tests fail saying what is missing, never skip.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use rgpu_tests::{is_checks_passed_line, workspace_root, Daemon, Vm, VmHost};

/// Boot to the first marker (TCG boots in about 4 s).
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);
/// One guest step (the driver-API test under TCG).
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
const GUEST_MEMORY: &str = "1G";
/// The bulk copy of the issue: 256 MiB from guest pinned memory.
const BULK_BYTES: u64 = 256 << 20;

fn host() -> VmHost {
    VmHost::find().unwrap_or_else(|why| panic!("{why}"))
}

/// A daemon and a guest booted with `test_script` as its /test.sh. Field
/// order is drop order: QEMU goes before the daemon.
struct Fixture {
    vm: Vm,
    daemon: Daemon,
    started: Instant,
}

impl Fixture {
    fn boot(test_script: &Path) -> Self {
        Self::boot_with_env(test_script, &[])
    }

    /// [`Fixture::boot`] with more environment for the daemon.
    fn boot_with_env(test_script: &Path, env: &[(&str, &str)]) -> Self {
        let host = host();
        let daemon = Daemon::start_with_env("sim", env);
        let initrd = daemon.dir().join("initramfs.cpio.gz");
        host.build_initramfs(&initrd, &[(test_script, "/test.sh")]);
        let append = std::env::var("RGPU_LOG")
            .map(|level| format!("RGPU_LOG={level}"))
            .unwrap_or_default();
        let started = Instant::now();
        let vm = Vm::start(&host, &daemon, &initrd, GUEST_MEMORY, &append);
        Self {
            vm,
            daemon,
            started,
        }
    }

    /// Checks what the guest's /init printed at boot: the stock driver bound
    /// the device with CONTEXT_INIT and our capset, and the render node
    /// belongs to root:render with mode 0660.
    fn check_boot(&mut self) {
        let boot = self.vm.wait_for("RGPU-BOOT ready", BOOT_TIMEOUT);
        let has = |text: &str| boot.iter().any(|l| l.contains(text));
        let context = || format!("boot console:\n{}", self.vm.console());
        assert!(
            has("[drm] features: +context_init"),
            "no +context_init; {}",
            context()
        );
        assert!(has("+resource_blob"), "no +resource_blob; {}", context());
        assert!(
            has("[drm] cap set 0: id 23"),
            "capset 23 not offered; {}",
            context()
        );
        assert!(
            boot.iter().any(|l| l.contains("RGPU-BOOT node crw-rw----")
                && l.contains(" root ")
                && l.contains(" render ")
                && l.ends_with("/dev/dri/renderD128")),
            "no /dev/dri/renderD128 root:render 0660; {}",
            context()
        );
        eprintln!("vm_mode: booted in {:?}", self.started.elapsed());
    }

    /// Waits for the guest's "RGPU-WAIT what", runs `check` and answers "go".
    fn host_check(&mut self, what: &str, check: impl FnOnce(&Daemon)) {
        self.vm.wait_for(&format!("RGPU-WAIT {what}"), STEP_TIMEOUT);
        check(&self.daemon);
        self.vm.send_line("go");
    }

    /// Waits for the guest's "RGPU-WAIT what" and answers the line `answer`
    /// gives.
    fn host_answer(&mut self, what: &str, answer: impl FnOnce(&Daemon) -> String) {
        self.vm.wait_for(&format!("RGPU-WAIT {what}"), STEP_TIMEOUT);
        let line = answer(&self.daemon);
        self.vm.send_line(&line);
    }

    /// Waits for the end of step `name`; asserts it succeeded and that its
    /// output has `passes` "driver_api_test: N checks passed" lines.
    fn step(&mut self, name: &str, passes: usize) -> Vec<String> {
        self.vm
            .wait_for(&format!("RGPU-TEST-END {name} "), STEP_TIMEOUT);
        let lines = self.step_lines(name);
        let passed = lines
            .iter()
            .filter(|l| l.contains("driver_api_test: ") && l.ends_with(" checks passed"))
            .count();
        assert!(
            lines.last().is_some_and(|l| l.ends_with(" rc=0")) && passed == passes,
            "step {name}: expected rc=0 and {passes} passing runs, saw {passed}; console:\n{}",
            self.vm.console()
        );
        eprintln!("vm_mode: step {name} done at {:?}", self.started.elapsed());
        lines
    }

    /// The console lines of the last step `name` that ended, from its
    /// BEGIN marker to its END marker.
    fn step_lines(&self, name: &str) -> Vec<String> {
        let mut lines = self.vm.consumed();
        let begin = format!("RGPU-TEST-BEGIN {name}");
        let start = lines.iter().rposition(|l| l.ends_with(&begin)).unwrap_or(0);
        lines.drain(..start);
        lines
    }

    /// The guest powers off after /test.sh; QEMU must exit cleanly.
    fn finish(&mut self) {
        let end = self.vm.wait_for("RGPU-TEST-SH-EXIT", STEP_TIMEOUT);
        assert!(
            end.last().is_some_and(|l| l.ends_with("rc=0")),
            "/test.sh failed; console:\n{}",
            self.vm.console()
        );
        let status = self.vm.wait_exit(BOOT_TIMEOUT);
        assert!(
            status.success(),
            "QEMU exited with {status}; console:\n{}",
            self.vm.console()
        );
        eprintln!(
            "vm_mode: guest powered off at {:?}; console:\n{}",
            self.started.elapsed(),
            self.vm.console()
        );
    }
}

/// The guest as a cloud image build makes it (issue 12): a Debian 13 disk
/// image with rgpu's guest package installed by dpkg
/// (`tests/vm/build-guest-image.sh`), booted with its own kernel and
/// initramfs. The driver-API test finds the package's libcuda.so.1 through
/// the ld.so cache and passes as the non-root user `cuda`.
#[test]
fn driver_api_test_in_a_disk_image_with_the_guest_package() {
    let host = host();
    let daemon = Daemon::start("sim");
    let guest = rgpu_tests::GuestLib::new();
    let program = guest.build_program("driver_api_test.c");
    let root = workspace_root();
    let ptx = rgpu_tests::reference_ptx();
    let image = rgpu_tests::GuestImage::build(
        daemon.dir(),
        &[
            (program.as_path(), "/opt/rgpu-test/driver_api_test"),
            (ptx.as_path(), "/opt/rgpu-test/reference_kernels.ptx"),
            (
                root.join("tests/vm/guest-image-test.sh").as_path(),
                "/test.sh",
            ),
        ],
    );
    let started = Instant::now();
    let vm = Vm::start_image(&host, &daemon, &image, GUEST_MEMORY);
    let mut f = Fixture {
        vm,
        daemon,
        started,
    };
    f.check_boot();
    let boot = f.vm.consumed();
    assert!(
        boot.iter()
            .any(|l| l.contains("from the disk image (root /dev/vda)"))
            && boot
                .iter()
                .any(|l| l.contains("rgpu-guest ") && l.ends_with("installed by dpkg")),
        "not the disk image with the package; console:\n{}",
        f.vm.console()
    );
    let diag = f.step("diag", 0);
    assert!(
        diag.iter().any(|l| l == "rgpu-diag: all checks passed"),
        "rgpu-diag failed; console:\n{}",
        f.vm.console()
    );
    f.step("single", 1);
    assert!(
        f.vm.console()
            .lines()
            .any(|l| l.contains("libcuda.so.1 (libc6,x86-64) => /usr/lib/rgpu/libcuda.so.1")),
        "libcuda.so.1 is not the package's; console:\n{}",
        f.vm.console()
    );
    f.finish();
}

fn wait_sessions(daemon: &Daemon, sessions: u64) {
    daemon.wait_for_stats(
        ACCOUNTING_TIMEOUT,
        &format!("sessions_active == {sessions}"),
        |s| s.get("sessions_active") == sessions,
    );
}

/// The boot path alone: device, capset and render-node permissions, and that
/// the non-root user can open the node.
#[test]
fn guest_boots_with_the_rgpu_device() {
    let script = workspace_root().join("tests/vm/guest-boot-check.sh");
    let mut f = Fixture::boot(&script);
    f.check_boot();
    assert_eq!(f.daemon.stats().get("connections_active"), 1);
    f.step("render-node-as-user", 0);
    f.finish();
}

/// The driver-API C program as a non-root guest user: alone, two at once,
/// killed mid-run with its session freed on the host, and a 256 MiB copy from
/// guest pinned memory that the daemon never copies with its CPU.
#[test]
fn driver_api_test_in_the_guest() {
    let script = workspace_root().join("tests/vm/guest-test.sh");
    let mut f = Fixture::boot(&script);
    f.check_boot();
    let diag = f.vm.wait_for_any(
        &["RGPU-TEST-END diag ", "RGPU-TEST-SKIP diag"],
        STEP_TIMEOUT,
    );
    if diag.last().is_some_and(|l| l.contains("RGPU-TEST-END")) {
        assert!(
            f.step_lines("diag")
                .iter()
                .any(|l| l == "rgpu-diag: all checks passed"),
            "rgpu-diag failed; console:\n{}",
            f.vm.console()
        );
    }
    f.step("single", 1);

    f.host_check("two-running", |daemon| wait_sessions(daemon, 2));
    f.step("two", 2);

    // The held process sleeps between iterations, when it holds no device
    // memory; its session is what must be there, and gone after the kill.
    f.host_check("held", |daemon| wait_sessions(daemon, 1));
    f.host_check("killed", |daemon| {
        daemon.wait_for_stats(
            ACCOUNTING_TIMEOUT,
            "the killed guest process's session and memory freed",
            |s| s.get("sessions_active") == 0 && s.get("device_memory_bytes") == 0,
        );
    });
    f.step("killed", 0);
    f.step("after-kill", 1);

    // 256 MiB from guest pinned memory: the device reads it where it lies
    // (zero-copy), the daemon's CPU copies none of it.
    let mut before = None;
    f.host_check("bulk-start", |daemon| before = Some(daemon.stats()));
    let before = before.expect("stats before the bulk copy");
    let mut after = None;
    f.host_check("bulk-done", |daemon| after = Some(daemon.stats()));
    let after = after.expect("stats after the bulk copy");
    let delta = |key: &str| after.get(key) - before.get(key);
    assert!(
        delta("zero_copy_bytes") >= BULK_BYTES,
        "the bulk copy did not go zero-copy: before {before:?}, after {after:?}"
    );
    assert!(
        delta("host_cpu_copy_bytes") < BULK_BYTES / 64,
        "the daemon copied bulk data with its CPU: before {before:?}, after {after:?}"
    );
    // Nor did a driver stage it: every byte lay in memory registered for DMA.
    assert_eq!(
        delta("unregistered_copy_bytes"),
        0,
        "copies from unregistered guest memory: before {before:?}, after {after:?}"
    );
    // Registered only while its process lived: a worker registers its own
    // process's blobs, and they go with it.
    assert_eq!(
        after.get("dma_registered_bytes"),
        0,
        "guest memory stayed registered after its process exited: {after:?}"
    );
    eprintln!(
        "vm_mode: bulk copy: zero_copy_bytes +{}, staged_bytes +{}, host_cpu_copy_bytes +{}",
        delta("zero_copy_bytes"),
        delta("staged_bytes"),
        delta("host_cpu_copy_bytes")
    );
    let bulk = f.step("bulk", 1);
    assert!(
        bulk.iter()
            .any(|l| l == "bulk: 256 MiB host-to-device from pinned memory, checked on the device"),
        "no bulk line; console:\n{}",
        f.vm.console()
    );
    f.finish();

    wait_sessions(&f.daemon, 0);
    let stats = f.daemon.stats();
    assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
    assert!(stats.get("sessions_total") >= 5, "{stats:?}");
}

fn wait_workers(daemon: &Daemon, what: &str, check: impl Fn(&rgpu_tests::Stats) -> bool) {
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, what, check);
}

/// Two unprivileged users of one guest: each guest process runs in a host
/// worker of its own; one's fatal fault leaves the other's work passing
/// without the VM reconnecting; one cannot reach the other's device memory;
/// a process killed mid-copy and a driver unbind with a process holding a
/// context leave nothing behind on the host.
#[test]
fn guest_processes_are_isolated_from_each_other() {
    let script = workspace_root().join("tests/vm/guest-isolation.sh");
    // Debug logging: the host reads where a worker mapped a blob off it.
    let mut f = Fixture::boot_with_env(
        &script,
        &[
            ("RGPU_SIM_FAULT_POISONS_PROCESS", "1"),
            ("RGPU_LOG", "debug"),
        ],
    );
    f.check_boot();

    f.host_check("two-workers", |daemon| {
        wait_workers(daemon, "one worker per guest process", |s| {
            s.get("workers_active") == 2 && s.get("connections_active") == 1
        })
    });
    f.host_check("none-left", |daemon| {
        wait_workers(daemon, "no worker once the processes exited", |s| {
            s.get("workers_active") == 0
                && s.get("sessions_active") == 0
                && s.get("device_memory_bytes") == 0
        })
    });
    let lines = f.step("poisoned-neighbour", 2);
    assert!(
        lines.iter().any(|l| l.starts_with("[cuda] poisoned")),
        "the faulting process was not poisoned; console:\n{}",
        f.vm.console()
    );

    let lines = f.step("foreign-pointer", 0);
    let passed = lines
        .iter()
        .filter(|l| is_checks_passed_line(l, "foreign_pointer_test"))
        .count();
    assert!(
        passed == 2 && lines.iter().any(|l| l == "intact=yes"),
        "foreign pointers: console:\n{}",
        f.vm.console()
    );

    let lines = f.step("forged-scan", 0);
    assert!(
        lines
            .iter()
            .any(|l| is_checks_passed_line(l, "forged_pointer_test")),
        "the forged-pointer scan failed in the guest; console:\n{}",
        f.vm.console()
    );

    // cuda2's kernel reads neither cuda's pinned memory where cuda's worker
    // mapped it, nor at cuda's own pointer; its own memory it reads.
    f.host_answer("owner-blob-address", |daemon| {
        newest_blob_address(&daemon.log(), 1 << 20)
            .unwrap_or_else(|| panic!("no 1 MiB blob mapping in the daemon log:\n{}", daemon.log()))
    });
    let lines = f.step("kernel-probe", 0);
    assert!(
        lines
            .iter()
            .any(|l| l == "read self: rc 0 CUDA_SUCCESS secret yes"),
        "the probing kernel does not work; console:\n{}",
        f.vm.console()
    );
    let reads: Vec<&String> = lines.iter().filter(|l| l.starts_with("read 0x")).collect();
    assert!(
        reads.len() == 2
            && reads
                .iter()
                .all(|l| l.ends_with(" secret no") && !l.contains(": rc 0 ")),
        "a kernel read another process's memory; console:\n{}",
        f.vm.console()
    );

    f.host_check("copying", |daemon| {
        wait_workers(daemon, "the copying process's worker", |s| {
            s.get("workers_active") == 1
        })
    });
    f.host_check("nothing-after-kill", |daemon| {
        wait_workers(daemon, "nothing of the killed process", |s| {
            s.get("workers_active") == 0
                && s.get("sessions_active") == 0
                && s.get("device_memory_bytes") == 0
        })
    });
    f.step("killed-copying", 0);

    let mut workers_before = 0;
    f.host_check("before-unbind", |daemon| {
        let s = daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "the held process's worker", |s| {
            s.get("workers_active") == 1 && s.get("sessions_active") >= 1
        });
        workers_before = s.get("workers_total");
    });
    f.host_check("unbound", |daemon| {
        wait_workers(daemon, "nothing left after the driver unbind", |s| {
            s.get("workers_active") == 0
                && s.get("sessions_active") == 0
                && s.get("device_memory_bytes") == 0
                && s.get("dma_registered_bytes") == 0
        })
    });
    f.step("rebind", 1);
    f.finish();

    let stats = f.daemon.stats();
    assert_eq!(
        stats.get("connections_total"),
        1,
        "the VM reconnected: {stats:?}"
    );
    assert_eq!(stats.get("workers_active"), 0, "{stats:?}");
    assert!(stats.get("workers_total") > workers_before, "{stats:?}");
}

/// The host address of the newest blob of `size` bytes a worker mapped, as
/// its debug log says ("blob of N bytes in R runs mapped at 0x...").
fn newest_blob_address(log: &str, size: u64) -> Option<String> {
    let needle = format!("blob of {size} bytes in ");
    log.lines()
        .rev()
        .filter(|l| l.contains(&needle))
        .find_map(|l| l.split("mapped at ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
}

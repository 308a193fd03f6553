//! VM mode end to end with the sim executor: QEMU (>= 10.2, software
//! emulation) boots the stock Debian guest kernel with the daemon attached as
//! `vhost-user-test-device-pci` through `qemu-configs/`'s command line, and
//! the stock virtio_gpu driver carries guest-lib's command stream.
//!
//! Needs `tests/vm/setup-host.sh` (tests/run.sh runs it); without its chroot
//! and QEMU these tests fail saying what is missing, never skip.

use std::path::Path;
use std::time::{Duration, Instant};

use rgpu_tests::{workspace_root, Daemon, Vm, VmHost};

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
        let host = host();
        let daemon = Daemon::start("sim");
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
    assert!(
        after.get("dma_registered_bytes") >= BULK_BYTES,
        "guest memory not registered for DMA: {after:?}"
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

//! Harness of rgpu's end-to-end tests: finds the workspace's built artifacts,
//! starts a real `vhost-device-rgpu` process, reads its stats socket, and
//! builds and runs the C test programs against guest-lib's `libcuda.so.1`,
//! and boots QEMU guests attached to the daemon ([`Vm`]).
//!
//! Everything it starts or creates is cleaned up on drop: [`Daemon`] kills
//! its process, [`Vm`] kills QEMU, [`TempDir`] removes its files.
//!
//! Like the tests it serves, the harness reports what went wrong by
//! panicking, so `unwrap` and `expect` are its way to fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod daemon;
pub mod driver_api;
pub mod guest;
pub mod process;
pub mod stats;
pub mod temp_dir;
pub mod tls;
pub mod vm;

pub use daemon::Daemon;
pub use driver_api::DriverApiFixture;
pub use guest::{is_checks_passed_line, GuestLib, GuestProcess};
pub use process::{children_of, live_children, ChildProcess};
pub use stats::Stats;
pub use temp_dir::TempDir;
pub use tls::{CertFiles, TestCa, TestPki};
pub use vm::{GuestImage, Vm, VmHost};

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The profile directory of the target dir this test binary was built into
/// (`target/debug` for `target/debug/deps/local_mode-…`): the daemon binary
/// and `libcuda.so` of the same build live there.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// The profile directory, with the daemon, guest-lib's `libcuda.so` and
/// its `libnvidia_ml.so` built there and current: a plain `cargo test
/// --workspace` does not build other packages' binaries and libraries, so
/// the harness asks cargo once per test process (cargo has let go of the
/// target dir by the time tests run; an up-to-date build takes a moment).
/// Panics, with cargo's output, if the build fails.
pub fn built_profile_dir() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let dir = profile_dir();
    // A host without cargo (the GPU host) runs test binaries carried next
    // to a prebuilt daemon and guest-lib.
    if std::env::var_os("RGPU_TEST_PREBUILT").is_some() {
        return dir;
    }
    let built = BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
        let mut command = Command::new(cargo);
        command
            .current_dir(workspace_root())
            .args([
                "build",
                "--quiet",
                "-p",
                "vhost-device-rgpu",
                "-p",
                "guest-lib",
                "-p",
            ])
            .arg("rgpu-nvml");
        if let Some(target_dir) = dir.parent() {
            command.arg("--target-dir").arg(target_dir);
        }
        if dir.file_name().is_some_and(|name| name == "release") {
            command.arg("--release");
        }
        match command.output() {
            Ok(output) if output.status.success() => Ok(()),
            Ok(output) => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
            Err(e) => Err(format!("cannot run cargo: {e}")),
        }
    });
    if let Err(why) = built {
        panic!("building the daemon and guest-lib for the tests failed:\n{why}");
    }
    dir
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `tests/programs`: the C sources, `rgpu_cuda.h` and the reference PTX
/// (`RGPU_TEST_PROGRAMS_DIR` where a test binary runs away from its
/// checkout, as on the GPU host).
pub fn programs_dir() -> PathBuf {
    std::env::var_os("RGPU_TEST_PROGRAMS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs"))
}

/// The reference kernels as PTX text.
pub fn reference_ptx() -> PathBuf {
    programs_dir().join("reference_kernels.ptx")
}

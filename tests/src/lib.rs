//! Harness of rgpu's end-to-end tests: finds the workspace's built artifacts,
//! starts a real `vhost-device-rgpu` process, reads its stats socket, and
//! builds and runs the C test programs against guest-lib's `libcuda.so.1`,
//! and boots QEMU guests attached to the daemon ([`Vm`]).
//!
//! Everything it starts or creates is cleaned up on drop: [`Daemon`] kills
//! its process, [`Vm`] kills QEMU, [`TempDir`] removes its files.

pub mod daemon;
pub mod driver_api;
pub mod guest;
pub mod process;
pub mod stats;
pub mod temp_dir;
pub mod vm;

pub use daemon::Daemon;
pub use driver_api::DriverApiFixture;
pub use guest::{is_checks_passed_line, GuestLib, GuestProcess};
pub use process::{children_of, live_children, ChildProcess};
pub use stats::Stats;
pub use temp_dir::TempDir;
pub use vm::{Vm, VmHost};

use std::path::PathBuf;

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

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `tests/programs`: the C sources, `rgpu_cuda.h` and the reference PTX.
pub fn programs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs")
}

/// The reference kernels as PTX text.
pub fn reference_ptx() -> PathBuf {
    programs_dir().join("reference_kernels.ptx")
}

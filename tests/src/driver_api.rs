//! The C driver-API test program (`driver_api_test.c`) against a daemon on
//! the sim executor: the starting point of most end-to-end tests.

use std::path::{Path, PathBuf};

use crate::{reference_ptx, Daemon, GuestLib, GuestProcess};

pub struct DriverApiFixture {
    // Field order is drop order: the guests' library dir, then the daemon.
    pub guest: GuestLib,
    pub program: PathBuf,
    pub daemon: Daemon,
}

impl DriverApiFixture {
    /// Builds the program and starts a sim daemon with `daemon_args`.
    pub fn new(daemon_args: &[&str]) -> Self {
        let guest = GuestLib::new();
        let program = guest.build_program("driver_api_test.c");
        let daemon = Daemon::start_with("sim", daemon_args, &[]);
        Self {
            guest,
            program,
            daemon,
        }
    }

    /// Runs the program with the reference PTX and `args`.
    pub fn spawn(&self, args: &[&str]) -> GuestProcess {
        let mut command = self.guest.command(&self.program, &self.daemon);
        command.arg("--ptx").arg(reference_ptx()).args(args);
        GuestProcess::spawn(command)
    }

    /// Runs a client that repeats (holding 4 MiB) until `stop_file` exists,
    /// so that what the test sees is there for as long as it looks,
    /// whatever the machine's speed.
    pub fn spawn_until_stopped(&self, stop_file: &Path) -> GuestProcess {
        let stop_arg = stop_file.to_string_lossy();
        self.spawn(&[
            "--iterations",
            "100000",
            "--hold-ms",
            "20",
            "--big-mb",
            "4",
            "--stop-file",
            &stop_arg,
        ])
    }
}

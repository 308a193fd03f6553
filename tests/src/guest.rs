//! Guest programs: guest-lib's `libcuda.so.1` and `libnvidia-ml.so.1` in a
//! directory of their own, C programs compiled against `rgpu_cuda.h`, and
//! running them through a daemon with their output collected.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{built_profile_dir, programs_dir, Daemon, TempDir};

/// A directory holding `libcuda.so.1` and `libcuda.so`, both links to this
/// build's guest-lib, `libnvidia-ml.so.1` and `libnvidia-ml.so`, links to
/// its NVML (guest-lib/nvml), and the C programs built against them. Only
/// guest processes get it on their `LD_LIBRARY_PATH`.
pub struct GuestLib {
    dir: TempDir,
}

impl GuestLib {
    pub fn new() -> Self {
        let library = built_profile_dir().join("libcuda.so");
        assert!(
            library.exists(),
            "{} does not exist after building it",
            library.display()
        );
        let dir = TempDir::new("rgpu-guest").expect("create a temp dir for the guest");
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(&library, dir.join(name)).expect("link libcuda");
        }
        let nvml = built_profile_dir().join("libnvidia_ml.so");
        assert!(
            nvml.exists(),
            "{} does not exist after building it",
            nvml.display()
        );
        for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            std::os::unix::fs::symlink(&nvml, dir.join(name)).expect("link libnvidia-ml");
        }
        Self { dir }
    }

    pub fn lib_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Compiles `tests/programs/<source>` with `cc` against `rgpu_cuda.h`,
    /// linked with `-lcuda` from this directory; returns the executable.
    pub fn build_program(&self, source: &str) -> PathBuf {
        self.build_c(&programs_dir().join(source), &["-lcuda"])
    }

    /// Compiles any C file with `cc -I tests/programs`, then `link_args`.
    pub fn build_c(&self, source: &Path, link_args: &[&str]) -> PathBuf {
        let stem = source
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "program".into());
        let output = self.dir.join(&stem);
        let result = Command::new("cc")
            .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(programs_dir())
            .arg("-o")
            .arg(&output)
            .arg(source)
            .arg("-L")
            .arg(self.lib_dir())
            .args(link_args)
            .output()
            .expect("run cc (install a C compiler)");
        assert!(
            result.status.success(),
            "cc {} failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&result.stderr)
        );
        output
    }

    /// A command running `program` as a guest of `daemon`.
    pub fn command(&self, program: &Path, daemon: &Daemon) -> Command {
        let mut command = Command::new(program);
        command
            .env("RGPU_SOCKET", daemon.socket())
            .env("LD_LIBRARY_PATH", self.lib_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

impl Default for GuestLib {
    fn default() -> Self {
        Self::new()
    }
}

/// A running guest program whose stdout lines are collected as they come.
pub struct GuestProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stdout_reader: Option<JoinHandle<()>>,
    stderr_reader: Option<JoinHandle<String>>,
}

/// Whether `line` is test program `program`'s "`program`: N checks
/// passed" (see tests/programs/checks.h).
pub fn is_checks_passed_line(line: &str, program: &str) -> bool {
    line.strip_prefix(program)
        .is_some_and(|rest| rest.starts_with(": ") && rest.ends_with(" checks passed"))
}

/// How a guest program ended.
#[derive(Debug)]
pub struct GuestOutcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl GuestOutcome {
    /// Whether test program `program` exited 0 and printed its
    /// "`program`: N checks passed" line.
    pub fn passed(&self, program: &str) -> bool {
        self.status.success()
            && self
                .stdout
                .lines()
                .any(|l| is_checks_passed_line(l, program))
    }

    /// Asserts that test program `program` passed (see [`Self::passed`]).
    pub fn assert_passed(&self, program: &str) {
        self.assert_passed_as(program, program);
    }

    /// Asserts exit 0 and the "driver_api_test: N checks passed" line.
    pub fn assert_checks_passed(&self, who: &str) {
        self.assert_passed_as("driver_api_test", who);
    }

    /// Asserts that `program` passed; a failure names it `who` and shows
    /// what it printed.
    fn assert_passed_as(&self, program: &str, who: &str) {
        assert!(
            self.passed(program),
            "{who} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

impl GuestProcess {
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command.spawn().expect("spawn the guest program");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take();
        let sink = Arc::clone(&lines);
        let stdout_reader = std::thread::spawn(move || {
            if let Some(out) = stdout {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Ok(mut lines) = sink.lock() {
                        lines.push(line);
                    }
                }
            }
        });
        let stderr = child.stderr.take();
        let stderr_reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut err) = stderr {
                let _ = err.read_to_string(&mut text);
            }
            text
        });
        Self {
            child,
            lines,
            stdout_reader: Some(stdout_reader),
            stderr_reader: Some(stderr_reader),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    fn stdout_so_far(&self) -> String {
        self.lines.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Waits until the program printed `line`; panics if it exits first or
    /// after `timeout`.
    pub fn wait_for_line(&mut self, line: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .lines
                .lock()
                .map(|l| l.iter().any(|l| l == line))
                .unwrap_or(false)
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // The reader may still hold the last lines.
                std::thread::sleep(Duration::from_millis(50));
                if self
                    .lines
                    .lock()
                    .map(|l| l.iter().any(|l| l == line))
                    .unwrap_or(false)
                {
                    return;
                }
                panic!(
                    "guest {} exited with {status} before printing {line:?}:\n{}",
                    self.id(),
                    self.stdout_so_far()
                );
            }
            assert!(
                Instant::now() < deadline,
                "guest {} did not print {line:?} within {timeout:?}:\n{}",
                self.id(),
                self.stdout_so_far()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the exit (killing the program after `timeout`) and returns
    /// everything it printed.
    pub fn finish(mut self, timeout: Duration) -> GuestOutcome {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    self.kill();
                    panic!(
                        "guest {} did not finish within {timeout:?}:\n{}",
                        self.id(),
                        self.stdout_so_far()
                    );
                }
            }
        };
        if let Some(reader) = self.stdout_reader.take() {
            let _ = reader.join();
        }
        let stderr = self
            .stderr_reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default();
        GuestOutcome {
            status,
            stdout: self.stdout_so_far(),
            stderr,
        }
    }
}

impl Drop for GuestProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_checks_passed_line;

    #[test]
    fn only_the_programs_own_passed_line_counts() {
        assert!(is_checks_passed_line(
            "fault_test: 7 checks passed",
            "fault_test"
        ));
        assert!(!is_checks_passed_line(
            "fault_test: 1 checks failed, 6 passed",
            "fault_test"
        ));
        assert!(!is_checks_passed_line(
            "fault_test_2: 7 checks passed",
            "fault_test"
        ));
        assert!(!is_checks_passed_line(
            "fault_test 7 checks passed",
            "fault_test"
        ));
    }
}

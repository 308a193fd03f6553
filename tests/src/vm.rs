//! VM mode: a QEMU guest (stock Debian kernel and virtio_gpu module, busybox
//! initramfs) attached to a [`Daemon`] through `qemu-configs/`'s command line,
//! its serial console read line by line as it streams.
//!
//! The host pieces come from `tests/vm/setup-host.sh`: a Debian 13 chroot
//! (QEMU >= 10.2, guest kernel and modules, busybox) and a portable QEMU made
//! from it, both under `$RGPU_CACHE` (default `/var/cache/rgpu`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{built_profile_dir, workspace_root, Daemon};

/// The QEMU command line the tests run as is.
pub const QEMU_CONFIG: &str = "qemu-configs/qemu-vhost-user-test-device.sh";

/// What the VM test needs on the host, found or explained.
#[derive(Debug, Clone)]
pub struct VmHost {
    /// The Debian 13 chroot (guest kernel modules, busybox, glibc).
    pub chroot: PathBuf,
    /// The QEMU binary or wrapper (`QEMU=` of the qemu-configs script).
    pub qemu: PathBuf,
    /// The guest kernel.
    pub kernel: PathBuf,
}

impl VmHost {
    /// The cache directory of `tests/vm/setup-host.sh`.
    pub fn cache_dir() -> PathBuf {
        std::env::var_os("RGPU_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/rgpu"))
    }

    /// Finds the chroot, QEMU and kernel (`RGPU_QEMU` and `RGPU_VM_KERNEL`
    /// override the last two); the error says what is missing and how to
    /// install it.
    pub fn find() -> Result<Self, String> {
        let cache = Self::cache_dir();
        let chroot = cache.join("trixie");
        let qemu = std::env::var_os("RGPU_QEMU")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache.join("qemu/qemu-system-x86_64"));
        let kernel = std::env::var_os("RGPU_VM_KERNEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache.join("qemu/vmlinuz"));
        let mut missing = Vec::new();
        if !chroot.join(".rgpu-chroot-ready").exists() {
            missing.push(format!(
                "the Debian 13 chroot with QEMU >= 10.2, the guest kernel and busybox ({})",
                chroot.display()
            ));
        }
        if !qemu.exists() {
            missing.push(format!("the portable QEMU ({})", qemu.display()));
        }
        if !kernel.exists() {
            missing.push(format!("the guest kernel ({})", kernel.display()));
        }
        for tool in ["cpio", "gzip", "xz", "cc", "strip"] {
            if !tool_on_path(tool) {
                missing.push(format!("the host tool `{tool}`"));
            }
        }
        if missing.is_empty() {
            Ok(Self {
                chroot,
                qemu,
                kernel,
            })
        } else {
            Err(format!(
                "the VM-mode test cannot run; missing: {}. Install them with \
                 `sudo tests/vm/setup-host.sh` (Debian/Ubuntu: apt-get installs the host tools, \
                 then it builds the chroot and the portable QEMU in {}, about 1-2 minutes; \
                 RGPU_CACHE picks another directory). tests/run.sh runs it before the tests.",
                missing.join("; "),
                cache.display()
            ))
        }
    }

    /// Builds a guest initramfs (`tests/vm/build-initramfs.sh`) with this
    /// build's guest-lib and programs; `files` are (source, path in the
    /// guest) pairs, e.g. a test script as `/test.sh`.
    pub fn build_initramfs(&self, out: &Path, files: &[(&Path, &str)]) {
        let script = workspace_root().join("tests/vm/build-initramfs.sh");
        let mut command = Command::new("bash");
        command
            .arg(&script)
            .arg(out)
            .env("RGPU_CACHE", Self::cache_dir())
            .env("RGPU_PROFILE_DIR", built_profile_dir());
        for (source, dest) in files {
            let mut spec = source.as_os_str().to_owned();
            spec.push("=");
            spec.push(dest);
            command.arg(spec);
        }
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "{} failed ({}):\n{}{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A bootable guest disk image with rgpu's guest package installed by
/// dpkg (`tests/vm/build-guest-image.sh`), and the kernel and initramfs
/// inside it.
#[derive(Debug, Clone)]
pub struct GuestImage {
    pub disk: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl GuestImage {
    /// Builds the Debian packages (`scripts/package.sh`, release) into
    /// `dir`, then an image there with the guest package and `files`
    /// ((source, path in the image) pairs).
    pub fn build(dir: &Path, files: &[(&Path, &str)]) -> Self {
        let root = workspace_root();
        let packages = dir.join("packages");
        run_script(
            Command::new("bash")
                .arg(root.join("scripts/package.sh"))
                .arg(&packages),
        );
        let deb = std::fs::read_dir(&packages)
            .unwrap_or_else(|e| panic!("read {}: {e}", packages.display()))
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("rgpu-guest_"))
            })
            .unwrap_or_else(|| panic!("no rgpu-guest_*.deb in {}", packages.display()));
        let image = dir.join("image");
        let mut command = Command::new("bash");
        command
            .arg(root.join("tests/vm/build-guest-image.sh"))
            .arg(&image)
            .arg(&deb)
            .env("RGPU_CACHE", VmHost::cache_dir());
        for (source, dest) in files {
            let mut spec = source.as_os_str().to_owned();
            spec.push("=");
            spec.push(dest);
            command.arg(spec);
        }
        run_script(&mut command);
        Self {
            disk: image.join("disk.raw"),
            kernel: image.join("vmlinuz"),
            initrd: image.join("initrd.img"),
        }
    }
}

/// Runs a build script to its end; panics with its output if it fails.
fn run_script(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn tool_on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

/// A running QEMU guest; killed on drop.
pub struct Vm {
    child: Child,
    stdin: Option<ChildStdin>,
    console: Arc<Mutex<Vec<String>>>,
    /// How many console lines the `wait_for*` calls consumed.
    cursor: usize,
}

/// A console line that fails the test as soon as it appears: a step that
/// ended with a non-zero status, or a guest-side error.
fn failure_marker(line: &str) -> bool {
    line.contains("RGPU-ERROR")
        || line
            .find("RGPU-TEST-END ")
            .is_some_and(|at| !line[at..].ends_with(" rc=0"))
}

impl Vm {
    /// Boots `kernel` with `initrd` through [`QEMU_CONFIG`], attached to
    /// `daemon`; `append` goes to the kernel command line (a `NAME=value`
    /// without a dot lands in the guest init's environment).
    pub fn start(
        host: &VmHost,
        daemon: &Daemon,
        initrd: &Path,
        memory: &str,
        append: &str,
    ) -> Self {
        Self::start_with_args(host, daemon, initrd, memory, append, &[])
    }

    /// [`Vm::start`] with more QEMU arguments.
    fn start_with_args(
        host: &VmHost,
        daemon: &Daemon,
        initrd: &Path,
        memory: &str,
        append: &str,
        qemu_args: &[std::ffi::OsString],
    ) -> Self {
        let config = workspace_root().join(QEMU_CONFIG);
        let mut child = Command::new("bash")
            .arg(&config)
            .args(qemu_args)
            .env("RGPU_SOCKET", daemon.socket())
            .env("KERNEL", &host.kernel)
            .env("INITRD", initrd)
            .env("MEM", memory)
            .env("APPEND", append)
            .env("QEMU", &host.qemu)
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", config.display()));
        let console = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            spawn_reader(stdout, Arc::clone(&console), "");
        }
        if let Some(stderr) = child.stderr.take() {
            spawn_reader(stderr, Arc::clone(&console), "qemu stderr: ");
        }
        Self {
            stdin: child.stdin.take(),
            child,
            console,
            cursor: 0,
        }
    }

    /// Boots a disk image of `tests/vm/build-guest-image.sh` (its own
    /// kernel and initramfs, the image as the root disk, its test init)
    /// through [`QEMU_CONFIG`], attached to `daemon`.
    pub fn start_image(host: &VmHost, daemon: &Daemon, image: &GuestImage, memory: &str) -> Self {
        let host = VmHost {
            kernel: image.kernel.clone(),
            ..host.clone()
        };
        let mut drive = std::ffi::OsString::from("file=");
        drive.push(&image.disk);
        drive.push(",format=raw,if=virtio");
        Self::start_with_args(
            &host,
            daemon,
            &image.initrd,
            memory,
            "root=/dev/vda rw init=/sbin/rgpu-test-init",
            &["-drive".into(), drive],
        )
    }

    /// Everything the guest printed so far.
    pub fn console(&self) -> String {
        self.console
            .lock()
            .map(|lines| lines.join("\n"))
            .unwrap_or_default()
    }

    /// The console lines the `wait_for*` calls went through so far.
    pub fn consumed(&self) -> Vec<String> {
        self.console
            .lock()
            .map(|lines| lines[..self.cursor.min(lines.len())].to_vec())
            .unwrap_or_default()
    }

    /// Waits for the next console line containing `marker` and returns the
    /// lines from the previous wait's end up to and including it. Panics
    /// (with the whole console) on a failure marker, when QEMU exits first,
    /// or after `timeout`.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> Vec<String> {
        self.wait_for_any(&[marker], timeout)
    }

    /// [`Vm::wait_for`] for the first of several markers.
    pub fn wait_for_any(&mut self, markers: &[&str], timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut exited: Option<ExitStatus> = None;
        loop {
            let found = self.console.lock().ok().and_then(|lines| {
                let start = self.cursor.min(lines.len());
                lines[start..].iter().enumerate().find_map(|(i, line)| {
                    if failure_marker(line) {
                        Some(Err(line.clone()))
                    } else if markers.iter().any(|m| line.contains(m)) {
                        Some(Ok((start + i + 1, lines[start..=start + i].to_vec())))
                    } else {
                        None
                    }
                })
            });
            match found {
                Some(Ok((end, lines))) => {
                    self.cursor = end;
                    return lines;
                }
                Some(Err(line)) => panic!(
                    "the guest failed a step ({line:?}) while the test waited for {markers:?}; \
                     console:\n{}",
                    self.console()
                ),
                None => {}
            }
            if let Some(status) = exited {
                panic!(
                    "QEMU exited ({status}) before the guest printed {markers:?}; console:\n{}",
                    self.console()
                );
            }
            // Read the last lines once more after QEMU exits.
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                exited = Some(status);
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "the guest did not print {markers:?} within {timeout:?}; console:\n{}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Types one line on the guest's serial console.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("QEMU's stdin is open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write to the guest console: {e}"));
    }

    /// Waits for QEMU to exit (the guest powers off); kills it after
    /// `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "QEMU did not exit within {timeout:?}; console:\n{}",
                    self.console()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.stdin = None;
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Collects a stream's lines, without carriage returns and terminal escape
/// sequences (SeaBIOS clears the screen).
fn spawn_reader(stream: impl Read + Send + 'static, sink: Arc<Mutex<Vec<String>>>, prefix: &str) {
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
            let text = strip_escapes(&String::from_utf8_lossy(&line));
            if let Ok(mut lines) = sink.lock() {
                lines.push(format!("{prefix}{text}"));
            }
        }
    });
}

/// Removes `\r` and ANSI escape sequences (`ESC [ ... letter`, `ESC c`).
fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {}
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_terminal_noise() {
        assert_eq!(
            strip_escapes("\u{1b}c\u{1b}[?7l\u{1b}[2JRGPU-BOOT ready\r"),
            "RGPU-BOOT ready"
        );
        assert_eq!(strip_escapes("plain"), "plain");
    }

    #[test]
    fn failure_markers() {
        assert!(failure_marker("RGPU-TEST-END single rc=1"));
        assert!(failure_marker("junk RGPU-TEST-END two rc=137"));
        assert!(!failure_marker("RGPU-TEST-END single rc=0"));
        assert!(failure_marker(
            "RGPU-ERROR /tmp/a.log never printed running:"
        ));
        assert!(!failure_marker("RGPU-TEST-BEGIN single"));
    }
}

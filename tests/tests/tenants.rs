//! Tenants (issue 8): a daemon serving the tenants of a TOML config, each
//! on a socket of its own with its own memory limit, changed, added and
//! removed live through `vhost-device-rgpu ctl`; `--socket-path` alone is
//! one tenant, "default"; a bad config or a tenant that cannot start fails
//! the daemon at once, saying why.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rgpu_tests::{live_children, Daemon, GuestLib, GuestProcess, TempDir};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a daemon that cannot start may take to say so and exit.
const FAILURE_TIMEOUT: Duration = Duration::from_secs(30);

/// A tenant limited to 256 MiB (on `rgpu.sock`, the harness's socket) and
/// one without a limit.
const TWO_TENANTS: &str = r#"
[[tenant]]
name = "limited"
socket = "rgpu.sock"
memory_limit = "256MiB"

[[tenant]]
name = "unlimited"
socket = "unlimited.sock"
compute_weight = 300
priority = "high"
"#;

fn has_line(stdout: &str, line: &str) -> bool {
    stdout.lines().any(|l| l == line)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `ctl` that must succeed; its stdout.
fn ctl_ok(daemon: &Daemon, args: &[&str]) -> String {
    let output = daemon.ctl(args);
    assert!(
        output.status.success(),
        "ctl {args:?} failed ({}):\n{}\ndaemon log:\n{}",
        output.status,
        text(&output.stderr),
        daemon.log()
    );
    text(&output.stdout)
}

/// `ctl` that must fail, saying `why` on stderr.
fn ctl_refused(daemon: &Daemon, args: &[&str], why: &str) {
    let output = daemon.ctl(args);
    let stderr = text(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains(why),
        "ctl {args:?}: want a failure saying {why:?}, got {}:\nstdout:\n{}\nstderr:\n{stderr}",
        output.status,
        text(&output.stdout),
    );
}

/// The row of tenant `name` in `ctl list`'s table, as its cells: name,
/// socket, GPU, memory limit, memory used, weight, cap, priority,
/// connections, sessions (not the GPU seconds after them, which the
/// scheduler's tests look at).
fn row(table: &str, name: &str) -> Option<Vec<String>> {
    table
        .lines()
        .map(|line| {
            line.split_whitespace()
                .take(10)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().is_some_and(|cell| cell == name))
}

/// Polls `ctl list` until tenant `name`'s row is `want` (accounting of
/// sessions lags a little behind the guest).
fn wait_for_row(daemon: &Daemon, name: &str, want: &[&str]) {
    let deadline = Instant::now() + ACCOUNTING_TIMEOUT;
    loop {
        let table = ctl_ok(daemon, &["list"]);
        if row(&table, name).is_some_and(|cells| cells == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tenant {name}: want {want:?} in\n{table}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A program of the guest library run to its end on `socket`.
struct Guests {
    guest: GuestLib,
    program: std::path::PathBuf,
}

impl Guests {
    fn new() -> Self {
        let guest = GuestLib::new();
        let program = guest.build_program("memory_limit_test.c");
        Self { guest, program }
    }

    fn spawn(&self, daemon: &Daemon, socket: &Path, args: &[&str]) -> GuestProcess {
        let mut command = self.guest.command(&self.program, daemon);
        command.env("RGPU_SOCKET", socket).args(args);
        GuestProcess::spawn(command)
    }

    /// Runs the program on `socket` holding `mb` MiB until `release`
    /// exists; returns once it holds them.
    fn hold(&self, daemon: &Daemon, socket: &Path, mb: u32, release: &Path) -> GuestProcess {
        let mb = mb.to_string();
        let release = release.to_string_lossy();
        let mut holder = self.spawn(daemon, socket, &["--max-mb", &mb, "--hold-file", &release]);
        holder.wait_for_line("holding", RUN_TIMEOUT);
        holder
    }

    /// Runs the program on `socket`; its stdout (stderr added to failures).
    fn run(&self, daemon: &Daemon, socket: &Path) -> String {
        let outcome = self.spawn(daemon, socket, &[]).finish(RUN_TIMEOUT);
        assert!(
            outcome.status.success(),
            "memory_limit_test on {} failed ({}):\n{}\n{}",
            socket.display(),
            outcome.status,
            outcome.stdout,
            outcome.stderr
        );
        outcome.stdout
    }
}

/// Each tenant of the config has its own limit, and a limit lowered live
/// bounds new allocations at once without taking any memory away.
#[test]
fn each_tenant_has_its_limit_and_it_changes_live() {
    let guests = Guests::new();
    let daemon = Daemon::start_with_config("sim", TWO_TENANTS, &[], &[]);
    let limited = daemon.socket().to_owned();
    let unlimited = daemon.dir().join("unlimited.sock");

    let out = guests.run(&daemon, &limited);
    assert!(
        has_line(&out, "total MiB 256")
            && has_line(
                &out,
                "allocated 256 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"
            ),
        "{out}"
    );
    let out = guests.run(&daemon, &unlimited);
    assert!(
        has_line(&out, "allocated 1024 MiB, then rc 0 CUDA_SUCCESS")
            && !has_line(&out, "total MiB 256"),
        "{out}"
    );

    // A client of the limited tenant holds 96 MiB; the limit drops to 128:
    // a new client sees 128 MiB of device and gets the 32 left.
    let release = daemon.dir().join("release");
    let holder = guests.hold(&daemon, &limited, 96, &release);
    let changed = ctl_ok(&daemon, &["set", "limited", "memory_limit=128MiB"]);
    assert_eq!(
        row(&changed, "limited").map(|cells| cells[3].clone()),
        Some("128MiB".into()),
        "{changed}"
    );
    let out = guests.run(&daemon, &limited);
    assert!(
        has_line(&out, "total MiB 128")
            && has_line(&out, "info free 32 total 128")
            && has_line(&out, "allocated 32 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"),
        "{out}"
    );

    // Below what the holder has: it keeps its 96 MiB, a newcomer gets
    // nothing.
    ctl_ok(&daemon, &["set", "limited", "memory_limit=64MiB"]);
    let out = guests.run(&daemon, &limited);
    assert!(
        has_line(&out, "info free 0 total 64")
            && has_line(&out, "allocated 0 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"),
        "{out}"
    );
    // The stored-only settings change too, and `list` shows everything.
    let changed = ctl_ok(
        &daemon,
        &[
            "set",
            "unlimited",
            "compute_weight=500",
            "compute_max=50%",
            "priority=low",
        ],
    );
    assert!(row(&changed, "unlimited").is_some(), "{changed}");
    let limited_path = limited.to_string_lossy().into_owned();
    let unlimited_path = unlimited.to_string_lossy().into_owned();
    wait_for_row(
        &daemon,
        "limited",
        &[
            "limited",
            &limited_path,
            "0",
            "64MiB",
            "96MiB",
            "100",
            "none",
            "normal",
            "1",
            "1",
        ],
    );
    wait_for_row(
        &daemon,
        "unlimited",
        &[
            "unlimited",
            &unlimited_path,
            "0",
            "none",
            "0B",
            "500",
            "50%",
            "low",
            "0",
            "0",
        ],
    );

    // The holder frees its memory and leaves; the tenant's use is back to
    // nothing.
    std::fs::write(&release, b"").expect("create the release file");
    let held = holder.finish(RUN_TIMEOUT);
    assert!(
        held.status.success() && has_line(&held.stdout, "allocated 96 MiB, then rc 0 CUDA_SUCCESS"),
        "{}\n{}",
        held.stdout,
        held.stderr
    );
    wait_for_row(
        &daemon,
        "limited",
        &[
            "limited",
            &limited_path,
            "0",
            "64MiB",
            "0B",
            "100",
            "none",
            "normal",
            "0",
            "0",
        ],
    );

    // Refusals reach ctl, which says why and fails.
    ctl_refused(
        &daemon,
        &["set", "nosuch", "memory_limit=1GiB"],
        "unknown tenant \"nosuch\"",
    );
    ctl_refused(
        &daemon,
        &["set", "limited", "compute_weight=0"],
        "compute_weight: 0 is out of range",
    );
    ctl_refused(
        &daemon,
        &["set", "limited", "memory_limit=12XB"],
        "unknown unit",
    );
    ctl_refused(
        &daemon,
        &["set", "limited", "socket=/x.sock"],
        "cannot change while the tenant is served",
    );
    // None of them changed anything.
    let table = ctl_ok(&daemon, &["list"]);
    assert_eq!(
        row(&table, "limited").map(|cells| (cells[3].clone(), cells[5].clone())),
        Some(("64MiB".into(), "100".into())),
        "{table}"
    );
}

/// `ctl add` starts a tenant that serves at once; `ctl remove` closes and
/// removes its socket and ends its processes, a connected client's
/// included, while the other tenants go on.
#[test]
fn tenants_are_added_and_removed_live() {
    let guests = Guests::new();
    let daemon = Daemon::start_with_config(
        "sim",
        "[[tenant]]\nname = \"first\"\nsocket = \"rgpu.sock\"\n",
        &[],
        &[],
    );
    let added = daemon.dir().join("added.sock");
    let added_arg = format!("socket={}", added.display());
    let table = ctl_ok(
        &daemon,
        &[
            "add",
            "name=added",
            &added_arg,
            "memory_limit=64MiB",
            "priority=low",
        ],
    );
    let added_path = added.to_string_lossy().into_owned();
    assert_eq!(
        row(&table, "added"),
        Some(
            [
                "added",
                &added_path,
                "0",
                "64MiB",
                "0B",
                "100",
                "none",
                "low",
                "0",
                "0"
            ]
            .map(String::from)
            .to_vec()
        ),
        "{table}"
    );
    let out = guests.run(&daemon, &added);
    assert!(
        has_line(&out, "total MiB 64")
            && has_line(&out, "allocated 64 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"),
        "{out}"
    );
    ctl_refused(
        &daemon,
        &["add", "name=added", "socket=/tmp/rgpu-other.sock"],
        "a tenant named \"added\" is served already",
    );
    let first_socket = format!("socket={}", daemon.socket().display());
    ctl_refused(
        &daemon,
        &["add", "name=second", &first_socket],
        "is tenant \"first\"'s socket already",
    );
    ctl_refused(&daemon, &["add", "name=third"], "socket is missing");

    // A client of the added tenant holds memory when it is removed.
    let release = daemon.dir().join("release");
    let mut holder = guests.hold(&daemon, &added, 32, &release);
    // Each tenant's standby, and the holder's connection process.
    let deadline = Instant::now() + ACCOUNTING_TIMEOUT;
    while live_children(daemon.pid()) != 3 {
        assert!(
            Instant::now() < deadline,
            "want 3 connection processes, have {}",
            live_children(daemon.pid())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ctl_ok(&daemon, &["remove", "added"]), "removed added\n");
    assert!(
        !added.exists(),
        "the removed tenant's socket is still there"
    );
    assert!(UnixStream::connect(&added).is_err());
    // Its processes are gone (the first tenant's standby is left), and
    // so are their gauges.
    assert_eq!(live_children(daemon.pid()), 1);
    let stats = daemon.stats();
    assert_eq!(stats.get("connections_active"), 0, "{stats:?}");
    assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
    assert!(stats.get("connections_total") >= 2, "{stats:?}");
    let table = ctl_ok(&daemon, &["list"]);
    assert!(row(&table, "added").is_none(), "{table}");
    assert!(row(&table, "first").is_some(), "{table}");
    ctl_refused(&daemon, &["remove", "added"], "unknown tenant \"added\"");
    holder.kill();

    // The first tenant serves on, and a name can come back.
    let out = guests.run(&daemon, daemon.socket());
    assert!(
        has_line(&out, "allocated 1024 MiB, then rc 0 CUDA_SUCCESS"),
        "{out}"
    );
    ctl_ok(&daemon, &["add", "name=added", &added_arg]);
    let out = guests.run(&daemon, &added);
    assert!(
        has_line(&out, "allocated 1024 MiB, then rc 0 CUDA_SUCCESS"),
        "{out}"
    );
}

/// `--socket-path` alone is the tenant "default", without limits, which a
/// control socket can change too.
#[test]
fn socket_path_alone_is_the_default_tenant() {
    let guests = Guests::new();
    let control_dir = TempDir::new("rgpu-control").expect("a temp dir");
    let control = control_dir.join("control.sock");
    let control_arg = control.to_string_lossy().into_owned();
    let daemon = Daemon::start_with("sim", &["--control-socket", &control_arg], &[]);
    let deadline = Instant::now() + ACCOUNTING_TIMEOUT;
    while !control.exists() {
        assert!(
            Instant::now() < deadline,
            "no control socket:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let ctl = |args: &[&str]| -> Output { Daemon::ctl_at(&control, args) };
    let listed = ctl(&["list"]);
    let table = text(&listed.stdout);
    let socket = daemon.socket().to_string_lossy().into_owned();
    assert_eq!(
        row(&table, "default"),
        Some(
            ["default", &socket, "0", "none", "0B", "100", "none", "normal", "0", "0"]
                .map(String::from)
                .to_vec()
        ),
        "{table}\n{}",
        text(&listed.stderr)
    );
    let out = guests.run(&daemon, daemon.socket());
    assert!(
        has_line(&out, "allocated 1024 MiB, then rc 0 CUDA_SUCCESS"),
        "{out}"
    );
    assert!(ctl(&["set", "default", "memory_limit=256MiB"])
        .status
        .success());
    let out = guests.run(&daemon, daemon.socket());
    assert!(
        has_line(&out, "total MiB 256")
            && has_line(
                &out,
                "allocated 256 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"
            ),
        "{out}"
    );
    drop(daemon);
    assert!(!control.exists(), "the control socket outlived the daemon");
}

/// Runs the daemon on a config that must not serve; returns its output
/// once it exited (killing it after a while).
fn daemon_that_fails(executor: &str, config: &str) -> (TempDir, Output) {
    let dir = TempDir::new("rgpu-bad-config").expect("a temp dir");
    let file = dir.join("rgpu.toml");
    std::fs::write(&file, config).expect("write the config");
    let mut command = Command::new(Daemon::binary());
    command
        .arg("--executor")
        .arg(executor)
        .arg("--config")
        .arg(&file)
        .env_remove("LD_LIBRARY_PATH")
        .envs(std::env::var_os("RGPU_TEST_DRIVER_DIR").map(|dir| ("LD_LIBRARY_PATH", dir)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn vhost-device-rgpu");
    let deadline = Instant::now() + FAILURE_TIMEOUT;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("reap the daemon");
            panic!(
                "the daemon still ran after {FAILURE_TIMEOUT:?}:\n{}",
                text(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("reap the daemon");
    (dir, output)
}

#[test]
fn a_bad_config_fails_the_daemon_naming_the_line() {
    let (dir, output) = daemon_that_fails(
        "sim",
        "[[tenant]]\nname = \"vm1\"\nsocket = \"vm1.sock\"\ncompute_weight = 0\n",
    );
    let stderr = text(&output.stderr);
    let file = dir.join("rgpu.toml");
    assert!(
        !output.status.success()
            && stderr.contains(&format!(
                "{}:4: compute_weight: 0 is out of range",
                file.display()
            )),
        "{}\n{stderr}",
        output.status
    );
    assert!(!dir.join("vm1.sock").exists());
}

/// A tenant whose first process cannot start (no GPU 99; no driver at
/// all on a machine without one) fails the daemon at once with that
/// process's reason, and nothing is left behind.
#[test]
fn a_tenant_that_cannot_start_fails_the_daemon() {
    let (dir, output) = daemon_that_fails(
        "cuda",
        "[[tenant]]\nname = \"good\"\nsocket = \"good.sock\"\n\n\
         [[tenant]]\nname = \"bad\"\nsocket = \"bad.sock\"\ngpu = 99\n",
    );
    let stderr = text(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("ERROR") && stderr.contains("tenant "),
        "{}\n{stderr}",
        output.status
    );
    assert!(!dir.join("good.sock").exists() && !dir.join("bad.sock").exists());
}

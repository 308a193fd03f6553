//! The daemon binary's command line.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vhost-device-rgpu");

#[test]
fn print_capabilities_prints_gpu_type_and_ignores_other_options() {
    for args in [
        &["--print-capabilities"][..],
        &[
            "--print-capabilities",
            "--socket-path",
            "/nonexistent/x",
            "--fd",
            "99",
        ][..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let compact: String = text.split_whitespace().collect();
        assert_eq!(compact, "{\"type\":\"gpu\"}");
    }
}

#[test]
fn socket_path_and_fd_are_exclusive_and_one_is_required() {
    let out = Command::new(BIN).output().unwrap();
    assert!(!out.status.success());
    let out = Command::new(BIN)
        .args(["--socket-path", "/tmp/x", "--fd", "3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn help_says_sim_is_a_test_fixture() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("test fixture"), "{text}");
    assert!(text.contains("--stats-socket"));
}

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A frontend that has started vhost-user negotiation: connected, asked
/// for the device features and got them (returned with the stream). (The
/// daemon gives a connection a process only once its frontend speaks.)
fn frontend(socket: &std::path::Path) -> (UnixStream, u64) {
    use std::io::Write;
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // VHOST_USER_GET_FEATURES (1), flags version 1, no payload.
    stream
        .write_all(&[1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_le_bytes(reply[..4].try_into().unwrap()), 1);
    let features = u64::from_le_bytes(reply[12..20].try_into().unwrap());
    (stream, features)
}

#[test]
fn sim_daemon_serves_stats_and_cleans_up_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("rgpu-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("rgpu.sock");
    let stats = dir.join("stats.sock");
    let mut daemon = Daemon {
        child: Command::new(BIN)
            .args(["--executor", "sim", "--socket-path"])
            .arg(&socket)
            .arg("--stats-socket")
            .arg(&stats)
            .env("RGPU_LOG", "warn")
            .stdout(Stdio::null())
            // The sim's fixture warning is not what this test looks at.
            .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
            .spawn()
            .unwrap(),
        dir: dir.clone(),
    };
    wait_for(&socket);
    wait_for(&stats);

    let stats_line = || {
        let mut line = String::new();
        UnixStream::connect(&stats)
            .unwrap()
            .read_to_string(&mut line)
            .unwrap();
        assert!(line.starts_with("{\"executor\":\"sim\","), "{line}");
        line
    };
    let wait_stats = |active: u32, total: u32| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let line = stats_line();
            if line.contains(&format!("\"connections_active\":{active},"))
                && line.contains(&format!("\"connections_total\":{total},"))
            {
                return;
            }
            assert!(Instant::now() < deadline, "want {active}/{total}: {line}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    // Two frontends at once, each with a connection of its own; each one
    // that leaves is torn down while the other stays.
    let (first, _) = frontend(&socket);
    let (second, _) = frontend(&socket);
    wait_stats(2, 2);
    drop(first);
    wait_stats(1, 2);
    drop(second);
    wait_stats(0, 2);

    // SAFETY: kill only sends a signal to the child we started.
    let rc = unsafe { libc::kill(daemon.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = daemon.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists());
    assert!(!stats.exists());
}

#[test]
fn inherited_listening_socket_is_served() {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixListener;
    use std::os::unix::process::CommandExt;

    let dir = std::env::temp_dir().join(format!("rgpu-cli-fd-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("inherited.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let fd = listener.as_raw_fd();
    let mut command = Command::new(BIN);
    command
        .args(["--executor", "sim", "--fd", &fd.to_string()])
        .env("RGPU_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap());
    // SAFETY: the closure only calls fcntl, which is async-signal-safe, to
    // let the child inherit the listening socket.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut daemon = Daemon {
        child: command.spawn().unwrap(),
        dir: dir.clone(),
    };
    drop(listener);

    // The daemon accepts (and so answers the vhost-user handshake): ask for
    // its features and read the reply header.
    let (_stream, features) = frontend(&socket);
    assert_ne!(features & (1 << 32), 0, "VERSION_1 offered: {features:#x}");

    // SAFETY: kill only sends a signal to the child we started.
    let rc = unsafe { libc::kill(daemon.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(daemon.child.wait().unwrap().success());
    // Not ours to remove.
    assert!(socket.exists());
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<libc::pid_t> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            if let Some(child) = head.split_whitespace().next().and_then(|p| p.parse().ok()) {
                children.push(child);
            }
        }
    }
    children
}

fn process_exists(pid: libc::pid_t) -> bool {
    // A zombie still exists for kill(0); /proc/PID/stat tells them apart.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Each connection has a process of its own: one killed is reaped and its
/// gauges drop while the totals stay; when the parent dies, every
/// connection process dies with it.
#[test]
fn connection_processes_are_reaped_and_die_with_the_parent() {
    let dir = std::env::temp_dir().join(format!("rgpu-cli-procs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("rgpu.sock");
    let stats = dir.join("stats.sock");
    let log = dir.join("daemon.log");
    let mut daemon = Daemon {
        child: Command::new(BIN)
            .args(["--executor", "sim", "--socket-path"])
            .arg(&socket)
            .arg("--stats-socket")
            .arg(&stats)
            .env("RGPU_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        dir: dir.clone(),
    };
    wait_for(&socket);
    wait_for(&stats);
    let wait_stats = |want: &[&str]| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut line = String::new();
            UnixStream::connect(&stats)
                .unwrap()
                .read_to_string(&mut line)
                .unwrap();
            if want.iter().all(|w| line.contains(w)) {
                return;
            }
            assert!(Instant::now() < deadline, "want {want:?}: {line}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    let (first, _) = frontend(&socket);
    let (_second, _) = frontend(&socket);
    wait_stats(&["\"connections_active\":2,", "\"connections_total\":2,"]);
    // Two serving, one standby.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut children = children_of(daemon.child.id());
    while children.len() < 3 {
        assert!(Instant::now() < deadline, "children: {children:?}");
        std::thread::sleep(Duration::from_millis(10));
        children = children_of(daemon.child.id());
    }
    assert_eq!(children.len(), 3, "{children:?}");

    // Kill the process serving `first`: the one whose connection number is 1.
    let serving_first = children
        .iter()
        .copied()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|cmd| {
                    let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
                    args.windows(2)
                        .any(|w| w[0] == b"--serve-one-connection" && w[1] == b"1")
                })
                .unwrap_or(false)
        })
        .expect("the process of connection 1");
    // SAFETY: kill only sends a signal to a process of the daemon we started.
    assert_eq!(unsafe { libc::kill(serving_first, libc::SIGKILL) }, 0);
    wait_stats(&["\"connections_active\":1,", "\"connections_total\":2,"]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("process {serving_first} ended abnormally")),
        "{text}"
    );
    drop(first);

    // The parent dies without cleaning up: its children follow.
    let parent = daemon.child.id();
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while children.iter().any(|pid| process_exists(*pid)) {
        assert!(Instant::now() < deadline, "orphans left: {children:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // What a killed daemon leaves behind (the next one would remove it).
    let prefix = format!("rgpu-modules-{parent}-");
    for entry in std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
    }
}

/// `--config` stands for --socket-path and --memory-limit (each tenant has
/// its own); `ctl` without a daemon says so and fails.
#[test]
fn config_excludes_socket_path_and_ctl_needs_a_daemon() {
    for args in [
        &["--config", "/tmp/x.toml", "--socket-path", "/tmp/x.sock"][..],
        &["--config", "/tmp/x.toml", "--memory-limit", "1GiB"][..],
        &["--config", "/tmp/x.toml", "--fd", "3"][..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("cannot be used with"), "{args:?}: {text}");
    }
    let out = Command::new(BIN)
        .args([
            "ctl",
            "--control-socket",
            "/nonexistent/control.sock",
            "list",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("cannot connect to the control socket /nonexistent/control.sock"),
        "{text}"
    );
}

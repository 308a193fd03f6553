//! The daemon binary's command line.

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
    let first = UnixStream::connect(&socket).unwrap();
    let second = UnixStream::connect(&socket).unwrap();
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
        .stdout(Stdio::null());
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
    let mut stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    use std::io::Write;
    // VHOST_USER_GET_FEATURES (1), flags version 1, no payload.
    stream
        .write_all(&[1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_le_bytes(reply[..4].try_into().unwrap()), 1);
    let features = u64::from_le_bytes(reply[12..20].try_into().unwrap());
    assert_ne!(features & (1 << 32), 0, "VERSION_1 offered: {features:#x}");

    // SAFETY: kill only sends a signal to the child we started.
    let rc = unsafe { libc::kill(daemon.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(daemon.child.wait().unwrap().success());
    // Not ours to remove.
    assert!(socket.exists());
}

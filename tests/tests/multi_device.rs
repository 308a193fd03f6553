//! Several GPUs in one application (`RGPU_DEVICES`): two sim daemons on two
//! sockets, one CUDA device each, and `multi_device_test.c` using both
//! (copies between them are staged through the process).

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rgpu_tests::{Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);

/// `RGPU_DEVICES` naming these sockets, in order.
fn device_list(sockets: &[&Path]) -> String {
    sockets
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(",")
}

/// The program as a guest of `daemon`, with `RGPU_DEVICES=devices`.
fn command(guest: &GuestLib, program: &Path, daemon: &Daemon, devices: &str) -> Command {
    let mut command = guest.command(program, daemon);
    command.env("RGPU_DEVICES", devices);
    command
}

/// Log lines of the guest's at WARN or ERROR level.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

#[test]
fn one_program_uses_a_device_on_each_daemon() {
    let guest = GuestLib::new();
    let program = guest.build_program("multi_device_test.c");
    let first = Daemon::start("sim");
    // Its limit is what the guest sees as device 1's memory: the devices
    // come from their own carriers, in the list's order.
    let second = Daemon::start_with("sim", &["--memory-limit", "256MiB"], &[]);
    let devices = device_list(&[first.socket(), second.socket()]);

    // RGPU_SOCKET names the second daemon: RGPU_DEVICES wins over it.
    let mut run = command(&guest, &program, &second, &devices);
    run.env("RGPU_LOG", "info");
    let outcome = GuestProcess::spawn(run).finish(RUN_TIMEOUT);
    outcome.assert_passed("multi_device_test");
    let stdout = &outcome.stdout;
    assert!(stdout.contains("device 0: "), "{stdout}");
    assert!(
        stdout.contains("device 0: rgpu-sim (test fixture, no GPU), 16384 MiB"),
        "{stdout}"
    );
    assert!(
        stdout.contains("device 1: rgpu-sim (test fixture, no GPU), 256 MiB"),
        "{stdout}"
    );
    assert!(
        warnings(&outcome.stderr).is_empty(),
        "the guest warned:\n{}",
        outcome.stderr
    );
    assert!(
        outcome.stderr.contains("RGPU_DEVICES entry 1: 1 device(s)"),
        "{}",
        outcome.stderr
    );

    for (name, daemon) in [("first", &first), ("second", &second)] {
        let stats = daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
        assert!(stats.get("sessions_total") >= 1, "{name}: {stats:?}");
        assert!(stats.get("commands_executed") > 0, "{name}: {stats:?}");
        assert_eq!(
            stats.get("device_memory_bytes"),
            0,
            "{name} leaked device memory: {stats:?}"
        );
    }
    // The second daemon served the primary context and cuCtxCreate's.
    assert!(second.stats().get("sessions_total") >= 2);

    // Both daemons serve on.
    let mut first = first;
    let mut second = second;
    assert!(first.is_alive(), "the first daemon died:\n{}", first.log());
    assert!(
        second.is_alive(),
        "the second daemon died:\n{}",
        second.log()
    );
    let again = device_list(&[second.socket(), first.socket()]);
    let outcome =
        GuestProcess::spawn(command(&guest, &program, &first, &again)).finish(RUN_TIMEOUT);
    outcome.assert_passed("multi_device_test");
    assert!(
        outcome
            .stdout
            .contains("device 0: rgpu-sim (test fixture, no GPU), 256 MiB"),
        "{}",
        outcome.stdout
    );
}

/// The port of a daemon's `--listen 127.0.0.1:0` listener, from its log.
fn remote_port(daemon: &Daemon) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = daemon.log();
        let port = log.lines().find_map(|line| {
            let rest = line.split("remote clients on 127.0.0.1:").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        });
        if let Some(port) = port {
            return port;
        }
        assert!(Instant::now() < deadline, "no remote listener:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A local daemon and a network one (plaintext on loopback) in one list:
/// carriers of both kinds side by side.
#[test]
fn a_local_and_a_network_daemon_side_by_side() {
    let guest = GuestLib::new();
    let program = guest.build_program("multi_device_test.c");
    let local = Daemon::start("sim");
    let mut network = Daemon::start_with(
        "sim",
        &["--listen", "127.0.0.1:0", "--allow-plaintext"],
        &[],
    );
    let url = format!("tcp://127.0.0.1:{}", remote_port(&network));
    let devices = format!("{url},{}", local.socket().to_string_lossy());
    let outcome =
        GuestProcess::spawn(command(&guest, &program, &local, &devices)).finish(RUN_TIMEOUT);
    outcome.assert_passed("multi_device_test");
    assert!(
        warnings(&outcome.stderr).is_empty(),
        "the guest warned:\n{}",
        outcome.stderr
    );
    for daemon in [&local, &network] {
        let stats = daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
        assert!(stats.get("sessions_total") >= 1, "{stats:?}");
        assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
    }
    assert!(network.is_alive(), "{}", network.log());
}

#[test]
fn a_bad_entry_fails_cu_init_naming_it() {
    let guest = GuestLib::new();
    let program = guest.build_program("multi_device_test.c");
    let daemon = Daemon::start("sim");
    let socket = daemon.socket().to_string_lossy().into_owned();

    let outcome = GuestProcess::spawn(command(&guest, &program, &daemon, &format!("{socket},drn")))
        .finish(RUN_TIMEOUT);
    assert!(!outcome.status.success(), "{}", outcome.stdout);
    assert!(
        outcome.stdout.contains("cuInit failed"),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome
            .stderr
            .contains("RGPU_DEVICES entry 1 (\"drn\"): not a carrier"),
        "{}",
        outcome.stderr
    );

    let absent = daemon.dir().join("absent.sock");
    let absent = absent.to_string_lossy();
    let outcome = GuestProcess::spawn(command(
        &guest,
        &program,
        &daemon,
        &format!("{socket},{absent}"),
    ))
    .finish(RUN_TIMEOUT);
    assert!(
        outcome
            .stdout
            .contains("cuInit failed: 100 (CUDA_ERROR_NO_DEVICE)"),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome.stderr.contains(&format!(
            "RGPU_DEVICES entry 1 (\"{absent}\"): cannot connect"
        )),
        "{}",
        outcome.stderr
    );
    assert!(daemon.stats().get("sessions_total") == 0);
}

//! The Prometheus endpoint (`--metrics-listen`) and `vhost-device-rgpu top`,
//! through a real daemon with the sim executor: a guest holding 256 MiB of
//! a 256 MiB tenant shows as such, and once it exits its memory is back to
//! 0 while the commands it ran stay counted.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use rgpu_tests::{Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
const LOG_TIMEOUT: Duration = Duration::from_secs(20);
const MIB_256: u64 = 256 << 20;
/// What the daemon logs once its endpoint listens.
const LISTENING_LOG: &str = "metrics on http://";

/// The endpoint's address, from the daemon's log (it was asked for port 0,
/// so the kernel picked a free one).
fn metrics_address(daemon: &Daemon) -> String {
    let deadline = Instant::now() + LOG_TIMEOUT;
    loop {
        let log = daemon.log();
        let address = log.lines().find_map(|line| {
            let (_, rest) = line.split_once(LISTENING_LOG)?;
            rest.strip_suffix("/metrics").map(str::to_owned)
        });
        if let Some(address) = address {
            assert!(address.starts_with("127.0.0.1:"), "{address}");
            return address;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not log its metrics address:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The body of `GET http://ADDRESS/metrics` (HTTP/1.0: no chunking).
fn scrape(address: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect to the metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200 OK\r\n") || head.starts_with("HTTP/1.1 200 OK\r\n"),
        "{head}"
    );
    body.to_owned()
}

/// The value of `NAME{tenant="default"}`, if the scrape has that series.
fn value(body: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}{{tenant=\"default\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
}

/// Scrapes until `done` holds; panics with the last scrape after `timeout`.
fn wait_for_scrape(address: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + ACCOUNTING_TIMEOUT;
    loop {
        let body = scrape(address);
        if done(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "waited {ACCOUNTING_TIMEOUT:?} for {what}; last scrape:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `vhost-device-rgpu top --metrics ADDRESS --once`.
fn top_once(address: &str) -> std::process::Output {
    Command::new(Daemon::binary())
        .args(["top", "--metrics", address, "--once"])
        .output()
        .expect("run vhost-device-rgpu top")
}

#[test]
fn the_endpoint_and_top_show_a_tenants_use() {
    let guest = GuestLib::new();
    let program = guest.build_program("memory_limit_test.c");
    let daemon = Daemon::start_with(
        "sim",
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--memory-limit",
            "256MiB",
        ],
        &[],
    );
    let address = metrics_address(&daemon);

    let idle = scrape(&address);
    assert_eq!(
        value(&idle, "rgpu_tenant_device_memory_bytes"),
        Some(0),
        "{idle}"
    );
    assert_eq!(
        value(&idle, "rgpu_tenant_device_memory_limit_bytes"),
        Some(MIB_256),
        "{idle}"
    );

    // A guest that takes the whole 256 MiB (16 MiB blocks, stopping at the
    // limit without an error) and holds it.
    let release = daemon.dir().join("release");
    let mut command = guest.command(&program, &daemon);
    command
        .args(["--max-mb", "256", "--hold-file"])
        .arg(&release);
    let mut holder = GuestProcess::spawn(command);
    holder.wait_for_line("holding", RUN_TIMEOUT);

    // Device memory is counted in the tenant's page at once; the other
    // counters are published by the connection process every 50 ms.
    let holding = wait_for_scrape(&address, "the holder's session", |body| {
        value(body, "rgpu_tenant_sessions").is_some_and(|n| n >= 1)
    });
    assert_eq!(
        value(&holding, "rgpu_tenant_device_memory_bytes"),
        Some(MIB_256),
        "{holding}"
    );
    assert_eq!(
        value(&holding, "rgpu_tenant_device_memory_limit_bytes"),
        Some(MIB_256),
        "{holding}"
    );
    for gauge in ["rgpu_tenant_workers", "rgpu_tenant_connections"] {
        assert!(
            value(&holding, gauge).is_some_and(|v| v >= 1),
            "{gauge}:\n{holding}"
        );
    }
    // The scheduler's measure of GPU time is exported (a float counter).
    assert!(
        holding
            .lines()
            .any(|l| l.starts_with("rgpu_tenant_gpu_busy_seconds_total{tenant=\"default\"} ")),
        "{holding}"
    );
    for line in holding.lines().filter(|l| l.starts_with("rgpu_tenant_")) {
        println!("while holding: {line}");
    }

    let top = top_once(&address);
    let table = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&top.stderr)
    );
    let row: Vec<&str> = table
        .lines()
        .find(|line| line.starts_with("default "))
        .map(|line| line.split_whitespace().collect())
        .unwrap_or_default();
    // TENANT SESSIONS WORKERS CONNS MEM-MiB LIMIT-MiB CMD/S GPU% ERRORS
    assert_eq!(row.len(), 9, "{table}");
    assert_eq!(
        (row[4], row[5], row[6], row[7]),
        ("256.0", "256.0", "-", "-"),
        "{table}"
    );
    assert!(row[1].parse::<u64>().is_ok_and(|s| s >= 1), "{table}");
    println!("top --once while holding:\n{table}");

    // The guest frees and exits: its memory is back, its commands stay.
    std::fs::write(&release, b"").expect("create the release file");
    let outcome = holder.finish(RUN_TIMEOUT);
    assert!(
        outcome.status.success(),
        "{}{}",
        outcome.stdout,
        outcome.stderr
    );
    let after = wait_for_scrape(&address, "the holder gone", |body| {
        value(body, "rgpu_tenant_device_memory_bytes") == Some(0)
            && value(body, "rgpu_tenant_sessions") == Some(0)
    });
    assert!(
        value(&after, "rgpu_tenant_commands_total").is_some_and(|n| n > 0),
        "{after}"
    );
    assert_eq!(
        value(&after, "rgpu_tenant_command_errors_total"),
        Some(0),
        "{after}"
    );
    for line in after.lines().filter(|l| l.starts_with("rgpu_tenant_")) {
        println!("after the holder exited: {line}");
    }

    // Once the daemon is gone, top says so and fails.
    drop(daemon);
    let gone = top_once(&address);
    let message = String::from_utf8_lossy(&gone.stderr);
    assert!(!gone.status.success(), "{message}");
    assert!(
        message.contains("cannot reach the daemon's metrics"),
        "{message}"
    );
}

#[test]
fn a_busy_metrics_address_stops_the_daemon_at_start_up() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let address = taken.local_addr().expect("its address").to_string();
    let dir = rgpu_tests::TempDir::new("rgpu-metrics-busy").expect("a temp dir");
    let output = Command::new(Daemon::binary())
        .args([
            "--executor",
            "sim",
            "--metrics-listen",
            &address,
            "--socket-path",
        ])
        .arg(dir.join("rgpu.sock"))
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run the daemon");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{log}");
    assert!(
        log.contains(&format!("cannot listen for metrics on {address}")),
        "{log}"
    );
    assert!(
        !dir.join("rgpu.sock").exists(),
        "the socket was left behind"
    );
}

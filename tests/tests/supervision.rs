//! The parent process never takes its tenants down with it: a standby
//! connection process that dies is replaced while the others serve on; the
//! connection processes are bounded (`--max-connections`); connections
//! whose frontend says nothing cost no process and do not hold up the
//! others, and are closed after `--handshake-timeout-s`.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_tests::{children_of, Daemon, DriverApiFixture};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the daemon may take to replace a standby that died.
const REPLACE_TIMEOUT: Duration = Duration::from_secs(20);
/// What the daemon logs when it closes a silent connection.
const HANDSHAKE_TIMEOUT_LOG: &str = "did not start vhost-user negotiation";

/// A connection process of the daemon, as /proc shows it.
#[derive(Debug, Clone, Copy)]
struct ConnectionProcess {
    pid: libc::pid_t,
    /// Its `--serve-one-connection` number: the newest has the highest.
    conn: u64,
    zombie: bool,
}

/// The daemon's child processes: its connection processes.
fn connection_processes(daemon_pid: u32) -> Vec<ConnectionProcess> {
    children_of(daemon_pid)
        .into_iter()
        .filter_map(|child| {
            let conn = std::fs::read(format!("/proc/{}/cmdline", child.pid))
                .ok()
                .and_then(|cmdline| {
                    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                    args.windows(2)
                        .find(|w| w[0] == b"--serve-one-connection")
                        .and_then(|w| std::str::from_utf8(w[1]).ok()?.parse().ok())
                })
                .unwrap_or(0);
            Some(ConnectionProcess {
                pid: libc::pid_t::try_from(child.pid).ok()?,
                conn,
                zombie: child.zombie,
            })
        })
        .collect()
}

/// The standby: the newest live connection process, once it is newer than
/// connection `after` (so a replacement is not mistaken for the one killed).
fn wait_for_standby(daemon: &mut Daemon, after: u64) -> ConnectionProcess {
    let deadline = Instant::now() + REPLACE_TIMEOUT;
    loop {
        assert!(
            daemon.is_alive(),
            "the daemon exited instead of replacing its standby:\n{}",
            daemon.log()
        );
        let newest = connection_processes(daemon.pid())
            .into_iter()
            .filter(|c| !c.zombie)
            .max_by_key(|c| c.conn);
        if let Some(standby) = newest.filter(|c| c.conn > after) {
            return standby;
        }
        assert!(
            Instant::now() < deadline,
            "no standby newer than connection {after} within {REPLACE_TIMEOUT:?}:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// kill -9 of the standby (three times over) while a client runs: the
/// client finishes with its checks passed and the daemon serves the next.
#[test]
fn killed_standby_is_replaced_while_a_client_runs() {
    let mut f = DriverApiFixture::new(&[]);
    let stop_file = f.daemon.dir().join("stop");
    let mut client = f.spawn_until_stopped(&stop_file);
    client.wait_for_line("running", RUN_TIMEOUT);

    // Connection 1 serves the client; the standby is the newest process.
    let mut killed = 1;
    for _ in 0..3 {
        let standby = wait_for_standby(&mut f.daemon, killed);
        // SAFETY: kill only sends a signal, to a child of the daemon we
        // started (not reaped: it is not a zombie).
        assert_eq!(unsafe { libc::kill(standby.pid, libc::SIGKILL) }, 0);
        killed = standby.conn;
    }
    // A replacement for the last one, too.
    wait_for_standby(&mut f.daemon, killed);
    assert!(f.daemon.is_alive(), "{}", f.daemon.log());

    std::fs::write(&stop_file, b"stop").expect("create the stop file");
    client
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the client running while its standby was killed");
    f.spawn(&["--big-mb", "4"])
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the next client");
    assert!(f.daemon.is_alive(), "{}", f.daemon.log());
    let log = f.daemon.log();
    assert!(
        log.matches("starting another in").count() >= 3,
        "each replacement is logged:\n{log}"
    );
}

/// Parses the daemon's rate-limited "closed N connection(s) whose frontend
/// did not start vhost-user negotiation" lines and sums the Ns.
fn silent_connections_closed(log: &str) -> usize {
    log.lines()
        .filter(|line| line.contains(HANDSHAKE_TIMEOUT_LOG))
        .filter_map(|line| {
            let count = line.split("closed ").nth(1)?.split(' ').next()?;
            count.parse::<usize>().ok()
        })
        .sum()
}

/// 300 connections that never say a word, at the default limits
/// (`--max-connections 64`, `--handshake-timeout-s 10`, given explicitly):
/// the parent holds them without a process each, so a client that comes
/// after them is served at once (within 10 s, not after the silent ones'
/// timeout), the connection processes never exceed the cap plus the
/// standby, and each silent connection is closed after the timeout.
#[test]
fn silent_connections_are_bounded_and_closed() {
    const CAP: usize = 64;
    const SILENT: usize = 300;
    const HANDSHAKE_TIMEOUT_S: u64 = 10;
    const CLIENT_WITHIN: Duration = Duration::from_secs(10);
    let handshake_timeout = Duration::from_secs(HANDSHAKE_TIMEOUT_S);
    let cap = CAP.to_string();
    let timeout = HANDSHAKE_TIMEOUT_S.to_string();
    let mut f = DriverApiFixture::new(&[
        "--max-connections",
        cap.as_str(),
        "--handshake-timeout-s",
        timeout.as_str(),
    ]);
    // The standby is up: the client's time is not the daemon's start-up.
    wait_for_standby(&mut f.daemon, 0);

    // Count the daemon's children all along.
    let most_children = Arc::new(AtomicUsize::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let most = Arc::clone(&most_children);
        let sampling = Arc::clone(&sampling);
        let daemon_pid = f.daemon.pid();
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                most.fetch_max(connection_processes(daemon_pid).len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let started = Instant::now();
    let mut silent: Vec<UnixStream> = (0..SILENT)
        .map(|_| UnixStream::connect(f.daemon.socket()).expect("connect a silent client"))
        .collect();
    let connected_in = started.elapsed();

    // A client after all of them is served at once.
    let client_started = Instant::now();
    f.spawn(&["--big-mb", "4"])
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the client after the silent ones");
    let client_took = client_started.elapsed();
    let children_after_client = connection_processes(f.daemon.pid()).len();

    // Still within their timeout, the silent connections are open.
    if started.elapsed() < handshake_timeout {
        for stream in &silent {
            stream.set_nonblocking(true).expect("set non-blocking");
            let mut byte = [0u8; 1];
            match (&*stream).read(&mut byte) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => panic!(
                    "a silent connection ended before its timeout: {other:?}\n{}",
                    f.daemon.log()
                ),
            }
            stream.set_nonblocking(false).expect("set blocking");
        }
    }

    // Then the daemon closes every one (end of file, not our timeout).
    let mut first_closed_after = None;
    for (i, stream) in silent.iter_mut().enumerate() {
        stream
            .set_read_timeout(Some(handshake_timeout + Duration::from_secs(20)))
            .expect("set a read timeout");
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => {}
            other => panic!(
                "silent connection {i} was not closed by the daemon: {other:?}\n{}",
                f.daemon.log()
            ),
        }
        first_closed_after.get_or_insert_with(|| started.elapsed());
    }
    let closed_all_after = started.elapsed();
    drop(silent);

    // Back to the standby alone.
    let deadline = Instant::now() + REPLACE_TIMEOUT;
    loop {
        let children = connection_processes(f.daemon.pid());
        if children.len() == 1 && !children[0].zombie {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon still has {} children: {children:?}\n{}",
            children.len(),
            f.daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // And a client that comes now is served at once too.
    let now = Instant::now();
    f.spawn(&["--big-mb", "4"])
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the client after the silent ones were closed");
    let served_in = now.elapsed();

    sampling.store(false, Ordering::Relaxed);
    sampler.join().expect("the sampler thread");
    let most = most_children.load(Ordering::Relaxed);
    eprintln!(
        "{SILENT} silent connections (connected in {connected_in:.1?}), cap {CAP}, handshake \
         timeout {HANDSHAKE_TIMEOUT_S} s: the client after them took {client_took:.2?} \
         ({children_after_client} connection processes then); the silent ones were closed \
         {:.1?} to {closed_all_after:.1?} after connecting; at most {most} connection \
         processes; the next client took {served_in:.2?}",
        first_closed_after.unwrap_or_default()
    );
    assert!(
        client_took < CLIENT_WITHIN,
        "the client after {SILENT} silent connections took {client_took:?}"
    );
    assert!(
        most <= CAP + 1,
        "{most} connection processes at once (cap {CAP}, plus the standby)"
    );
    assert!(
        first_closed_after.is_some_and(|t| t >= handshake_timeout),
        "silent connections were closed after {first_closed_after:?}, before the \
         {handshake_timeout:?} timeout"
    );
    assert!(
        served_in < CLIENT_WITHIN,
        "the client after the silent ones were closed took {served_in:?}"
    );
    // The closings are logged with a count, at most once a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    while silent_connections_closed(&f.daemon.log()) < SILENT && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = f.daemon.log();
    assert_eq!(
        silent_connections_closed(&log),
        SILENT,
        "every silent connection counted as closed at its timeout:\n{log}"
    );
    assert!(
        log.lines()
            .filter(|l| l.contains(HANDSHAKE_TIMEOUT_LOG))
            .count()
            <= connected_in.as_secs() as usize + 3,
        "the closings are logged with a count, not one line each:\n{log}"
    );
    assert!(f.daemon.is_alive(), "{log}");
    // Silent connections never reached a connection process.
    f.daemon
        .wait_for_stats(Duration::from_secs(15), "connections_active == 0", |s| {
            s.get("connections_active") == 0 && s.get("connections_total") == 2
        });
}

/// At `--max-connections 1` the one connection process serves the first
/// client; a second one, which spoke, waits in the daemon (no second
/// process) and is served when the first ends.
#[test]
fn a_client_beyond_the_cap_waits_for_a_slot() {
    let mut f = DriverApiFixture::new(&["--max-connections", "1"]);
    let stop_file = f.daemon.dir().join("stop");
    let mut first = f.spawn_until_stopped(&stop_file);
    first.wait_for_line("running", RUN_TIMEOUT);
    let second = f.spawn(&["--big-mb", "4"]);

    // The second waits (it is not served, nor turned away) while the first
    // holds the only slot.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let children = connection_processes(f.daemon.pid());
        assert!(
            children.iter().filter(|c| !c.zombie).count() <= 1,
            "{children:?}"
        );
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", second.id()))
            .expect("the second client is still running");
        assert!(
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            "the second client ended while the first held the only slot:\n{}",
            f.daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    std::fs::write(&stop_file, b"stop").expect("create the stop file");
    first
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the client holding the only slot");
    second
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the client that waited for the slot");
    assert!(f.daemon.is_alive(), "{}", f.daemon.log());
}

/// The handshake timeout waits only for the start of negotiation: a
/// frontend that asked for the features and then waits (as a VMM does until
/// its guest's driver starts the device) keeps its connection; a silent one
/// beside it is closed.
#[test]
fn a_negotiating_frontend_outlives_the_handshake_timeout() {
    use std::io::Write;

    let daemon = Daemon::start_with("sim", &["--handshake-timeout-s", "1"], &[]);
    let mut silent = UnixStream::connect(daemon.socket()).expect("connect a silent client");
    let mut frontend = UnixStream::connect(daemon.socket()).expect("connect a frontend");
    // VHOST_USER_GET_FEATURES (1), flags: version 1, no payload.
    frontend
        .write_all(&[1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
        .expect("ask for the features");
    frontend
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    let mut reply = [0u8; 20];
    frontend.read_exact(&mut reply).expect("the features");
    assert_eq!(reply[..4], [1, 0, 0, 0], "a GET_FEATURES reply: {reply:?}");

    // Well past the timeout: the silent one is closed, the other is not.
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    let mut byte = [0u8; 1];
    assert!(
        matches!(silent.read(&mut byte), Ok(0)),
        "the silent connection was not closed:\n{}",
        daemon.log()
    );
    std::thread::sleep(Duration::from_secs(2));
    frontend
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("set a read timeout");
    match frontend.read(&mut byte) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!(
            "the negotiating frontend's connection ended: {other:?}\n{}",
            daemon.log()
        ),
    }
    let stats = daemon.stats();
    assert_eq!(stats.get("connections_active"), 1, "{stats:?}");
    assert_eq!(daemon.log().matches(HANDSHAKE_TIMEOUT_LOG).count(), 1);
}

/// What a sim daemon started with `options` printed when it refused
/// them (it must refuse them).
fn refusal(options: &[&str]) -> String {
    let out = std::process::Command::new(Daemon::binary())
        .args([
            "--executor",
            "sim",
            "--socket-path",
            "/nonexistent/rgpu.sock",
        ])
        .args(options)
        .output()
        .expect("run the daemon");
    assert!(!out.status.success(), "{options:?} accepted: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn limits_below_one_are_refused() {
    for option in ["--max-connections", "--handshake-timeout-s"] {
        let stderr = refusal(&[option, "0"]);
        assert!(stderr.contains(option), "{option}: {stderr}");
    }
}

#[test]
fn launch_cpus_that_are_not_a_list_of_this_machines_cpus_are_refused() {
    for (list, said) in [
        ("4096", "CPU 4096 is not on this machine"),
        ("3-1", "the range `3-1` ends before it starts"),
        ("0,x", "`x` is not a CPU number"),
    ] {
        let stderr = refusal(&["--launch-cpus", list]);
        assert!(stderr.contains(said), "--launch-cpus {list}: {stderr}");
    }
}

/// `--profile-launches`: a client killed while it holds its context still
/// gets its profile logged. At the connection's end the workers are given
/// a moment to end their sessions (and log) before they are killed;
/// without that, a program that exits without releasing its contexts (as
/// PyTorch does) was never profiled.
#[test]
fn a_killed_clients_profile_is_logged() {
    let f = DriverApiFixture::new(&["--profile-launches"]);
    let stop_file = f.daemon.dir().join("stop");
    let mut client = f.spawn_until_stopped(&stop_file);
    client.wait_for_line("running", RUN_TIMEOUT);
    client.kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f.daemon.log().contains(": profile: ") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = f.daemon.log();
    assert!(
        log.contains(": profile: "),
        "no profile logged for the killed client:\n{log}"
    );
}

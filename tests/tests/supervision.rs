//! The parent process never takes its tenants down with it: a standby
//! connection process that dies is replaced while the others serve on; the
//! connection processes are bounded (`--max-connections`); a connection
//! whose frontend never starts vhost-user negotiation is closed after
//! `--handshake-timeout-s`, freeing its slot.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_tests::{reference_ptx, Daemon, GuestLib, GuestProcess};

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

/// Every child process of `parent` (zombies included), from /proc.
fn children_of(parent: u32) -> Vec<ConnectionProcess> {
    let mut children = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return children;
    };
    for entry in entries.filter_map(Result::ok) {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let Some(pid) = head
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let conn = std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .and_then(|cmdline| {
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                args.windows(2)
                    .find(|w| w[0] == b"--serve-one-connection")
                    .and_then(|w| std::str::from_utf8(w[1]).ok()?.parse().ok())
            })
            .unwrap_or(0);
        children.push(ConnectionProcess {
            pid,
            conn,
            zombie: state == Some("Z"),
        });
    }
    children
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
        let newest = children_of(daemon.pid())
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

struct Fixture {
    // Field order is drop order: the guests' library dir, then the daemon.
    guest: GuestLib,
    program: PathBuf,
    daemon: Daemon,
}

impl Fixture {
    fn new(daemon_args: &[&str]) -> Self {
        let guest = GuestLib::new();
        let program = guest.build_program("driver_api_test.c");
        let daemon = Daemon::start_with("sim", daemon_args, &[]);
        Self {
            guest,
            program,
            daemon,
        }
    }

    fn spawn(&self, args: &[&str]) -> GuestProcess {
        let mut command = self.guest.command(&self.program, &self.daemon);
        command.arg("--ptx").arg(reference_ptx()).args(args);
        GuestProcess::spawn(command)
    }
}

/// kill -9 of the standby (three times over) while a client runs: the
/// client finishes with its checks passed and the daemon serves the next.
#[test]
fn killed_standby_is_replaced_while_a_client_runs() {
    let mut f = Fixture::new(&[]);
    let stop_file = f.daemon.dir().join("stop");
    let stop_arg = stop_file.to_string_lossy().into_owned();
    let mut client = f.spawn(&[
        "--iterations",
        "100000",
        "--hold-ms",
        "20",
        "--big-mb",
        "4",
        "--stop-file",
        stop_arg.as_str(),
    ]);
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

/// 300 connections that never say a word: at most `--max-connections`
/// processes at any time; each silent connection is closed after
/// `--handshake-timeout-s`, so the backlog drains at `--max-connections`
/// per timeout, a client queued behind them is served when its turn comes,
/// and one that comes afterwards is served at once.
#[test]
fn silent_connections_are_bounded_and_closed() {
    const CAP: usize = 8;
    const SILENT: usize = 300;
    const HANDSHAKE_TIMEOUT_S: u64 = 1;
    let cap = CAP.to_string();
    let timeout = HANDSHAKE_TIMEOUT_S.to_string();
    let mut f = Fixture::new(&[
        "--max-connections",
        cap.as_str(),
        "--handshake-timeout-s",
        timeout.as_str(),
    ]);

    // Count the daemon's children all along.
    let most_children = Arc::new(AtomicUsize::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let most = Arc::clone(&most_children);
        let sampling = Arc::clone(&sampling);
        let daemon_pid = f.daemon.pid();
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                most.fetch_max(children_of(daemon_pid).len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let started = Instant::now();
    let silent: Vec<UnixStream> = (0..SILENT)
        .map(|_| UnixStream::connect(f.daemon.socket()).expect("connect a silent client"))
        .collect();
    // Queued behind all of them: served once they have been closed, some
    // SILENT / CAP handshake timeouts (plus process starts) from now.
    let rounds = SILENT.div_ceil(CAP) as u32;
    let drained_within = Duration::from_secs(HANDSHAKE_TIMEOUT_S + 2) * rounds;
    f.spawn(&["--big-mb", "4"])
        .finish(drained_within + RUN_TIMEOUT)
        .assert_checks_passed("the client queued behind the silent ones");
    let queued_for = started.elapsed();

    // The daemon closed every silent connection (end of file, not our
    // timeout). The last ones accepted may still be within their timeout.
    for (i, mut stream) in silent.into_iter().enumerate() {
        stream
            .set_read_timeout(Some(Duration::from_secs(HANDSHAKE_TIMEOUT_S + 20)))
            .expect("set a read timeout");
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => {}
            other => panic!(
                "silent connection {i} was not closed by the daemon: {other:?}\n{}",
                f.daemon.log()
            ),
        }
    }

    // A client that comes now is served at once.
    let now = Instant::now();
    f.spawn(&["--big-mb", "4"])
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("the client after the silent ones");
    let served_in = now.elapsed();

    sampling.store(false, Ordering::Relaxed);
    sampler.join().expect("the sampler thread");
    let most = most_children.load(Ordering::Relaxed);
    eprintln!(
        "{SILENT} silent connections, cap {CAP}, handshake timeout {HANDSHAKE_TIMEOUT_S} s: \
         at most {most} connection processes; the client queued behind them finished after \
         {queued_for:.1?}; the next one took {served_in:.1?}"
    );
    assert!(
        most <= CAP,
        "{most} connection processes at once (cap {CAP})"
    );
    assert!(
        queued_for < drained_within,
        "{SILENT} silent connections took {queued_for:?} to drain (expected about \
         {rounds} handshake timeouts)"
    );
    assert!(
        served_in < Duration::from_secs(10),
        "the client after the silent ones took {served_in:?}"
    );
    let log = f.daemon.log();
    assert_eq!(
        log.matches(HANDSHAKE_TIMEOUT_LOG).count(),
        SILENT,
        "one handshake timeout per silent connection:\n{log}"
    );
    assert!(f.daemon.is_alive(), "{log}");
    f.daemon
        .wait_for_stats(Duration::from_secs(15), "connections_active == 0", |s| {
            s.get("connections_active") == 0 && s.get("connections_total") >= SILENT as u64 + 2
        });
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

#[test]
fn limits_below_one_are_refused() {
    for option in ["--max-connections", "--handshake-timeout-s"] {
        let out = std::process::Command::new(Daemon::binary())
            .args([
                "--executor",
                "sim",
                "--socket-path",
                "/nonexistent/rgpu.sock",
            ])
            .args([option, "0"])
            .output()
            .expect("run the daemon");
        assert!(!out.status.success(), "{option} 0 accepted: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(option), "{option}: {stderr}");
    }
}

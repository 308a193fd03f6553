//! The network carrier end to end with the sim executor: guest programs
//! through `RGPU_SERVER=tls://…` to a daemon's `--listen`, with
//! certificates made by the test; every refusal case; a connection dropped
//! mid-run; tenants chosen by certificate.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rgpu_proto::remote::{HelloRole, Request, TOKEN_BYTES};
use rgpu_proto::{BlobRange, Command as CudaCommand};
use rgpu_tests::{reference_ptx, CertFiles, Daemon, GuestLib, GuestProcess, TempDir, TestPki};
use rgpu_transport::carrier::remote::{FrameStream, RemoteEndpoint};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a refused or cut-off program may take to fail.
const FAIL_TIMEOUT: Duration = Duration::from_secs(30);

/// The port of the daemon's remote listener, from its log.
fn remote_port(log: impl Fn() -> String) -> u16 {
    remote_port_other_than(log, None)
}

/// The port of a remote listener the log names, other than `skip`.
fn remote_port_other_than(log: impl Fn() -> String, skip: Option<u16>) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = log();
        let port = text.lines().find_map(|line| {
            let rest = line.split("remote clients on 127.0.0.1:").nth(1)?;
            let port: u16 = rest.split_whitespace().next()?.parse().ok()?;
            (Some(port) != skip).then_some(port)
        });
        if let Some(port) = port {
            return port;
        }
        assert!(Instant::now() < deadline, "no remote listener:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A guest program through `url`, with `env` (TLS files) added.
fn remote_command(
    guest: &GuestLib,
    program: &Path,
    url: &str,
    env: &[(String, String)],
) -> Command {
    let mut command = Command::new(program);
    command
        .env_remove("RGPU_SOCKET")
        .env_remove("RGPU_DEVICES")
        .env_remove("RGPU_TLS_CA")
        .env_remove("RGPU_TLS_CERT")
        .env_remove("RGPU_TLS_KEY")
        .env("RGPU_SERVER", url)
        .env("LD_LIBRARY_PATH", guest.lib_dir())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn ptx() -> String {
    reference_ptx().display().to_string()
}

fn tls_daemon(pki: &TestPki, extra: &[&str]) -> (Daemon, u16) {
    let mut args = pki.daemon_args("127.0.0.1:0");
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with("sim", &args, &[]);
    let port = remote_port(|| daemon.log());
    (daemon, port)
}

/// Issue 9's queries that never wait, through the network carrier: behind
/// queued launches of a slow kernel and during another thread's
/// synchronize, cuEventQuery and cuStreamQuery answer NOT_READY at once
/// (the gateway no longer waits until the requests sent before reach the
/// ring, only asks whether the item's own latest work did) and SUCCESS
/// once the work is done.
#[test]
fn event_and_stream_queries_never_wait_through_the_tls_carrier() {
    let pki = TestPki::new();
    let client = pki.ca.client("default", false);
    let (daemon, port) = tls_daemon(&pki, &[]);
    let guest = GuestLib::new();
    let url = format!("tls://localhost:{port}");
    let env = pki.client_env(Some(&client));
    let program = guest.build_c(
        &rgpu_tests::programs_dir().join("query_test.c"),
        &["-lcuda", "-lpthread"],
    );
    let mut command = remote_command(&guest, &program, &url, &env);
    // A query is a round trip over loopback TLS to a debug build here,
    // beside other tests' daemons on a CI machine's few CPUs: the program's
    // 5 ms bound was passed once at 5.5 ms. The never-waiting itself is
    // the gateway's unit test's; this one checks the answers.
    command.args([
        "--ptx",
        &ptx(),
        "--no-mapped-memory",
        "--quick-us",
        "100000",
    ]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    for line in outcome.stdout.lines().filter(|l| l.starts_with("MEASURED")) {
        println!("{line}");
    }
    outcome.assert_passed("query_test");
    drop(daemon);
}

#[test]
fn driver_api_and_runtime_style_programs_run_through_the_tls_carrier() {
    let pki = TestPki::new();
    let client = pki.ca.client("default", false);
    let (daemon, port) = tls_daemon(&pki, &[]);
    let guest = GuestLib::new();
    let url = format!("tls://localhost:{port}");
    let env = pki.client_env(Some(&client));

    let driver_api = guest.build_program("driver_api_test.c");
    let mut command = remote_command(&guest, &driver_api, &url, &env);
    command.args(["--ptx", &ptx(), "--bulk-pinned-mb", "41"]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test through tls://");

    // What runtimes and frameworks ask (primary context, proc addresses,
    // pointer attributes, occupancy, capture state).
    let queries = guest.build_program("framework_queries_test.c");
    let mut command = remote_command(&guest, &queries, &url, &env);
    command.args(["--image", &ptx(), "--process-only-host"]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_passed("framework_queries_test");

    // NVML, whose connection holds no CUDA context: its process must live
    // as long as its channel.
    let nvml = guest.build_c(
        &rgpu_tests::programs_dir().join("nvml_test.c"),
        &["-lnvidia-ml"],
    );
    GuestProcess::spawn(remote_command(&guest, &nvml, &url, &env))
        .finish(RUN_TIMEOUT)
        .assert_passed("nvml_test");

    // Device printf reaches the application's stdout, in order, and not the
    // daemon's output.
    let printf = guest.build_program("printf_test.c");
    let mut command = remote_command(&guest, &printf, &url, &env);
    command.arg(reference_ptx()).arg("4343");
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    let lines: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "printf_test: before the launch",
            "rgpu_printf 4343",
            "printf_test: after the synchronisation",
        ],
        "{outcome:?}"
    );
    assert!(!daemon.log().contains("rgpu_printf 4343"));

    // Each remote process was a connection of the tenant, and the host
    // freed everything when it ended.
    let log = daemon.log();
    assert!(
        log.contains("remote 127.0.0.1:") && log.contains("of tenant default connected"),
        "{log}"
    );
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let stats = daemon.stats();
    assert!(stats.get("connections_total") >= 2, "{stats:?}");
    assert_eq!(stats.get("device_memory_bytes"), 0, "{stats:?}");
}

/// Runs driver_api_test through `url` with `env`, which must fail at
/// cuInit with a message holding `words`; nothing reaches the host.
fn assert_refused(
    daemon: &Daemon,
    guest: &GuestLib,
    url: &str,
    env: &[(String, String)],
    words: &[&str],
) {
    let before = daemon.stats();
    let program = guest.build_program("driver_api_test.c");
    let mut command = remote_command(guest, &program, url, env);
    command.args(["--ptx", &ptx()]);
    let outcome = GuestProcess::spawn(command).finish(FAIL_TIMEOUT);
    assert!(!outcome.status.success(), "{outcome:?}");
    for word in words {
        assert!(
            outcome.stderr.contains(word),
            "{url}: no {word:?} in:\n{}",
            outcome.stderr
        );
    }
    let after = daemon.stats();
    for key in ["connections_total", "sessions_total"] {
        assert_eq!(
            before.get(key),
            after.get(key),
            "{key}: a refused client reached the host: {after:?}"
        );
    }
}

#[test]
fn clients_without_a_valid_certificate_are_refused_before_any_cuda_work() {
    let pki = TestPki::new();
    let (daemon, port) = tls_daemon(&pki, &[]);
    let guest = GuestLib::new();
    let url = format!("tls://localhost:{port}");

    // No certificate at all.
    assert_refused(
        &daemon,
        &guest,
        &url,
        &pki.client_env(None),
        &["refused this client's certificate", "CertificateRequired"],
    );
    // A certificate from a CA the daemon does not know.
    let stranger = pki.other_ca("stranger").client("default", false);
    assert_refused(
        &daemon,
        &guest,
        &url,
        &pki.client_env(Some(&stranger)),
        &["refused this client's certificate"],
    );
    // An expired one from the right CA.
    let expired = pki.ca.client("default", true);
    assert_refused(
        &daemon,
        &guest,
        &url,
        &pki.client_env(Some(&expired)),
        &["refused this client's certificate"],
    );
    // Plaintext against a TLS-only daemon.
    assert_refused(
        &daemon,
        &guest,
        &format!("tcp://127.0.0.1:{port}"),
        &[],
        &["refused the connection", "requires TLS"],
    );
    // A daemon whose certificate the client's CA did not sign.
    let client = pki.ca.client("default", false);
    let mut env = pki.client_env(Some(&client));
    env[0].1 = pki.other_ca("wrong-trust").cert.display().to_string();
    assert_refused(
        &daemon,
        &guest,
        &url,
        &env,
        &["daemon's certificate is not one RGPU_TLS_CA vouches for"],
    );
    // tls:// without RGPU_TLS_CA says what to set.
    assert_refused(&daemon, &guest, &url, &[], &["RGPU_TLS_CA"]);

    // The daemon said why each time, and serves a good client after all.
    let log = daemon.log();
    for words in [
        "refused: TLS handshake",
        "refused: this daemon requires TLS",
    ] {
        assert!(
            log.contains(words),
            "no {words:?} in the daemon log:\n{log}"
        );
    }
    let good = pki.ca.client("default", false);
    let program = guest.build_program("driver_api_test.c");
    let mut command = remote_command(&guest, &program, &url, &pki.client_env(Some(&good)));
    command.args(["--ptx", &ptx()]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("a good client after the refusals");
}

/// The daemon binary with the executor the harness would give it (sim, or
/// RGPU_TEST_EXECUTOR with NVIDIA's library from RGPU_TEST_DRIVER_DIR).
fn daemon_command() -> Command {
    let mut command = Command::new(Daemon::binary());
    command
        .arg("--executor")
        .arg(std::env::var("RGPU_TEST_EXECUTOR").unwrap_or_else(|_| "sim".into()))
        .env_remove("LD_LIBRARY_PATH")
        .envs(std::env::var_os("RGPU_TEST_DRIVER_DIR").map(|dir| ("LD_LIBRARY_PATH", dir)));
    command
}

/// The private socket directories of daemon `pid` (for a tenant that only
/// remote clients use) in the temp dir.
fn private_dirs_of(pid: u32) -> Vec<PathBuf> {
    let name = format!("rgpu-remote-{pid}");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == name || n.starts_with(&format!("{name}-")))
        })
        .collect()
}

/// A daemon started by hand (the harness always gives --socket-path), with
/// its log in a temp dir; killed on drop.
struct BareDaemon {
    child: Child,
    log: PathBuf,
    _dir: TempDir,
}

impl BareDaemon {
    fn start(args: &[&str]) -> Self {
        let dir = TempDir::new("rgpu-bare").unwrap();
        let log = dir.join("daemon.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = daemon_command()
            .args(args)
            .env("RGPU_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for BareDaemon {
    fn drop(&mut self) {
        // SAFETY: signalling our own child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn listen_alone_serves_plaintext_only_where_allowed_and_tls_clients_are_told() {
    // No --socket-path: the tenant's socket is private.
    let daemon = BareDaemon::start(&["--listen", "127.0.0.1:0", "--allow-plaintext"]);
    let port = remote_port(|| daemon.log());
    let guest = GuestLib::new();
    let program = guest.build_program("driver_api_test.c");
    let mut command = remote_command(&guest, &program, &format!("tcp://127.0.0.1:{port}"), &[]);
    command.args(["--ptx", &ptx()]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test through tcp://");

    // A TLS client of this plaintext listener learns what is wrong.
    let pki = TestPki::new();
    let client = pki.ca.client("default", false);
    let mut command = remote_command(
        &guest,
        &program,
        &format!("tls://localhost:{port}"),
        &pki.client_env(Some(&client)),
    );
    command.args(["--ptx", &ptx()]);
    let outcome = GuestProcess::spawn(command).finish(FAIL_TIMEOUT);
    assert!(
        !outcome.status.success() && outcome.stderr.contains("did not answer TLS"),
        "{outcome:?}"
    );

    // The tenant's private socket directory goes with the daemon: one
    // left behind kept a later daemon given the same pid from starting.
    let served_pid = daemon.child.id();
    assert_eq!(private_dirs_of(served_pid).len(), 1);
    drop(daemon);
    assert_eq!(private_dirs_of(served_pid), Vec::<PathBuf>::new());

    // Plaintext on a non-loopback address is refused at start, leaving no
    // private directory either.
    let refused = daemon_command()
        .args(["--listen", "0.0.0.0:0", "--allow-plaintext"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let refused_pid = refused.id();
    let output = refused.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && text.contains("plaintext is for loopback tests only"),
        "{text}"
    );
    assert_eq!(private_dirs_of(refused_pid), Vec::<PathBuf>::new());
    // And --listen without TLS files or --allow-plaintext.
    let output = daemon_command()
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && text.contains("--tls-client-ca"),
        "{text}"
    );
}

/// A TCP relay between clients and the daemon that can cut every
/// connection at once (a network that drops).
struct Relay {
    port: u16,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    /// Forwarding stops (bytes are read and dropped), sockets stay open:
    /// a network that goes silent without closing anything.
    frozen: Arc<AtomicBool>,
}

impl Relay {
    fn start(target_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let kept = Arc::clone(&sockets);
        let frozen = Arc::new(AtomicBool::new(false));
        let silent = Arc::clone(&frozen);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)) else {
                    return;
                };
                let mut list = kept.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                drop(list);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let silent = Arc::clone(&silent);
                    std::thread::spawn(move || {
                        let mut buffer = vec![0u8; 65536];
                        while let Ok(n) = from.read(&mut buffer) {
                            if n == 0 {
                                break;
                            }
                            if silent.load(Ordering::Acquire) {
                                continue;
                            }
                            if to.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Self {
            port,
            sockets,
            frozen,
        }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    fn cut(&self) {
        for socket in self.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// driver_api_test, looping, through `relay`; returns once it is running.
fn run_through(
    relay: &Relay,
    guest: &GuestLib,
    program: &Path,
    env: &[(String, String)],
) -> GuestProcess {
    let url = format!("tls://localhost:{}", relay.port);
    let mut command = remote_command(guest, program, &url, env);
    command.args(["--ptx", &ptx(), "--iterations", "100000", "--hold-ms", "20"]);
    let mut running = GuestProcess::spawn(command);
    running.wait_for_line("running", RUN_TIMEOUT);
    running
}

#[test]
fn a_dropped_connection_gives_errors_not_a_hang_and_the_host_frees_the_session() {
    let pki = TestPki::new();
    let client = pki.ca.client("default", false);
    let env = pki.client_env(Some(&client));
    let (mut daemon, port) = tls_daemon(&pki, &[]);
    let relay = Relay::start(port);
    let guest = GuestLib::new();
    let program = guest.build_program("driver_api_test.c");
    let running = run_through(&relay, &guest, &program, &env);
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "a session", |s| {
        s.get("sessions_active") >= 1
    });
    let cut_at = Instant::now();
    relay.cut();
    let outcome = running.finish(FAIL_TIMEOUT);
    assert!(
        !outcome.status.success() && outcome.stdout.contains("FAIL"),
        "the program did not see the cut: {outcome:?}"
    );
    assert!(
        outcome.stderr.contains("broke") || outcome.stderr.contains("connection"),
        "{}",
        outcome.stderr
    );
    eprintln!(
        "remote: the cut program ended {:?} after the cut",
        cut_at.elapsed()
    );

    // The host freed the session, and stays up for the next process.
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert!(daemon.is_alive());
    let mut command = remote_command(&guest, &program, &format!("tls://localhost:{port}"), &env);
    command.args(["--ptx", &ptx()]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test after the cut");
    assert!(daemon.is_alive());
}

#[test]
fn a_silent_network_fails_calls_within_the_timeout_and_a_long_kernel_does_not() {
    let pki = TestPki::new();
    let client = pki.ca.client("default", false);
    let mut env = pki.client_env(Some(&client));
    env.push(("RGPU_REMOTE_TIMEOUT_S".into(), "1".into()));
    let (mut daemon, port) = tls_daemon(&pki, &[]);
    let guest = GuestLib::new();

    // A kernel of 3 s, three times the timeout: the call waits, asks the
    // daemon whether it still serves it, and goes on waiting.
    let spin = guest.build_program("spin_test.c");
    let mut command = remote_command(&guest, &spin, &format!("tls://localhost:{port}"), &env);
    command.args(["--ptx", &ptx(), "--spin-ms", "3000"]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    assert!(
        outcome
            .stdout
            .contains("spin: synchronize rc 0 CUDA_SUCCESS"),
        "{outcome:?}"
    );

    // The network goes silent mid-run: the program's calls fail within a
    // few timeouts, and do not hang.
    let relay = Relay::start(port);
    let program = guest.build_program("driver_api_test.c");
    let running = run_through(&relay, &guest, &program, &env);
    let silent_at = Instant::now();
    relay.freeze();
    let outcome = running.finish(FAIL_TIMEOUT);
    assert!(
        !outcome.status.success() && outcome.stderr.contains("no answer from the daemon"),
        "{outcome:?}"
    );
    let took = silent_at.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the program failed only after {took:?}"
    );
    eprintln!("remote: a silent network failed the program in {took:?} (timeout 1 s)");

    // Once the relay lets go, the host frees the session; the daemon stays.
    relay.cut();
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert!(daemon.is_alive());
}

fn run_as(
    guest: &GuestLib,
    program: &Path,
    url: &str,
    pki: &TestPki,
    client: &CertFiles,
    args: &[&str],
) -> rgpu_tests::guest::GuestOutcome {
    let mut command = remote_command(guest, program, url, &pki.client_env(Some(client)));
    command.args(args);
    GuestProcess::spawn(command).finish(RUN_TIMEOUT)
}

#[test]
fn the_certificate_names_the_tenant_whose_limits_apply() {
    let pki = TestPki::new();
    // vm1 has a listener of its own too; vm2 only the daemon's.
    let own = TcpListener::bind("127.0.0.1:0").unwrap();
    let own_port = own.local_addr().unwrap().port();
    drop(own);
    let config = format!(
        "[[tenant]]\nname = \"vm1\"\nsocket = \"vm1.sock\"\nmemory_limit = \"256MiB\"\n\
         listen = \"127.0.0.1:{own_port}\"\n\
         [[tenant]]\nname = \"vm2\"\nsocket = \"vm2.sock\"\n"
    );
    let args = pki.daemon_args("127.0.0.1:0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with_config("sim", &config, &args, &[]);
    // The daemon's --listen is the line that is not vm1's port.
    let port = remote_port_other_than(|| daemon.log(), Some(own_port));
    let guest = GuestLib::new();
    let limits = guest.build_program("memory_limit_test.c");
    let url = format!("tls://localhost:{port}");
    let vm1 = pki.ca.client("vm1", false);
    let vm2 = pki.ca.client("vm2", false);

    // vm1's certificate: vm1's 256 MiB limit, as its local processes get.
    let outcome = run_as(&guest, &limits, &url, &pki, &vm1, &[]);
    assert!(
        outcome.stdout.contains("total MiB 256")
            && outcome
                .stdout
                .contains("allocated 256 MiB, then rc 2 CUDA_ERROR_OUT_OF_MEMORY"),
        "{outcome:?}"
    );
    // vm2's: no limit.
    let outcome = run_as(&guest, &limits, &url, &pki, &vm2, &["--max-mb", "512"]);
    assert!(
        outcome
            .stdout
            .contains("allocated 512 MiB, then rc 0 CUDA_SUCCESS"),
        "{outcome:?}"
    );
    // vm1's own listener takes vm1 and no one else.
    let own_url = format!("tls://localhost:{own_port}");
    let outcome = run_as(&guest, &limits, &own_url, &pki, &vm1, &[]);
    assert!(outcome.stdout.contains("total MiB 256"), "{outcome:?}");
    let outcome = run_as(&guest, &limits, &own_url, &pki, &vm2, &[]);
    assert!(
        outcome
            .stderr
            .contains("this listener serves tenant \\\"vm1\\\"")
            || outcome.stderr.contains("serves tenant \"vm1\""),
        "{outcome:?}"
    );
    // A certificate that names no tenant.
    let nobody = pki.ca.client("nobody", false);
    let outcome = run_as(&guest, &limits, &url, &pki, &nobody, &[]);
    assert!(
        outcome.stderr.contains("no tenant \"nobody\""),
        "{outcome:?}"
    );
}

/// A connection to the daemon at `port` as the client `who` (a certificate
/// of `pki`'s CA), speaking frames directly, as a hostile client could.
fn raw_connection(pki: &TestPki, who: &CertFiles, port: u16) -> FrameStream {
    let endpoint = RemoteEndpoint::with_files(
        &format!("tls://localhost:{port}"),
        [
            Some(pki.ca.cert.clone()),
            Some(who.cert.clone()),
            Some(who.key.clone()),
        ],
        Duration::from_secs(10),
    )
    .unwrap();
    endpoint.connect().unwrap()
}

fn process_token(pki: &TestPki, who: &CertFiles, port: u16) -> (FrameStream, [u8; TOKEN_BYTES]) {
    let mut process = raw_connection(pki, who, port);
    let (token, _, _) = process
        .hello(HelloRole::Process {
            name: "1:hostile".into(),
        })
        .unwrap();
    (process, token)
}

/// A channel of `token`'s process, or why the daemon refused it.
fn open_channel(
    pki: &TestPki,
    who: &CertFiles,
    port: u16,
    token: [u8; TOKEN_BYTES],
) -> Result<FrameStream, String> {
    let mut channel = raw_connection(pki, who, port);
    channel
        .hello(HelloRole::Channel {
            token,
            name: "1:hostile".into(),
        })
        .map(|_| channel)
        .map_err(|e| e.to_string())
}

/// What the gateway answers `frame` on a fresh channel of `token`.
fn answer_to(
    pki: &TestPki,
    who: &CertFiles,
    port: u16,
    token: [u8; TOKEN_BYTES],
    frame: &[u8],
) -> String {
    let mut channel = open_channel(pki, who, port, token).unwrap();
    channel.send_raw(frame).unwrap();
    match channel.receive() {
        Ok(response) => format!("{response:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_gateway_refuses_what_no_client_may_ask() {
    let pki = TestPki::new();
    let config = "[[tenant]]\nname = \"vm1\"\nsocket = \"vm1.sock\"\n\
                  [[tenant]]\nname = \"vm2\"\nsocket = \"vm2.sock\"\n";
    let args = pki.daemon_args("127.0.0.1:0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start_with_config("sim", config, &args, &[]);
    let port = remote_port(|| daemon.log());
    let vm1 = pki.ca.client("vm1", false);
    let vm2 = pki.ca.client("vm2", false);
    let (_vm1_process, token1) = process_token(&pki, &vm1, port);
    let (_vm2_process, _) = process_token(&pki, &vm2, port);

    // Another tenant's process token, and a made-up one.
    let err = open_channel(&pki, &vm2, port, token1).err().unwrap();
    assert!(err.contains("unknown process token"), "{err}");
    let err = open_channel(&pki, &vm1, port, [0x5a; TOKEN_BYTES])
        .err()
        .unwrap();
    assert!(err.contains("unknown process token"), "{err}");
    // A query connection for a channel that does not exist.
    let mut queries = raw_connection(&pki, &vm1, port);
    let err = queries
        .hello(HelloRole::Query {
            token: token1,
            ctx_id: 9999,
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown process token or channel"), "{err}");
    // Nor a lane for a channel that does not exist.
    let lane_of = |token, ctx_id| {
        let mut lane = raw_connection(&pki, &vm1, port);
        lane.hello(HelloRole::Lane { token, ctx_id })
            .map(|_| lane)
            .map_err(|e| e.to_string())
    };
    let err = lane_of(token1, 9999).err().unwrap();
    assert!(err.contains("unknown process token or channel"), "{err}");
    // A channel takes at most MAX_LANES lanes; a copy asks for no more
    // lanes than its channel has, and lane pieces come on lanes only.
    let mut crowded = raw_connection(&pki, &vm1, port);
    let (_, crowded_ctx, _) = crowded
        .hello(HelloRole::Channel {
            token: token1,
            name: "1:hostile".into(),
        })
        .unwrap();
    let lanes: Vec<_> = (0..rgpu_proto::remote::MAX_LANES)
        .map(|_| lane_of(token1, crowded_ctx).unwrap())
        .collect();
    let err = lane_of(token1, crowded_ctx).err().unwrap();
    assert!(err.contains("at most"), "{err}");
    drop(lanes);
    let one_lane = Request::CopyToDeviceLanes {
        stream: 0,
        dst: 0x7f00_0000_0000,
        length: 1 << 20,
        sync: true,
        lanes: 1,
    };
    let answer = answer_to(&pki, &vm1, port, token1, &one_lane.encode());
    assert!(answer.contains("the channel has 0"), "{answer}");
    let answer = answer_to(
        &pki,
        &vm1,
        port,
        token1,
        &Request::LanePiece { data: &[1; 16] }.encode(),
    );
    assert!(answer.contains("lane piece on the channel"), "{answer}");

    // Commands that name blob memory (the gateway's own ring is blob
    // memory of this process on the host) or drive the ring itself.
    let steal = CudaCommand::MemcpyDtoH {
        stream: 0,
        dst: BlobRange {
            resource_id: 1,
            offset: 0,
            length: 4096,
        },
        src: 0x7f00_0000_0000,
    }
    .to_bytes(0);
    let answer = answer_to(
        &pki,
        &vm1,
        port,
        token1,
        &Request::Call { command: &steal }.encode(),
    );
    assert!(
        answer.contains("not allowed on a remote connection"),
        "{answer}"
    );
    // The ring's control is no ring command.
    let doorbell = rgpu_proto::ControlCommand::Doorbell { until: u64::MAX }.to_bytes(0);
    let answer = answer_to(
        &pki,
        &vm1,
        port,
        token1,
        &Request::Send { command: &doorbell }.encode(),
    );
    assert!(answer.contains("unknown opcode"), "{answer}");
    // A frame of an unknown kind, and one longer than any frame may be.
    let answer = answer_to(&pki, &vm1, port, token1, &[1, 0, 0, 0, 0x7f]);
    assert!(answer.contains("request kind"), "{answer}");
    let answer = answer_to(&pki, &vm1, port, token1, &u32::MAX.to_le_bytes());
    assert!(answer.contains("out of range"), "{answer}");

    // Nothing of it reached a session, and the daemon serves on.
    assert!(daemon.is_alive());
    let guest = GuestLib::new();
    let program = guest.build_program("driver_api_test.c");
    let mut command = remote_command(
        &guest,
        &program,
        &format!("tls://localhost:{port}"),
        &pki.client_env(Some(&vm1)),
    );
    command.args(["--ptx", &ptx()]);
    GuestProcess::spawn(command)
        .finish(RUN_TIMEOUT)
        .assert_checks_passed("driver_api_test after the hostile frames");
}

/// CUDA graphs through the network carrier, which shares no memory with
/// the host: graph_test and graph_api_test with `--no-mapped-memory` run
/// everything but page-locked memory in graphs (captures, explicit nodes,
/// updates, child graphs, 2D and 3D memcpy nodes, every value checked) and
/// assert that each graph call naming page-locked memory (memset and
/// memcpy nodes added or set, per kind and generic; copies, memsets and
/// host functions during a capture; host nodes) and each use of it as
/// device memory is refused with CUDA_ERROR_NOT_SUPPORTED at the call,
/// not left to make a graph that silently leaves it alone. The guest says
/// why once per call.
#[test]
fn graphs_run_through_the_tls_carrier_and_refuse_page_locked_memory() {
    let pki = TestPki::new();
    let client = pki.ca.client("default", false);
    let (daemon, port) = tls_daemon(&pki, &[]);
    let guest = GuestLib::new();
    let url = format!("tls://localhost:{port}");
    let env = pki.client_env(Some(&client));
    let graph_reason = "so a graph cannot reach the program's host memory";
    let device_reason = "so page-locked memory has no device address there";
    // How many lines of `stderr` refuse `call` for `reason`.
    let said = |stderr: &str, call: &str, reason: &str| {
        stderr
            .lines()
            .filter(|l| l.contains(&format!("{call} naming")) && l.contains(reason))
            .count()
    };

    let program = guest.build_program("graph_test.c");
    let mut command = remote_command(&guest, &program, &url, &env);
    command.args(["--ptx", &ptx(), "--no-mapped-memory"]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    print!("{}", outcome.stdout);
    outcome.assert_passed("graph_test");
    let stderr = &outcome.stderr;
    // A memset of page-locked memory is refused only in the capture: on a
    // stream it fills the program's own bytes.
    for call in ["cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemsetD*"] {
        assert_eq!(
            said(stderr, call, graph_reason),
            1,
            "{call} refused once, said once:\n{stderr}"
        );
    }
    // Refused twice (in the capture and on the stream), said once.
    assert_eq!(
        said(stderr, "cuStreamWriteValue", device_reason),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("cuLaunchHostFunc on a capturing stream is not supported"),
        "{stderr}"
    );
    // Refused in the guest: nothing failed on the host.
    daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    let stats = daemon.stats();
    assert_eq!(stats.get("command_errors"), 0, "{stats:?}");

    let program = guest.build_program("graph_api_test.c");
    let mut command = remote_command(&guest, &program, &url, &env);
    command.args(["--ptx", &ptx(), "--no-mapped-memory"]);
    let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
    print!("{}", outcome.stdout);
    outcome.assert_passed("graph_api_test");
    let stderr = &outcome.stderr;
    for call in [
        "cuGraphAddMemsetNode",
        "cuGraphMemsetNodeSetParams",
        "cuGraphExecMemsetNodeSetParams",
        "cuGraphAddMemcpyNode",
        "cuGraphMemcpyNodeSetParams",
        "cuGraphExecMemcpyNodeSetParams",
    ] {
        assert_eq!(said(stderr, call, graph_reason), 1, "{call}:\n{stderr}");
    }
    assert!(
        stderr.contains("cuGraphAddHostNode is not supported"),
        "{stderr}"
    );
    // The host freed everything the two processes had.
    let after = daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert_eq!(after.get("device_memory_bytes"), 0, "{after:?}");
}

//! A real `vhost-device-rgpu` process for one test.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{built_profile_dir, Stats, TempDir};

/// How long the daemon may take to create its sockets.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the daemon may take to exit on SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A config of two tenants without limits: `alpha` on the harness's socket
/// (`rgpu.sock`), `beta` on `beta.sock` beside it (tests of what must stay
/// inside a tenant).
pub const TWO_TENANTS: &str = r#"
[[tenant]]
name = "alpha"
socket = "rgpu.sock"

[[tenant]]
name = "beta"
socket = "beta.sock"
"#;

/// A running daemon with its sockets in a private temp dir; killed (and the
/// dir removed) on drop.
pub struct Daemon {
    child: Child,
    socket: PathBuf,
    stats_socket: PathBuf,
    /// Only with [`Daemon::start_with_config`].
    control_socket: Option<PathBuf>,
    log: PathBuf,
    dir: TempDir,
}

/// How the daemon is told what to serve.
enum Tenants<'a> {
    /// `--socket-path <dir>/rgpu.sock`.
    SocketPath,
    /// `--config <dir>/rgpu.toml` holding this text, and `--control-socket
    /// <dir>/control.sock`.
    Config(&'a str),
}

impl Daemon {
    /// The daemon binary of this build.
    pub fn binary() -> PathBuf {
        built_profile_dir().join("vhost-device-rgpu")
    }

    /// Starts `vhost-device-rgpu --executor <executor>` and waits until both
    /// of its sockets exist. `LD_LIBRARY_PATH` is removed from its
    /// environment: the daemon must never load guest-lib's libcuda.
    pub fn start(executor: &str) -> Self {
        Self::start_with_env(executor, &[])
    }

    pub fn start_with_env(executor: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with(executor, &[], env)
    }

    /// Like [`Daemon::start`], with more daemon options (`args`) and
    /// environment (`env`).
    pub fn start_with(executor: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(executor, Tenants::SocketPath, args, env)
    }

    /// Starts the daemon with `--config` (a file in its temp dir holding
    /// `config`) and a control socket (see [`Daemon::ctl`]), and waits until
    /// it serves every tenant (its control socket exists then). Relative
    /// socket paths in `config` are in the daemon's dir ([`Daemon::dir`]);
    /// [`Daemon::socket`] is the tenant socket `rgpu.sock`, if one has it.
    pub fn start_with_config(
        executor: &str,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(executor, Tenants::Config(config), args, env)
    }

    fn spawn(executor: &str, tenants: Tenants, args: &[&str], env: &[(&str, &str)]) -> Self {
        let binary = Self::binary();
        assert!(
            binary.exists(),
            "{} does not exist after building it",
            binary.display()
        );
        let dir = TempDir::new("rgpu-daemon").expect("create a temp dir for the daemon");
        let socket = dir.join("rgpu.sock");
        let stats_socket = dir.join("stats.sock");
        let log = dir.join("daemon.log");
        let log_file = File::create(&log).expect("create the daemon log");
        let log_err = log_file.try_clone().expect("clone the daemon log handle");
        // On the GPU host a test runs against NVIDIA's driver:
        // RGPU_TEST_EXECUTOR=cuda, with the driver's folder in
        // RGPU_TEST_DRIVER_DIR (never guest-lib's).
        let executor = std::env::var("RGPU_TEST_EXECUTOR").unwrap_or_else(|_| executor.into());
        let mut command = Command::new(&binary);
        command.arg("--executor").arg(&executor);
        let control_socket = match tenants {
            Tenants::SocketPath => {
                command.arg("--socket-path").arg(&socket);
                None
            }
            Tenants::Config(text) => {
                let config = dir.join("rgpu.toml");
                std::fs::write(&config, text).expect("write the daemon's config");
                let control_socket = dir.join("control.sock");
                command
                    .arg("--config")
                    .arg(&config)
                    .arg("--control-socket")
                    .arg(&control_socket);
                Some(control_socket)
            }
        };
        command
            .arg("--stats-socket")
            .arg(&stats_socket)
            .args(args)
            .env_remove("LD_LIBRARY_PATH")
            .envs(std::env::var_os("RGPU_TEST_DRIVER_DIR").map(|dir| ("LD_LIBRARY_PATH", dir)))
            .env(
                "RGPU_LOG",
                std::env::var("RGPU_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_err));
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().expect("spawn vhost-device-rgpu");
        let mut daemon = Self {
            child,
            socket,
            stats_socket,
            control_socket,
            log,
            dir,
        };
        daemon.wait_for_sockets();
        daemon
    }

    fn wait_for_sockets(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        // With a config, the tenants' sockets are the config's; the
        // control socket comes once they all serve.
        let first = self.control_socket.as_ref().unwrap_or(&self.socket).clone();
        while !(first.exists() && self.stats_socket.exists()) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the daemon exited with {status} before listening:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not create its sockets within {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The vhost-user socket guests connect to (`RGPU_SOCKET`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn stats_socket(&self) -> &Path {
        &self.stats_socket
    }

    /// The control socket of a daemon started with a config.
    pub fn control_socket(&self) -> &Path {
        self.control_socket
            .as_deref()
            .expect("only a daemon started with a config has a control socket")
    }

    /// Runs `vhost-device-rgpu ctl --control-socket <ours> <args>` and
    /// returns how it went.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Self::ctl_at(self.control_socket(), args)
    }

    /// Runs `vhost-device-rgpu ctl --control-socket <control_socket>
    /// <args>` and returns how it went.
    pub fn ctl_at(control_socket: &Path, args: &[&str]) -> Output {
        Command::new(Self::binary())
            .arg("ctl")
            .arg("--control-socket")
            .arg(control_socket)
            .args(args)
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::null())
            .output()
            .expect("run vhost-device-rgpu ctl")
    }

    /// A scratch directory that lives as long as the daemon.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The daemon's output so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn stats(&self) -> Stats {
        match Stats::read(&self.stats_socket) {
            Ok(stats) => stats,
            Err(e) => panic!("{e}\ndaemon log:\n{}", self.log()),
        }
    }

    /// Polls the stats socket until `done` holds; panics with the last
    /// answer after `timeout`.
    pub fn wait_for_stats(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Stats) -> bool,
    ) -> Stats {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.stats();
            if done(&stats) {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "waited {timeout:?} for {what}; last stats: {stats:?}\ndaemon log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until no session and no connection is alive: every guest
    /// gone and its accounting settled.
    pub fn wait_until_idle(&self, timeout: Duration) -> Stats {
        self.wait_for_stats(
            timeout,
            "sessions_active == 0 and connections_active == 0",
            |s| s.get("sessions_active") == 0 && s.get("connections_active") == 0,
        )
    }
}

impl Drop for Daemon {
    /// SIGTERM first, so the daemon stops its connection processes and
    /// removes what it created; SIGKILL if it does not exit in time.
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill only sends a signal to the child we started and
            // have not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

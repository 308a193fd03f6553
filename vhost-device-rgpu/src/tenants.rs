//! The tenants the parent serves (ARCHITECTURE.md §5a): each is a socket
//! with a [`Supervisor`] of its own (its gate, standby and connection
//! processes), a memory budget page ([`TenantPage`]) every process of the
//! tenant takes from, and settings that may change live.
//!
//! Each supervisor runs on a thread of its own, which lasts as long as the
//! tenant is served: a connection process gets SIGTERM when the thread that
//! started it ends (PR_SET_PDEATHSIG), so a tenant's thread must not end
//! while its processes serve, and ending it (after
//! [`Supervisor::terminate`]) is how a removed tenant's processes are sure
//! to go.
//!
//! [`Tenants`] is the registry: the control socket adds, removes and
//! changes tenants through it, the stats socket sums it, and the metrics
//! endpoint reads [`Tenants::samples`].

use std::ffi::OsString;
use std::fmt;
use std::os::fd::RawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use log::{error, info, warn};
use rgpu_session::{CounterKind, Counters};

use crate::config::{format_size, Setting, TenantConfig, TenantSettings};
use crate::signals::CreatedFiles;
use crate::socket::{self, SocketError};
use crate::supervisor::{Supervisor, SupervisorError};
use crate::tenant_page::{TenantPage, UNLIMITED};

/// The name of the one tenant of `--socket-path` or `--fd`.
pub const DEFAULT_TENANT: &str = "default";

/// What one tenant's use and settings look like now (for metrics).
#[derive(Debug)]
pub struct TenantSample {
    pub name: String,
    /// The sum over its connection processes ([`Supervisor::totals`]).
    pub counters: Counters,
    /// Device memory its processes hold, all together.
    pub memory_used: u64,
    pub memory_limit: Option<u64>,
    pub compute_weight: u32,
    pub compute_max: Option<u8>,
    /// `high`, `normal` or `low`.
    pub priority: &'static str,
    /// GPU time of its work so far (the scheduler's measure).
    pub gpu_busy_seconds: f64,
}

/// Where a tenant's frontends connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A socket the daemon created (and removes).
    Socket(PathBuf),
    /// A listening socket the daemon was started with (`--fd`): not ours
    /// to remove.
    InheritedFd(RawFd),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Socket(path) => write!(f, "{}", path.display()),
            Self::InheritedFd(fd) => write!(f, "fd {fd}"),
        }
    }
}

/// A tenant to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    pub name: String,
    pub endpoint: Endpoint,
    /// Host GPU ordinal; `None`: [`TenantLaunch::default_gpu`].
    pub gpu: Option<u32>,
    /// Its own address for remote clients, if any.
    pub listen: Option<std::net::SocketAddr>,
    pub settings: TenantSettings,
}

impl From<TenantConfig> for TenantSpec {
    fn from(config: TenantConfig) -> Self {
        Self {
            settings: config.settings(),
            name: config.name,
            endpoint: Endpoint::Socket(config.socket),
            gpu: config.gpu,
            listen: config.listen,
        }
    }
}

/// What every tenant's connection processes get, from the daemon's
/// command line.
#[derive(Debug, Clone)]
pub struct TenantLaunch {
    /// The executor's name (`cuda`, `sim`), for the log.
    pub executor: &'static str,
    /// The GPU of tenants that name none (`--gpu`).
    pub default_gpu: u32,
    /// Arguments of every connection process after `--tenant-name NAME
    /// --gpu N`: the executor, timeouts, seccomp mode.
    pub child_args: Vec<OsString>,
    /// Give each tenant's processes a private module cache directory (no
    /// `--module-cache-dir` given).
    pub private_module_cache: bool,
    /// Per tenant (`--max-connections`).
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    /// How long a tenant's processes may take to end on SIGTERM.
    pub grace: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("unknown tenant {0:?}")]
    Unknown(String),
    #[error("a tenant named {0:?} is served already")]
    DuplicateName(String),
    #[error("{socket} is tenant {owner:?}'s socket already")]
    DuplicateSocket { socket: String, owner: String },
    #[error("tenant {name}: {source}")]
    Socket { name: String, source: SocketError },
    #[error("tenant {name}: cannot create its memory budget: {source}")]
    Budget {
        name: String,
        source: std::io::Error,
    },
    /// The supervisor's error: for a first start, the child's own message.
    #[error("tenant {name}: {source}")]
    Supervisor {
        name: String,
        source: SupervisorError,
    },
    #[error("tenant {name}: cannot start its thread: {source}")]
    Thread {
        name: String,
        source: std::io::Error,
    },
    #[error("tenant {0}: stopped before it served")]
    StoppedEarly(String),
    #[error("the daemon is exiting")]
    Terminating,
}

/// A tenant being served.
pub struct ServedTenant {
    pub name: String,
    pub endpoint: Endpoint,
    /// The host GPU its processes use.
    pub gpu: u32,
    pub supervisor: Arc<Supervisor>,
    /// The memory budget every process of the tenant takes from; its limit
    /// is the live `memory_limit`.
    pub budget: Arc<TenantPage>,
    settings: Mutex<TenantSettings>,
    /// Runs `supervisor.run`; joined once the supervisor is terminated.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for ServedTenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServedTenant")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("gpu", &self.gpu)
            .field("settings", &self.settings())
            .finish()
    }
}

impl ServedTenant {
    /// Its settings now.
    pub fn settings(&self) -> TenantSettings {
        *lock(&self.settings)
    }

    pub fn sample(&self) -> TenantSample {
        let settings = self.settings();
        TenantSample {
            name: self.name.clone(),
            counters: self.supervisor.totals(),
            memory_used: self.budget.used(),
            memory_limit: settings.memory_limit,
            compute_weight: settings.compute_weight,
            compute_max: settings.compute_max,
            priority: settings.priority.name(),
            gpu_busy_seconds: self.budget.compute_use().busy_ns as f64 * 1e-9,
        }
    }

    /// Applies `changes`, all or (on an error before any) none.
    fn apply(&self, changes: &[Setting]) {
        let mut settings = lock(&self.settings);
        for change in changes {
            change.apply(&mut settings);
            if let Setting::MemoryLimit(limit) = change {
                // Lowering it below what is held refuses new allocations
                // and takes nothing away (TenantPage).
                self.budget.set_limit(limit.unwrap_or(UNLIMITED));
            }
            info!("tenant {}: {}", self.name, describe(change));
        }
    }
}

fn describe(change: &Setting) -> String {
    match change {
        Setting::MemoryLimit(Some(bytes)) => format!("memory_limit = {}", format_size(*bytes)),
        Setting::MemoryLimit(None) => "memory_limit = none".into(),
        Setting::ComputeWeight(weight) => format!("compute_weight = {weight}"),
        Setting::ComputeMax(Some(percent)) => format!("compute_max = {percent}%"),
        Setting::ComputeMax(None) => "compute_max = none".into(),
        Setting::Priority(priority) => format!("priority = {priority}"),
    }
}

/// How a tenant's first start went, from its thread.
enum Start {
    Serving,
    Failed(SupervisorError),
    /// Terminated before a process was ready.
    Stopped,
}

#[derive(Default)]
struct Registry {
    /// In the order they were added.
    served: Vec<Arc<ServedTenant>>,
    /// Waiting for their first process to be ready.
    starting: Vec<Arc<ServedTenant>>,
    /// Removed, their processes ending.
    leaving: Vec<Arc<ServedTenant>>,
    /// The totals of tenants removed (the stats socket's sums never go
    /// back).
    retired: Counters,
    terminating: bool,
}

impl Registry {
    fn all(&self) -> impl Iterator<Item = &Arc<ServedTenant>> {
        self.served
            .iter()
            .chain(&self.starting)
            .chain(&self.leaving)
    }
}

/// Every tenant the daemon serves.
pub struct Tenants {
    launch: TenantLaunch,
    created: CreatedFiles,
    /// Held through a whole start or removal (which wait for processes),
    /// so that two never interleave; readers take only `registry`.
    changes: Mutex<()>,
    registry: Mutex<Registry>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Lists and settings: nothing a panicking holder leaves half-done
    // matters more than serving on.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Tenants {
    /// No tenants yet; the sockets it creates go into `created` (removed at
    /// exit by the signal thread).
    pub fn new(launch: TenantLaunch, created: CreatedFiles) -> Self {
        Self {
            launch,
            created,
            changes: Mutex::default(),
            registry: Mutex::default(),
        }
    }

    /// The tenants served now, in the order they were added.
    pub fn list(&self) -> Vec<Arc<ServedTenant>> {
        lock(&self.registry).served.clone()
    }

    pub fn get(&self, name: &str) -> Option<Arc<ServedTenant>> {
        lock(&self.registry)
            .served
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// Each served tenant's use and settings, now.
    pub fn samples(&self) -> Vec<TenantSample> {
        self.list().iter().map(|t| t.sample()).collect()
    }

    /// The counters of every tenant's processes, ended or alive (what the
    /// stats socket answers).
    pub fn totals(&self) -> Counters {
        let registry = lock(&self.registry);
        let sum = Counters::default();
        sum.add_from(&registry.retired, &[CounterKind::Total]);
        for tenant in registry.all() {
            sum.add_from(
                &tenant.supervisor.totals(),
                &[CounterKind::Gauge, CounterKind::Total],
            );
        }
        sum
    }

    /// Starts serving `specs`, all at once, and returns when each has a
    /// process ready (its executor started). If one fails, every one of
    /// them is stopped again and the first failure returned (a first start
    /// that fails, no driver say, gives the child's message).
    pub fn start(&self, specs: Vec<TenantSpec>) -> Result<Vec<Arc<ServedTenant>>, TenantError> {
        let _changes = lock(&self.changes);
        self.check_new(&specs)?;
        let (report, reports) = mpsc::channel();
        let mut starting = Vec::with_capacity(specs.len());
        for (index, spec) in specs.into_iter().enumerate() {
            match self.launch(spec, index, report.clone()) {
                Ok(tenant) => starting.push(tenant),
                Err(e) => {
                    self.abandon(&starting);
                    return Err(e);
                }
            }
        }
        drop(report);
        let mut serving = 0;
        while serving < starting.len() {
            let failure = match reports.recv() {
                Ok((_, Start::Serving)) => {
                    serving += 1;
                    continue;
                }
                Ok((index, Start::Failed(source))) => TenantError::Supervisor {
                    name: starting[index].name.clone(),
                    source,
                },
                Ok((index, Start::Stopped)) => {
                    TenantError::StoppedEarly(starting[index].name.clone())
                }
                // Every thread ended without a word: cannot happen (each
                // reports before it ends).
                Err(_) => TenantError::Terminating,
            };
            self.abandon(&starting);
            return Err(failure);
        }
        let mut registry = lock(&self.registry);
        registry
            .starting
            .retain(|t| !starting.iter().any(|s| Arc::ptr_eq(s, t)));
        registry.served.extend(starting.iter().cloned());
        Ok(starting)
    }

    /// Starts one tenant (`ctl add`).
    pub fn add(&self, config: TenantConfig) -> Result<Arc<ServedTenant>, TenantError> {
        let name = config.name.clone();
        self.start(vec![config.into()])?
            .pop()
            .ok_or(TenantError::StoppedEarly(name))
    }

    /// Changes a tenant's settings live, all of `changes` or none.
    pub fn set(&self, name: &str, changes: &[Setting]) -> Result<Arc<ServedTenant>, TenantError> {
        let tenant = self
            .get(name)
            .ok_or_else(|| TenantError::Unknown(name.to_owned()))?;
        tenant.apply(changes);
        Ok(tenant)
    }

    /// Stops serving tenant `name`: its socket closes and is removed, its
    /// processes end (SIGTERM, then SIGKILL after the grace).
    pub fn remove(&self, name: &str) -> Result<(), TenantError> {
        let _changes = lock(&self.changes);
        let tenant = {
            let mut registry = lock(&self.registry);
            let index = registry
                .served
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| TenantError::Unknown(name.to_owned()))?;
            let tenant = registry.served.remove(index);
            registry.leaving.push(Arc::clone(&tenant));
            tenant
        };
        info!("tenant {name}: removing it");
        self.stop(&tenant);
        info!("tenant {name}: removed");
        Ok(())
    }

    /// Terminates every tenant (the daemon exits; the signal thread calls
    /// this): SIGTERM to all their processes at once, then up to the grace
    /// for them to end. Starts no tenant afterwards.
    pub fn terminate_all(&self) {
        let tenants: Vec<Arc<ServedTenant>> = {
            let mut registry = lock(&self.registry);
            registry.terminating = true;
            registry.all().cloned().collect()
        };
        let grace = self.launch.grace;
        thread::scope(|scope| {
            for tenant in &tenants {
                let terminate = move || tenant.supervisor.terminate(grace, false);
                if let Err(e) = thread::Builder::new()
                    .name("rgpu-terminate".into())
                    .spawn_scoped(scope, terminate)
                {
                    warn!("tenant {}: terminating it in turn: {e}", tenant.name);
                    tenant.supervisor.terminate(grace, false);
                }
            }
        });
    }

    /// Refuses `specs` whose names or sockets are taken, by served tenants
    /// or by each other.
    fn check_new(&self, specs: &[TenantSpec]) -> Result<(), TenantError> {
        let registry = lock(&self.registry);
        if registry.terminating {
            return Err(TenantError::Terminating);
        }
        let mut taken: Vec<(&str, &Endpoint)> = registry
            .all()
            .map(|t| (t.name.as_str(), &t.endpoint))
            .collect();
        for spec in specs {
            if taken.iter().any(|(name, _)| *name == spec.name) {
                return Err(TenantError::DuplicateName(spec.name.clone()));
            }
            if let Some((owner, _)) = taken.iter().find(|(_, e)| **e == spec.endpoint) {
                return Err(TenantError::DuplicateSocket {
                    socket: spec.endpoint.to_string(),
                    owner: (*owner).to_owned(),
                });
            }
            taken.push((&spec.name, &spec.endpoint));
        }
        Ok(())
    }

    /// Opens a tenant's socket, budget and supervisor and starts its
    /// thread, which reports how its first start went on `report` with
    /// `index`.
    fn launch(
        &self,
        spec: TenantSpec,
        index: usize,
        report: mpsc::Sender<(usize, Start)>,
    ) -> Result<Arc<ServedTenant>, TenantError> {
        let TenantSpec {
            name,
            endpoint,
            gpu,
            settings,
            // The parent's remote listeners serve it (read at start).
            listen: _,
        } = spec;
        let listener = self.listen(&name, &endpoint)?;
        let forget_socket = || {
            if let Endpoint::Socket(path) = &endpoint {
                self.created.remove(path);
            }
        };
        let budget = match TenantPage::create(settings.memory_limit.unwrap_or(UNLIMITED)) {
            Ok(page) => Arc::new(page),
            Err(source) => {
                forget_socket();
                return Err(TenantError::Budget { name, source });
            }
        };
        let gpu = gpu.unwrap_or(self.launch.default_gpu);
        let mut child_args: Vec<OsString> = vec![
            "--tenant-name".into(),
            name.clone().into(),
            "--gpu".into(),
            gpu.to_string().into(),
        ];
        child_args.extend(self.launch.child_args.iter().cloned());
        let supervisor = match Supervisor::new(
            listener,
            child_args,
            self.launch.max_connections,
            self.launch.handshake_timeout,
            Arc::clone(&budget),
            self.launch.private_module_cache,
        ) {
            Ok(supervisor) => Arc::new(supervisor),
            Err(source) => {
                forget_socket();
                return Err(TenantError::Supervisor { name, source });
            }
        };
        let tenant = Arc::new(ServedTenant {
            name,
            endpoint,
            gpu,
            supervisor,
            budget,
            settings: Mutex::new(settings),
            thread: Mutex::new(None),
        });
        // Before the thread starts: terminate_all must find it.
        lock(&self.registry).starting.push(Arc::clone(&tenant));
        let supervising = Arc::clone(&tenant);
        let executor = self.launch.executor;
        let spawned = thread::Builder::new()
            .name(format!("rgpu-tenant-{}", tenant.name))
            .spawn(move || {
                let tenant = supervising;
                let serving = |gpus: usize, driver: i32| {
                    info!(
                        "tenant {}: serving on {} with executor {executor} ({gpus} GPU(s), \
                         driver {driver}), one process per connection",
                        tenant.name, tenant.endpoint
                    );
                    let _ = report.send((index, Start::Serving));
                };
                let start = match tenant.supervisor.run(serving) {
                    Ok(()) => Start::Stopped,
                    Err(e) => Start::Failed(e),
                };
                // After the first start nobody listens: that is fine.
                let _ = report.send((index, start));
            });
        match spawned {
            Ok(thread) => {
                *lock(&tenant.thread) = Some(thread);
                Ok(tenant)
            }
            Err(source) => {
                self.abandon(std::slice::from_ref(&tenant));
                Err(TenantError::Thread {
                    name: tenant.name.clone(),
                    source,
                })
            }
        }
    }

    /// A tenant's listening socket: bound (and noted for removal at exit)
    /// or inherited.
    fn listen(&self, name: &str, endpoint: &Endpoint) -> Result<UnixListener, TenantError> {
        let socket_error = |source| TenantError::Socket {
            name: name.to_owned(),
            source,
        };
        match endpoint {
            Endpoint::Socket(path) => {
                let listener = socket::bind(path).map_err(socket_error)?;
                self.created.add(path.clone());
                Ok(listener)
            }
            Endpoint::InheritedFd(fd) => socket::inherit(*fd).map_err(socket_error),
        }
    }

    /// Stops tenants that never served, and forgets them.
    fn abandon(&self, tenants: &[Arc<ServedTenant>]) {
        for tenant in tenants {
            self.stop(tenant);
            lock(&self.registry)
                .starting
                .retain(|t| !Arc::ptr_eq(t, tenant));
        }
    }

    /// Terminates a tenant's supervisor, waits for its thread, removes its
    /// socket and keeps its totals.
    fn stop(&self, tenant: &Arc<ServedTenant>) {
        tenant.supervisor.terminate(self.launch.grace, true);
        let thread = lock(&tenant.thread).take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                error!("tenant {}: its thread panicked", tenant.name);
            }
        }
        if let Endpoint::Socket(path) = &tenant.endpoint {
            self.created.remove(path);
        }
        let mut registry = lock(&self.registry);
        if let Some(index) = registry.leaving.iter().position(|t| Arc::ptr_eq(t, tenant)) {
            registry.leaving.remove(index);
            registry
                .retired
                .add_from(&tenant.supervisor.totals(), &[CounterKind::Total]);
        }
    }
}

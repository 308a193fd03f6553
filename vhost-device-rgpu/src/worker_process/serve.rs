//! The worker process's main loop: sessions of one guest process, the blobs
//! they use mapped and registered here, and `Done` answers to the
//! connection process. Nothing here waits for the GPU: sessions run on
//! their own threads, and tearing one down runs on a thread of its own.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::{debug, info, warn};
use rgpu_executor::Executor;
use rgpu_proto::batch::decode_batch;
use rgpu_proto::cuda_result::CUDA_ERROR_LAUNCH_TIMEOUT;
use rgpu_proto::ControlCommand;
use rgpu_session::{Blob, Completion, Counters, Session, Tenant};

use super::blob_mapping::{BlobMapping, MapError, RunBudget};
use super::link::Link;
use super::message::{FileRun, FromWorker, ToWorker, MAX_MESSAGE_BYTES};

/// The guest ordinal every session uses (the daemon serves one GPU).
const SESSION_DEVICE: u32 = 0;
/// Runs a blob may be sent in, at most (rgpu-proto's blob entry limit).
const MAX_RUNS_PER_BLOB: usize = rgpu_proto::virtio_gpu::MAX_BLOB_ENTRIES as usize;

/// Answers a request once dropped: completing it, or dropping it unfinished
/// (a session that ended with it queued), both tell the connection.
struct Done {
    link: Arc<Link>,
    token: u64,
}

impl Completion for Done {
    fn complete(self: Box<Self>) {
        // Drop sends.
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.token != 0 {
            let message = FromWorker::Done { token: self.token }.encode();
            if let Err(e) = self.link.send(&message, &[]) {
                debug!("cannot answer token {}: {e}", self.token);
            }
        }
    }
}

struct MappedBlob {
    blob: Arc<Blob>,
    mapping: Arc<BlobMapping>,
}

struct Worker {
    link: Arc<Link>,
    executor: Arc<dyn Executor>,
    counters: Arc<Counters>,
    tenant: Arc<Tenant>,
    files: HashMap<u32, File>,
    runs: HashMap<u32, Vec<FileRun>>,
    blobs: HashMap<u32, MappedBlob>,
    /// Blobs that could not be mapped: their sessions hear it at attach.
    unmappable: std::collections::HashSet<u32>,
    sessions: HashMap<u32, Session>,
    teardowns: Vec<JoinHandle<()>>,
    /// Blob runs this process may map at once.
    run_limit: usize,
}

/// Serves the connection process on `link` until it goes away, then ends
/// every session. With a `kernel_timeout`, a session that waits for the GPU
/// longer ends the process (`watch`). `max_mapped_runs` lowers the blob
/// runs it maps at once below what the kernel allows (tests).
pub fn serve(
    link: Link,
    executor: Arc<dyn Executor>,
    counters: Arc<Counters>,
    kernel_timeout: Option<Duration>,
    max_mapped_runs: Option<usize>,
    tenant: Arc<Tenant>,
) -> io::Result<()> {
    info!("worker started ({})", super::containment::describe_self());
    let link = Arc::new(link);
    if let Some(limit) = kernel_timeout {
        let watched = Arc::clone(&tenant);
        std::thread::Builder::new()
            .name("rgpu-watchdog".into())
            .spawn(move || watch(&watched, limit))?;
    }
    let mut worker = Worker {
        link: Arc::clone(&link),
        executor,
        counters,
        tenant,
        files: HashMap::new(),
        runs: HashMap::new(),
        blobs: HashMap::new(),
        unmappable: std::collections::HashSet::new(),
        sessions: HashMap::new(),
        teardowns: Vec::new(),
        run_limit: super::blob_mapping::mapped_runs_limit(max_mapped_runs),
    };
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES + 1];
    let result = loop {
        match link.recv(&mut buf) {
            Ok(Some((len, fds))) => {
                let Some(Ok(message)) = buf.get(..len).map(ToWorker::decode) else {
                    break Err(io::Error::other("undecodable message from the connection"));
                };
                worker.handle(message, fds);
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    worker.finish();
    result
}

/// The watchdog: once a session of this process has waited for the GPU
/// longer than `limit` (its kernel overran), the guest's waiting call is
/// answered with CUDA_ERROR_LAUNCH_TIMEOUT and the process ends, which
/// ends its GPU work; its other contexts are lost with it, as a process
/// whose context the driver tore down.
fn watch(tenant: &Tenant, limit: Duration) {
    let period = (limit / 4).clamp(Duration::from_millis(10), Duration::from_millis(200));
    let mut waits = rgpu_session::WaitWatch::default();
    loop {
        std::thread::sleep(period);
        if let Some(overdue) = tenant.overdue(limit, &mut waits) {
            warn!(
                "context {}: GPU work ran past the {limit:?} kernel timeout; ending this guest \
                 process's worker",
                overdue.ctx_id
            );
            overdue.answer(CUDA_ERROR_LAUNCH_TIMEOUT);
            std::process::exit(WATCHDOG_EXIT);
        }
    }
}

/// The exit status of a worker its watchdog ended.
pub const WATCHDOG_EXIT: i32 = 3;

impl Worker {
    fn handle(&mut self, message: ToWorker, mut fds: Vec<std::os::fd::OwnedFd>) {
        match message {
            ToWorker::File { file } => match fds.pop() {
                Some(fd) => {
                    self.files.insert(file, File::from(fd));
                }
                None => warn!("guest memory file {file} came without a descriptor"),
            },
            ToWorker::BlobRuns { resource_id, runs } => {
                let pending = self.runs.entry(resource_id).or_default();
                if pending.len().saturating_add(runs.len()) > MAX_RUNS_PER_BLOB {
                    rgpu_session::warn_limited!("blob {resource_id}: too many runs; dropped");
                    self.runs.remove(&resource_id);
                } else {
                    pending.extend(runs);
                }
            }
            ToWorker::MapBlob {
                resource_id,
                size,
                address,
            } => self.map_blob(resource_id, size, address),
            ToWorker::CreateSession { ctx_id, name } => self.create_session(ctx_id, name),
            ToWorker::Attach {
                ctx_id,
                resource_id,
            } => match (self.sessions.get(&ctx_id), self.blobs.get(&resource_id)) {
                (Some(session), Some(mapped)) => session.attach_blob(Arc::clone(&mapped.blob)),
                (Some(session), None) if self.unmappable.contains(&resource_id) => {
                    session.unmappable_blob(resource_id)
                }
                _ => debug!("attach of blob {resource_id} to context {ctx_id}: unknown"),
            },
            ToWorker::Detach {
                ctx_id,
                resource_id,
                token,
            } => {
                let done = self.done(token);
                match self.sessions.get(&ctx_id) {
                    Some(session) => session.detach_blob_then(resource_id, done),
                    None => done.complete(),
                }
            }
            ToWorker::ForgetBlob { resource_id, token } => {
                self.unmappable.remove(&resource_id);
                let done = self.done(token);
                match self.blobs.remove(&resource_id) {
                    // Answered when the last session lets go of it.
                    Some(mapped) => mapped.mapping.when_unmapped(done),
                    None => done.complete(),
                }
            }
            ToWorker::Submit {
                ctx_id,
                token,
                payload,
            } => {
                let completion = (token != 0).then(|| self.done(token));
                match (self.sessions.get(&ctx_id), decode_batch(&payload)) {
                    // An unfenced doorbell only wakes the session: coalesced,
                    // so a flood of them queues nothing.
                    (Some(session), Ok(commands))
                        if completion.is_none()
                            && commands
                                .iter()
                                .all(|c| matches!(c.command, ControlCommand::Doorbell { .. })) =>
                    {
                        session.wake()
                    }
                    (Some(session), Ok(commands)) => session.submit(commands, completion),
                    _ => debug!("submission to context {ctx_id} dropped"),
                }
            }
            ToWorker::DestroySession { ctx_id, token } => {
                let done = self.done(token);
                if let Some(session) = self.sessions.remove(&ctx_id) {
                    let spawned = std::thread::Builder::new()
                        .name(format!("rgpu-end-{ctx_id}"))
                        .spawn(move || {
                            session.shutdown();
                            drop(done);
                        });
                    match spawned {
                        Ok(thread) => self.teardowns.push(thread),
                        Err(e) => warn!("context {ctx_id}: cannot start its teardown: {e}"),
                    }
                }
                self.teardowns.retain(|t| !t.is_finished());
            }
        }
    }

    fn done(&self, token: u64) -> Box<dyn Completion> {
        Box::new(Done {
            link: Arc::clone(&self.link),
            token,
        })
    }

    fn mapped_runs(&self) -> usize {
        self.blobs.values().map(|b| b.mapping.runs()).sum()
    }

    fn map_blob(&mut self, resource_id: u32, size: u64, address: u64) {
        let runs = self.runs.remove(&resource_id).unwrap_or_default();
        // The files came for this blob: once it is mapped (or not), they go,
        // so this process holds no more guest memory than its blobs.
        let files = std::mem::take(&mut self.files);
        if self.blobs.contains_key(&resource_id) {
            warn!("blob {resource_id} is mapped already");
            return;
        }
        let mapping = match BlobMapping::map(
            &files,
            &runs,
            size,
            address,
            RunBudget {
                mapped: self.mapped_runs(),
                limit: self.run_limit,
            },
            Arc::clone(&self.executor),
            Arc::clone(&self.counters),
        ) {
            Ok(mapping) => Arc::new(mapping),
            Err(e) => {
                rgpu_session::warn_limited!("blob {resource_id}: not mapped: {e}");
                if matches!(e, MapError::TooManyRuns { .. }) {
                    self.unmappable.insert(resource_id);
                }
                return;
            }
        };
        match Blob::from_mapping(resource_id, mapping.run(), Arc::clone(&mapping)) {
            Ok(blob) => {
                self.blobs.insert(
                    resource_id,
                    MappedBlob {
                        blob: Arc::new(blob),
                        mapping,
                    },
                );
            }
            Err(e) => rgpu_session::warn_limited!("blob {resource_id}: {e}"),
        }
    }

    fn create_session(&mut self, ctx_id: u32, name: String) {
        if self.sessions.contains_key(&ctx_id) {
            warn!("context {ctx_id} exists already");
            return;
        }
        match Session::spawn_in_tenant(
            ctx_id,
            name,
            SESSION_DEVICE,
            Arc::clone(&self.executor),
            Arc::clone(&self.counters),
            Arc::clone(&self.tenant),
        ) {
            Ok(session) => {
                self.sessions.insert(ctx_id, session);
            }
            Err(e) => rgpu_session::warn_limited!("context {ctx_id}: {e}"),
        }
    }

    /// The connection went away: end every session, then let go of every
    /// blob (the process exit frees the rest).
    fn finish(mut self) {
        for (_, session) in self.sessions.drain() {
            session.shutdown();
        }
        for thread in self.teardowns.drain(..) {
            let _ = thread.join();
        }
        self.blobs.clear();
        info!("worker done");
    }
}

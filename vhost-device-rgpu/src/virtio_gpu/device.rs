//! The virtio-gpu device model of one connection: control-queue requests,
//! the contexts and blob resources they create, and the worker processes
//! that run the contexts (one per guest process: [`crate::worker_process`]).
//!
//! Requests are decoded and handed to workers; nothing here waits for the
//! GPU. A fenced `SUBMIT_3D`, and a `RESOURCE_UNREF`, `CTX_DETACH_RESOURCE`
//! or `CTX_DESTROY` (whose memory queued GPU work may still touch), are
//! answered later, by a [`DeferredResponse`] that the worker's `Done` (or
//! its death) completes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use log::{debug, info, trace};
use rgpu_executor::Executor;
use rgpu_proto::batch::decode_batch;
use rgpu_proto::capset::{Capset, DeviceInfo};
use rgpu_proto::process_group::parse_debug_name;
use rgpu_proto::virtio_gpu::*;
use rgpu_proto::wire::{DecodeError, WireReader, WireWriter};
use rgpu_proto::{ControlCommand, CAPSET_ID_RGPU, PROTOCOL_VERSION};
use rgpu_session::{AtomicGuestMemory, Completion, Counters, GuestMemory, MemoryBudget};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Address, GuestAddress, GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};

use super::request::{self, ReadError};
use super::response::{
    add_used, notify_guest, write_response, Chain, DeferredResponse, ReturnError, Vring,
};
use crate::limits;
use crate::worker_process::handle::{self, Retiring};
use crate::worker_process::message::{FileRun, ToWorker, MAX_SUBMIT_PAYLOAD, RUNS_PER_MESSAGE};
use crate::worker_process::{Countdown, WorkerHandle, WorkerLauncher};

/// Guest page size: blob entries are whole pages (workers map them).
const PAGE_BYTES: u64 = 4096;

/// What every connection of the daemon shares: the executor (only asked
/// what it offers: the connection process runs no CUDA work), what its
/// capset describes, the counters, and how to start workers.
#[derive(Clone)]
pub struct DaemonShared {
    pub executor: Arc<dyn Executor>,
    pub counters: Arc<Counters>,
    pub launcher: Arc<WorkerLauncher>,
    /// The devices as the executor offers them, and its driver version
    /// (asked once).
    devices: Arc<[DeviceInfo]>,
    driver_version: i32,
    /// The tenant's memory budget, whose limit its guests see as their
    /// devices' memory.
    budget: Option<Arc<dyn MemoryBudget>>,
}

impl DaemonShared {
    pub fn new(
        executor: Arc<dyn Executor>,
        counters: Arc<Counters>,
        launcher: Arc<WorkerLauncher>,
        budget: Option<Arc<dyn MemoryBudget>>,
    ) -> Self {
        Self {
            devices: executor.devices().into(),
            driver_version: executor.driver_version(),
            executor,
            counters,
            launcher,
            budget,
        }
    }

    /// The capset, encoded now: the tenant's limit may have changed since
    /// this process started (`ctl set`), and a guest that asks now sees the
    /// limit of now as its devices' total memory. (Its length does not
    /// depend on the limit.)
    pub fn capset(&self) -> Vec<u8> {
        let limit = self.budget.as_ref().and_then(|b| b.limit());
        let devices = self
            .devices
            .iter()
            .cloned()
            .map(|mut device| {
                if let Some(limit) = limit {
                    device.total_mem = device.total_mem.min(limit);
                }
                device
            })
            .collect();
        Capset {
            protocol_version: PROTOCOL_VERSION,
            driver_version: self.driver_version,
            executor: self.executor.kind().to_owned(),
            devices,
        }
        .encode()
    }
}

/// Why a request failed; each maps onto a `VIRTIO_GPU_RESP_ERR_*`.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("unsupported command {0:#x}")]
    Unsupported(u32),
    #[error("truncated request: {0}")]
    Truncated(DecodeError),
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    #[error("unknown or duplicate context {0}")]
    InvalidContext(u32),
    #[error("unknown or duplicate resource {0}")]
    InvalidResource(u32),
    #[error("limit reached: {0}")]
    Limit(String),
    #[error("cannot start a worker process: {0}")]
    Worker(std::io::Error),
}

impl RequestError {
    fn response_type(&self) -> u32 {
        match self {
            RequestError::Unsupported(_) | RequestError::Truncated(_) | RequestError::Worker(_) => {
                RESP_ERR_UNSPEC
            }
            RequestError::Limit(_) => RESP_ERR_OUT_OF_MEMORY,
            RequestError::InvalidParameter(_) => RESP_ERR_INVALID_PARAMETER,
            RequestError::InvalidContext(_) => RESP_ERR_INVALID_CONTEXT_ID,
            RequestError::InvalidResource(_) => RESP_ERR_INVALID_RESOURCE_ID,
        }
    }
}

impl From<DecodeError> for RequestError {
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::Truncated { .. } => RequestError::Truncated(e),
            other => RequestError::InvalidParameter(other.to_string()),
        }
    }
}

/// How a request is answered.
enum Outcome {
    /// Now: a response of this type with this body after the header.
    Respond(u32, Vec<u8>),
    /// Later, by the completion the request was handed to.
    Deferred,
}

/// Which worker runs a context: the guest process's group, or (a guest
/// that cannot tag its contexts) one of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum WorkerKey {
    Group(u128),
    Solo(u32),
}

impl std::fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tag is the guest process's secret: logs show a prefix only.
        match self {
            WorkerKey::Group(tag) => write!(f, "{:08x}…", tag >> 96),
            WorkerKey::Solo(ctx_id) => write!(f, "of context {ctx_id}"),
        }
    }
}

/// A blob resource: where its pages lie, and the contexts it is attached to.
struct Resource {
    size: u64,
    /// Where the guest process maps it, for its worker to map it at the
    /// same address (0: anywhere).
    address: u64,
    /// Its pages as runs of guest memory files (what workers map).
    runs: Vec<FileRun>,
    /// Its guest-physical ranges, for the alias check.
    ranges: GuestRanges,
    contexts: BTreeSet<u32>,
}

/// The guest memory files blobs lie in, numbered for the workers.
#[derive(Default)]
struct GuestFiles {
    /// By the address of the region's file (the Arc keeps it unique).
    numbers: HashMap<usize, (u32, Arc<File>)>,
    next: u32,
}

impl GuestFiles {
    fn number(&mut self, file: &Arc<File>) -> u32 {
        let next = &mut self.next;
        self.numbers
            .entry(Arc::as_ptr(file) as usize)
            .or_insert_with(|| {
                *next += 1;
                (*next, Arc::clone(file))
            })
            .0
    }

    fn file(&self, number: u32) -> Option<&Arc<File>> {
        self.numbers
            .values()
            .find(|(n, _)| *n == number)
            .map(|(_, file)| file)
    }
}

/// The device model of one vhost-user connection.
pub struct GpuDevice {
    shared: DaemonShared,
    memory: AtomicGuestMemory,
    /// Each context's worker.
    contexts: HashMap<u32, WorkerKey>,
    workers: HashMap<WorkerKey, WorkerHandle>,
    /// Workers whose guest process has no context left, ending.
    retiring: Vec<Retiring>,
    /// A worker started ahead of the next guest process.
    standby: Option<WorkerHandle>,
    next_worker: u64,
    resources: HashMap<u32, Resource>,
    /// Every guest-physical range of a live blob: start -> (end, resource).
    /// Blobs may not alias (one page pinned and mapped once).
    guest_ranges: BTreeMap<u64, (u64, u32)>,
    /// Blob entries of all live blobs.
    blob_entries: usize,
    files: GuestFiles,
    /// Each context's `PlaceNextBlob`: where its next blob of that size is
    /// mapped in its worker, (address, size).
    placements: HashMap<u32, (u64, u64)>,
}

impl GpuDevice {
    pub fn new(shared: DaemonShared, memory: AtomicGuestMemory) -> Self {
        Self {
            shared,
            memory,
            contexts: HashMap::new(),
            workers: HashMap::new(),
            retiring: Vec::new(),
            standby: None,
            next_worker: 0,
            resources: HashMap::new(),
            guest_ranges: BTreeMap::new(),
            blob_entries: 0,
            files: GuestFiles::default(),
            placements: HashMap::new(),
        }
    }

    /// The frontend sent a new memory table: a guest is there, so a worker
    /// starts ahead of its first CUDA context.
    pub fn set_memory(&mut self, memory: AtomicGuestMemory) {
        self.memory = memory;
        self.warm_standby();
    }

    /// Number of live contexts.
    pub fn session_count(&self) -> usize {
        self.contexts.len()
    }

    /// Worker processes running now, with their contexts.
    pub fn workers(&self) -> Vec<(u32, Vec<u32>)> {
        self.workers
            .values()
            .map(|w| (w.pid(), w.contexts.iter().copied().collect()))
            .collect()
    }

    /// Ends every context and drops every resource: the frontend went away
    /// or reset the device. Workers are killed and reaped before this
    /// returns, and what waited for them is dropped unanswered: after a
    /// reset the guest's requests are void, and no old session, resource or
    /// completion may outlive it.
    pub fn shutdown(&mut self) {
        let mut workers: Vec<WorkerHandle> = self.workers.drain().map(|(_, w)| w).collect();
        workers.extend(self.standby.take());
        if !workers.is_empty() || !self.resources.is_empty() {
            info!(
                "ending {} context(s) in {} worker(s), dropping {} resource(s)",
                self.contexts.len(),
                workers.len(),
                self.resources.len()
            );
        }
        handle::kill_all(
            workers,
            std::mem::take(&mut self.retiring),
            self.shared.launcher.end_grace(),
        );
        self.contexts.clear();
        self.resources.clear();
        self.guest_ranges.clear();
        self.blob_entries = 0;
        self.files = GuestFiles::default();
    }

    /// Answers every request available on the control queue.
    pub fn process_control_queue(&mut self, vring: &Vring) -> Result<(), ReturnError> {
        let mut returned = false;
        loop {
            // One chain at a time, without holding the vring's lock while the
            // request is handled: a session may complete a fence (and take
            // that lock) from inside `submit`.
            let memory = self.memory.memory().into_inner();
            let Some(chain) = vring.get_mut().get_queue_mut().pop_descriptor_chain(memory) else {
                break;
            };
            let head = chain.head_index();
            if let Some(len) = self.handle_chain(vring, &chain) {
                add_used(vring, head, len)?;
                returned = true;
            }
        }
        if returned {
            notify_guest(vring)?;
        }
        Ok(())
    }

    /// The cursor queue carries nothing rgpu uses: every chain goes back
    /// with nothing written.
    pub fn process_cursor_queue(&mut self, vring: &Vring) -> Result<(), ReturnError> {
        let mut returned = false;
        loop {
            let memory = self.memory.memory().into_inner();
            let Some(chain) = vring.get_mut().get_queue_mut().pop_descriptor_chain(memory) else {
                break;
            };
            add_used(vring, chain.head_index(), 0)?;
            returned = true;
        }
        if returned {
            notify_guest(vring)?;
        }
        Ok(())
    }

    /// Handles one request; returns the response length when it was
    /// answered now.
    fn handle_chain(&mut self, vring: &Vring, chain: &Chain) -> Option<u32> {
        let bytes = match request::read_request(chain) {
            Ok(bytes) => bytes,
            Err(e) => {
                debug!("control request {}: {e}", chain.head_index());
                return Some(respond_error(chain, &e));
            }
        };
        let Some(hdr) = request::header(&bytes) else {
            debug!("control request of {} bytes has no header", bytes.len());
            let response = CtrlHdr::default().response(RESP_ERR_UNSPEC).to_bytes();
            return Some(write_response(chain, &response));
        };
        trace!(
            "control request {:#06x} ctx {} flags {:#x} fence {} ring {} ({} bytes)",
            hdr.type_,
            hdr.ctx_id,
            hdr.flags,
            hdr.fence_id,
            hdr.ring_idx,
            bytes.len()
        );
        let (type_, body) = match self.dispatch(vring, chain, &hdr, request::body(&bytes)) {
            Ok(Outcome::Deferred) => return None,
            Ok(Outcome::Respond(type_, body)) => (type_, body),
            Err(e) => {
                debug!("control request {:#06x} ctx {}: {e}", hdr.type_, hdr.ctx_id);
                (e.response_type(), Vec::new())
            }
        };
        let mut w = WireWriter::with_capacity(CTRL_HDR_SIZE + body.len());
        hdr.response(type_).encode(&mut w);
        w.raw(&body);
        Some(write_response(chain, w.as_bytes()))
    }

    fn dispatch(
        &mut self,
        vring: &Vring,
        chain: &Chain,
        hdr: &CtrlHdr,
        body: &[u8],
    ) -> Result<Outcome, RequestError> {
        match hdr.type_ {
            CMD_GET_DISPLAY_INFO => Ok(Outcome::Respond(
                RESP_OK_DISPLAY_INFO,
                vec![0; DISPLAY_INFO_SIZE - CTRL_HDR_SIZE],
            )),
            CMD_GET_CAPSET_INFO => self.get_capset_info(body),
            CMD_GET_CAPSET => self.get_capset(body),
            CMD_CTX_CREATE => self.ctx_create(hdr, body),
            CMD_CTX_DESTROY => self.ctx_destroy(vring, chain, hdr),
            CMD_RESOURCE_CREATE_BLOB => self.resource_create_blob(body),
            CMD_RESOURCE_UNREF => self.resource_unref(vring, chain, hdr, body),
            CMD_CTX_ATTACH_RESOURCE => self.ctx_attach_resource(hdr.ctx_id, body),
            CMD_CTX_DETACH_RESOURCE => self.ctx_detach_resource(vring, chain, hdr, body),
            CMD_SUBMIT_3D => self.submit_3d(vring, chain, hdr, body),
            other => Err(RequestError::Unsupported(other)),
        }
    }

    fn get_capset_info(&self, body: &[u8]) -> Result<Outcome, RequestError> {
        let index = request::capset_index(body)?;
        if index != 0 {
            return Err(RequestError::InvalidParameter(format!(
                "capset index {index}"
            )));
        }
        let mut w = WireWriter::with_capacity(16);
        w.u32(CAPSET_ID_RGPU)
            .u32(PROTOCOL_VERSION)
            .u32(u32::try_from(self.shared.capset().len()).unwrap_or(u32::MAX))
            .u32(0);
        Ok(Outcome::Respond(RESP_OK_CAPSET_INFO, w.into_bytes()))
    }

    fn get_capset(&self, body: &[u8]) -> Result<Outcome, RequestError> {
        // Every version up to PROTOCOL_VERSION gets the same payload: it
        // carries its own version for the guest to check.
        let (id, _version) = request::capset_request(body)?;
        if id != CAPSET_ID_RGPU {
            return Err(RequestError::InvalidParameter(format!("capset id {id}")));
        }
        Ok(Outcome::Respond(RESP_OK_CAPSET, self.shared.capset()))
    }

    fn ctx_create(&mut self, hdr: &CtrlHdr, body: &[u8]) -> Result<Outcome, RequestError> {
        let create = request::ctx_create(body)?;
        let capset = create.context_init & CONTEXT_INIT_CAPSET_ID_MASK;
        if capset != CAPSET_ID_RGPU {
            return Err(RequestError::InvalidParameter(format!(
                "context type {capset}, only {CAPSET_ID_RGPU} (rgpu) is offered"
            )));
        }
        let ctx_id = hdr.ctx_id;
        if ctx_id == 0 || self.contexts.contains_key(&ctx_id) {
            return Err(RequestError::InvalidContext(ctx_id));
        }
        if self.contexts.len() >= limits::MAX_CONTEXTS {
            return Err(RequestError::Limit(format!(
                "{} contexts per connection",
                limits::MAX_CONTEXTS
            )));
        }
        let (tag, name) = parse_debug_name(&create.debug_name);
        let key = match tag {
            Some(tag) => WorkerKey::Group(tag),
            None => WorkerKey::Solo(ctx_id),
        };
        // A guest process whose worker died starts afresh in a new one.
        if self.workers.get(&key).is_some_and(|w| !w.is_alive()) {
            if let Some(dead) = self.workers.remove(&key) {
                for ctx in &dead.contexts {
                    self.contexts.remove(ctx);
                }
                self.retire(dead);
            }
        }
        if !self.workers.contains_key(&key) {
            if self.workers.len() >= limits::MAX_WORKERS {
                return Err(RequestError::Limit(format!(
                    "{} worker processes per connection",
                    limits::MAX_WORKERS
                )));
            }
            let mut worker = self.take_worker().map_err(RequestError::Worker)?;
            worker.adopt(&key.to_string());
            self.workers.insert(key, worker);
            self.warm_standby();
        }
        let Some(worker) = self.workers.get_mut(&key) else {
            return Err(RequestError::InvalidContext(ctx_id));
        };
        worker.send(
            &ToWorker::CreateSession {
                ctx_id,
                name: name.to_owned(),
            },
            &[],
        );
        worker.contexts.insert(ctx_id);
        info!(
            "context {ctx_id} created for \"{name}\" in worker {} (process {})",
            worker.id(),
            worker.pid()
        );
        self.contexts.insert(ctx_id, key);
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    /// A worker for a new guest process: the standby if it is alive (its
    /// executor has started meanwhile: the guest's first call does not wait
    /// for CUDA's initialisation), else a new one.
    fn take_worker(&mut self) -> std::io::Result<WorkerHandle> {
        if let Some(standby) = self.standby.take() {
            if standby.is_alive() {
                return Ok(standby);
            }
            self.retire(standby);
        }
        self.next_worker += 1;
        WorkerHandle::start(&self.shared.launcher, self.next_worker)
    }

    /// Starts the next standby worker (it holds no device memory until a
    /// context uses it).
    fn warm_standby(&mut self) {
        if self.standby.is_some() {
            return;
        }
        self.next_worker += 1;
        match WorkerHandle::start(&self.shared.launcher, self.next_worker) {
            Ok(worker) => self.standby = Some(worker),
            Err(e) => debug!("no standby worker: {e}"),
        }
    }

    /// Lets `worker` end, keeping track of it until it has.
    fn retire(&mut self, worker: WorkerHandle) {
        self.retiring.retain(|r| !r.is_finished());
        if let Some(retiring) = worker.retire(limits::RETIRE_GRACE) {
            self.retiring.push(retiring);
        }
    }

    /// Which worker runs a live context.
    fn key_of(&self, ctx_id: u32) -> Result<WorkerKey, RequestError> {
        self.contexts
            .get(&ctx_id)
            .copied()
            .ok_or(RequestError::InvalidContext(ctx_id))
    }

    /// The worker of a live context.
    fn worker_of(&mut self, ctx_id: u32) -> Result<(WorkerKey, &mut WorkerHandle), RequestError> {
        let key = self.key_of(ctx_id)?;
        let worker = self
            .workers
            .get_mut(&key)
            .ok_or(RequestError::InvalidContext(ctx_id))?;
        Ok((key, worker))
    }

    fn ctx_destroy(
        &mut self,
        vring: &Vring,
        chain: &Chain,
        hdr: &CtrlHdr,
    ) -> Result<Outcome, RequestError> {
        let ctx_id = hdr.ctx_id;
        let (key, _) = self.worker_of(ctx_id)?;
        self.contexts.remove(&ctx_id);
        self.placements.remove(&ctx_id);
        let countdown = deferred(vring, chain, hdr);
        // The session's end lets go of its blobs; blobs no other context of
        // the worker uses are unmapped there.
        let mut unused = Vec::new();
        for (id, resource) in &mut self.resources {
            resource.contexts.remove(&ctx_id);
            unused.push(*id);
        }
        let Some(worker) = self.workers.get_mut(&key) else {
            return Ok(Outcome::Deferred);
        };
        worker.contexts.remove(&ctx_id);
        worker.send_then(
            |token| ToWorker::DestroySession { ctx_id, token },
            countdown.part(),
        );
        if worker.contexts.is_empty() {
            // The guest process has no context left: its worker ends, and
            // the answer comes once it is gone.
            if let Some(worker) = self.workers.remove(&key) {
                info!(
                    "context {ctx_id} destroyed; worker {} (process {}) retires",
                    worker.id(),
                    worker.pid()
                );
                self.retire(worker);
            }
            return Ok(Outcome::Deferred);
        }
        for id in unused {
            Self::forget_if_unused(&self.resources, worker, id, &countdown);
        }
        info!("context {ctx_id} destroyed");
        Ok(Outcome::Deferred)
    }

    /// Unmaps blob `id` in `worker` if none of the worker's contexts has it
    /// attached any more (or it is gone); `countdown` waits for that.
    fn forget_if_unused(
        resources: &HashMap<u32, Resource>,
        worker: &mut WorkerHandle,
        id: u32,
        countdown: &Countdown,
    ) {
        if !worker.blobs_mapped.contains(&id) {
            return;
        }
        let used = resources
            .get(&id)
            .is_some_and(|r| r.contexts.iter().any(|c| worker.contexts.contains(c)));
        if !used {
            worker.blobs_mapped.remove(&id);
            worker.send_then(
                |token| ToWorker::ForgetBlob {
                    resource_id: id,
                    token,
                },
                countdown.part(),
            );
        }
    }

    fn resource_create_blob(&mut self, body: &[u8]) -> Result<Outcome, RequestError> {
        let create = ResourceCreateBlob::decode(&mut WireReader::new(body))?;
        let id = create.resource_id;
        if id == 0 || self.resources.contains_key(&id) {
            return Err(RequestError::InvalidResource(id));
        }
        if create.blob_mem != BLOB_MEM_GUEST {
            return Err(RequestError::InvalidParameter(format!(
                "blob_mem {}, only guest blobs are offered",
                create.blob_mem
            )));
        }
        if self.resources.len() >= limits::MAX_RESOURCES {
            return Err(RequestError::Limit(format!(
                "{} resources per connection",
                limits::MAX_RESOURCES
            )));
        }
        if self.blob_entries.saturating_add(create.entries.len()) > limits::MAX_BLOB_ENTRIES {
            return Err(RequestError::Limit(format!(
                "{} blob entries per connection",
                limits::MAX_BLOB_ENTRIES
            )));
        }
        let memory = self.memory.memory().into_inner();
        let (runs, ranges) = blob_runs(&memory, &mut self.files, create.size, &create.entries)
            .map_err(RequestError::InvalidParameter)?;
        self.claim_ranges(id, &ranges)?;
        debug!(
            "resource {id}: guest blob of {} bytes in {} entries, {} runs",
            create.size,
            create.entries.len(),
            runs.len()
        );
        self.blob_entries += create.entries.len();
        self.resources.insert(
            id,
            Resource {
                size: create.size,
                address: same_address(create.blob_id, create.size),
                runs,
                ranges,
                contexts: BTreeSet::new(),
            },
        );
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    /// Records `ranges` as resource `id`'s, unless one overlaps a live
    /// blob's or another of them.
    fn claim_ranges(&mut self, id: u32, ranges: &[(u64, u64)]) -> Result<(), RequestError> {
        for (i, &(start, end)) in ranges.iter().enumerate() {
            let overlap = self
                .guest_ranges
                .range(..end)
                .next_back()
                .filter(|(_, (other_end, _))| *other_end > start)
                .map(|(_, (_, owner))| *owner);
            if let Some(owner) = overlap {
                for &(start, _) in ranges.iter().take(i) {
                    self.guest_ranges.remove(&start);
                }
                return Err(RequestError::InvalidParameter(format!(
                    "blob entry at {start:#x} overlaps resource {owner}'s memory"
                )));
            }
            self.guest_ranges.insert(start, (end, id));
        }
        Ok(())
    }

    fn release_ranges(&mut self, resource: &Resource) {
        for (start, _) in &resource.ranges {
            self.guest_ranges.remove(start);
        }
        self.blob_entries = self.blob_entries.saturating_sub(resource.ranges.len());
    }

    fn resource_unref(
        &mut self,
        vring: &Vring,
        chain: &Chain,
        hdr: &CtrlHdr,
        body: &[u8],
    ) -> Result<Outcome, RequestError> {
        let id = request::resource_id(body)?;
        let resource = self
            .resources
            .remove(&id)
            .ok_or(RequestError::InvalidResource(id))?;
        self.release_ranges(&resource);
        // Answered when no worker can touch the pages any more: the guest
        // frees them on this answer.
        let countdown = deferred(vring, chain, hdr);
        for ctx_id in &resource.contexts {
            if let Ok((_, worker)) = self.worker_of(*ctx_id) {
                worker.send(
                    &ToWorker::Detach {
                        ctx_id: *ctx_id,
                        resource_id: id,
                        token: 0,
                    },
                    &[],
                );
            }
        }
        for worker in self.workers.values_mut() {
            Self::forget_if_unused(&self.resources, worker, id, &countdown);
        }
        Ok(Outcome::Deferred)
    }

    fn ctx_attach_resource(&mut self, ctx_id: u32, body: &[u8]) -> Result<Outcome, RequestError> {
        let id = request::resource_id(body)?;
        if !self.resources.contains_key(&id) {
            return Err(RequestError::InvalidResource(id));
        }
        let key = self.key_of(ctx_id)?;
        let resource = self
            .resources
            .get_mut(&id)
            .ok_or(RequestError::InvalidResource(id))?;
        let worker = self
            .workers
            .get_mut(&key)
            .ok_or(RequestError::InvalidContext(ctx_id))?;
        if !resource.contexts.insert(ctx_id) {
            return Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()));
        }
        if !worker.blobs_mapped.contains(&id) {
            // The context said where its next blob of this size goes (a
            // guest kernel keeps blob ids of guest blobs at zero).
            if let Some((address, size)) = self.placements.remove(&ctx_id) {
                if resource.address == 0 && size == resource.size {
                    resource.address = same_address(address, size);
                }
            }
            send_blob(worker, &self.files, id, resource);
        }
        worker.send(
            &ToWorker::Attach {
                ctx_id,
                resource_id: id,
            },
            &[],
        );
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn ctx_detach_resource(
        &mut self,
        vring: &Vring,
        chain: &Chain,
        hdr: &CtrlHdr,
        body: &[u8],
    ) -> Result<Outcome, RequestError> {
        let ctx_id = hdr.ctx_id;
        let id = request::resource_id(body)?;
        let key = self.key_of(ctx_id)?;
        let resource = self
            .resources
            .get_mut(&id)
            .ok_or(RequestError::InvalidResource(id))?;
        if !resource.contexts.remove(&ctx_id) {
            return Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()));
        }
        let Some(worker) = self.workers.get_mut(&key) else {
            return Err(RequestError::InvalidContext(ctx_id));
        };
        let countdown = deferred(vring, chain, hdr);
        worker.send_then(
            |token| ToWorker::Detach {
                ctx_id,
                resource_id: id,
                token,
            },
            countdown.part(),
        );
        Self::forget_if_unused(&self.resources, worker, id, &countdown);
        Ok(Outcome::Deferred)
    }

    fn submit_3d(
        &mut self,
        vring: &Vring,
        chain: &Chain,
        hdr: &CtrlHdr,
        body: &[u8],
    ) -> Result<Outcome, RequestError> {
        let (_, worker) = self.worker_of(hdr.ctx_id)?;
        let payload = request::submit_payload(body)
            .map_err(|e| RequestError::InvalidParameter(format!("SUBMIT_3D size: {e}")))?;
        let commands = decode_batch(payload)
            .map_err(|e| RequestError::InvalidParameter(format!("batch: {e}")))?;
        // Where the next blob goes: this process's business, not the
        // worker's; alone in its submission.
        let placement = commands.iter().find_map(|c| match c.command {
            ControlCommand::PlaceNextBlob { address, size } => Some((address, size)),
            _ => None,
        });
        if let Some(placement) = placement {
            if commands.len() != 1 {
                return Err(RequestError::InvalidParameter(
                    "PlaceNextBlob shares its submission".into(),
                ));
            }
            self.placements.insert(hdr.ctx_id, placement);
            return Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()));
        }
        if payload.len() > MAX_SUBMIT_PAYLOAD {
            return Err(RequestError::InvalidParameter(format!(
                "SUBMIT_3D of {} bytes (at most {MAX_SUBMIT_PAYLOAD})",
                payload.len()
            )));
        }
        let ctx_id = hdr.ctx_id;
        if hdr.flags & FLAG_FENCE == 0 {
            worker.send(
                &ToWorker::Submit {
                    ctx_id,
                    token: 0,
                    payload: payload.to_vec(),
                },
                &[],
            );
            return Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()));
        }
        let completion = Box::new(DeferredResponse::new(vring.clone(), chain.clone(), hdr));
        if worker.waiting() >= limits::MAX_PENDING_FENCES {
            debug!(
                "context {ctx_id}: {} fences pending; answering this one at once",
                limits::MAX_PENDING_FENCES
            );
            completion.complete();
            return Ok(Outcome::Deferred);
        }
        worker.send_then(
            |token| ToWorker::Submit {
                ctx_id,
                token,
                payload: payload.to_vec(),
            },
            completion,
        );
        Ok(Outcome::Deferred)
    }
}

/// A response the countdown answers once every part of it completed.
fn deferred(vring: &Vring, chain: &Chain, hdr: &CtrlHdr) -> Countdown {
    Countdown::new(Box::new(DeferredResponse::new(
        vring.clone(),
        chain.clone(),
        hdr,
    )))
}

/// Sends a blob's guest memory files and runs to `worker`, and has it map
/// the blob. The worker closes the files once it has mapped the blob: it
/// holds guest memory only as the mappings of its own blobs.
fn send_blob(worker: &mut WorkerHandle, files: &GuestFiles, id: u32, resource: &Resource) {
    let mut sent = BTreeSet::new();
    for run in &resource.runs {
        if !sent.insert(run.file) {
            continue;
        }
        if let Some(file) = files.file(run.file) {
            worker.send(&ToWorker::File { file: run.file }, &[file.as_raw_fd()]);
        }
    }
    for runs in resource.runs.chunks(RUNS_PER_MESSAGE) {
        worker.send(
            &ToWorker::BlobRuns {
                resource_id: id,
                runs: runs.to_vec(),
            },
            &[],
        );
    }
    worker.send(
        &ToWorker::MapBlob {
            resource_id: id,
            size: resource.size,
            address: resource.address,
        },
        &[],
    );
    worker.blobs_mapped.insert(id);
}

/// The address a guest process asked its blob to be mapped at in its
/// worker (a blob's id, in rgpu's context type): page-aligned and inside
/// the user half of a 47-bit address space, or 0 (anywhere).
fn same_address(blob_id: u64, size: u64) -> u64 {
    const USER_END: u64 = 1 << 47;
    let fits = blob_id.checked_add(size).is_some_and(|end| end <= USER_END);
    if blob_id.is_multiple_of(PAGE_BYTES) && fits {
        blob_id
    } else {
        debug!("blob id {blob_id:#x} is no place for a blob of {size} bytes; mapped anywhere");
        0
    }
}

/// Guest-physical ranges (start, end) of a blob's entries.
type GuestRanges = Vec<(u64, u64)>;

/// A blob's entries as runs of guest memory files (adjacent ones merged)
/// and as guest-physical ranges; every entry must be whole pages inside one
/// file-backed region, and the entries must cover exactly `size` bytes.
fn blob_runs(
    memory: &GuestMemory,
    files: &mut GuestFiles,
    size: u64,
    entries: &[MemEntry],
) -> Result<(Vec<FileRun>, GuestRanges), String> {
    if size == 0 {
        return Err("blob size is zero".into());
    }
    let mut runs: Vec<FileRun> = Vec::new();
    let mut ranges = Vec::new();
    let mut covered = 0u64;
    for entry in entries.iter().filter(|e| e.length > 0) {
        let length = u64::from(entry.length);
        if entry.addr % PAGE_BYTES != 0 || length % PAGE_BYTES != 0 {
            return Err(format!(
                "blob entry at {:#x} (+{length:#x}) is not whole pages",
                entry.addr
            ));
        }
        let outside = || {
            format!(
                "blob entry at guest address {:#x} (+{length}) is not inside one guest memory \
                 region",
                entry.addr
            )
        };
        let end = entry.addr.checked_add(length).ok_or_else(outside)?;
        let region = memory
            .find_region(GuestAddress(entry.addr))
            .ok_or_else(outside)?;
        if end - 1 > region.last_addr().raw_value() {
            return Err(outside());
        }
        let file_offset = region.file_offset().ok_or_else(|| {
            format!(
                "guest memory at {:#x} is not shared through a file",
                entry.addr
            )
        })?;
        let offset = file_offset
            .start()
            .checked_add(entry.addr - region.start_addr().raw_value())
            .ok_or_else(outside)?;
        let file = files.number(file_offset.arc());
        covered = covered
            .checked_add(length)
            .filter(|c| *c <= size)
            .ok_or_else(|| format!("blob entries cover more than its {size} bytes"))?;
        ranges.push((entry.addr, end));
        match runs.last_mut() {
            Some(last)
                if last.file == file && last.offset.checked_add(last.len) == Some(offset) =>
            {
                last.len += length;
            }
            _ => runs.push(FileRun {
                file,
                offset,
                len: length,
            }),
        }
    }
    if covered != size {
        return Err(format!(
            "blob entries cover {covered} bytes, blob size is {size}"
        ));
    }
    Ok((runs, ranges))
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The error response for a request that could not be read.
fn respond_error(chain: &Chain, error: &ReadError) -> u32 {
    let hdr = error.header().unwrap_or_default();
    write_response(chain, &hdr.response(RESP_ERR_UNSPEC).to_bytes())
}

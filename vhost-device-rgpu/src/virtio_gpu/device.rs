//! The virtio-gpu device model of one connection: control-queue requests,
//! the contexts (sessions) and blob resources they create.
//!
//! Requests are decoded and handed to sessions; nothing here waits for the
//! GPU. A fenced `SUBMIT_3D` is answered by its session's worker thread
//! through a [`FenceCompletion`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use log::{debug, info, trace, warn};
use rgpu_executor::Executor;
use rgpu_proto::batch::decode_batch;
use rgpu_proto::capset::Capset;
use rgpu_proto::virtio_gpu::*;
use rgpu_proto::wire::{DecodeError, WireReader, WireWriter};
use rgpu_proto::{CAPSET_ID_RGPU, PROTOCOL_VERSION};
use rgpu_session::{AtomicGuestMemory, Blob, Counters, DmaRegistry, Session, SessionError, Tenant};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;

use super::request::{self, ReadError};
use super::response::{
    add_used, notify_guest, write_response, Chain, FenceCompletion, ReturnError, Vring,
};

/// The guest ordinal of the GPU every session uses: the daemon offers one GPU
/// (its `--gpu`), which guests see as device 0.
const SESSION_DEVICE: u32 = 0;

/// What every connection of the daemon shares: the executor, the capset it
/// is described by (encoded once), and the counters.
#[derive(Clone)]
pub struct DaemonShared {
    pub executor: Arc<dyn Executor>,
    pub capset: Arc<[u8]>,
    pub counters: Arc<Counters>,
}

impl DaemonShared {
    pub fn new(executor: Arc<dyn Executor>, counters: Arc<Counters>) -> Self {
        let capset = Capset {
            protocol_version: PROTOCOL_VERSION,
            driver_version: executor.driver_version(),
            executor: executor.kind().to_owned(),
            devices: executor.devices(),
        }
        .encode();
        Self {
            executor,
            capset: capset.into(),
            counters,
        }
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
    #[error("session could not start: {0}")]
    Session(SessionError),
}

impl RequestError {
    fn response_type(&self) -> u32 {
        match self {
            RequestError::Unsupported(_)
            | RequestError::Truncated(_)
            | RequestError::Session(_) => RESP_ERR_UNSPEC,
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

/// A blob resource and the contexts it is attached to.
struct Resource {
    blob: Arc<Blob>,
    contexts: BTreeSet<u32>,
}

/// The device model of one vhost-user connection.
pub struct GpuDevice {
    shared: DaemonShared,
    memory: AtomicGuestMemory,
    sessions: HashMap<u32, Session>,
    resources: HashMap<u32, Resource>,
    /// Guest memory registered for DMA; declared after `sessions` so it is
    /// unregistered only once no session can copy any more.
    dma: DmaRegistry,
    /// One tenant per connection: a VM's sessions (its processes) are the
    /// tenant's own for NVML's process list.
    tenant: Arc<Tenant>,
}

impl GpuDevice {
    pub fn new(shared: DaemonShared, memory: AtomicGuestMemory) -> Self {
        let dma = DmaRegistry::new(shared.executor.clone(), shared.counters.clone());
        Self {
            shared,
            memory,
            sessions: HashMap::new(),
            resources: HashMap::new(),
            dma,
            tenant: Tenant::new(),
        }
    }

    /// The frontend sent a new memory table.
    pub fn set_memory(&mut self, memory: AtomicGuestMemory) {
        self.memory = memory;
    }

    /// Number of live contexts (sessions).
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Ends every session (completing their pending fences) and drops every
    /// resource: the frontend went away or reset the device.
    pub fn shutdown(&mut self) {
        self.resources.clear();
        for (ctx_id, session) in self.sessions.drain() {
            debug!("shutting down context {ctx_id}");
            session.shutdown();
        }
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
            CMD_CTX_DESTROY => self.ctx_destroy(hdr.ctx_id),
            CMD_RESOURCE_CREATE_BLOB => self.resource_create_blob(body),
            CMD_RESOURCE_UNREF => self.resource_unref(body),
            CMD_CTX_ATTACH_RESOURCE => self.ctx_attach_resource(hdr.ctx_id, body),
            CMD_CTX_DETACH_RESOURCE => self.ctx_detach_resource(hdr.ctx_id, body),
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
            .u32(u32::try_from(self.shared.capset.len()).unwrap_or(u32::MAX))
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
        Ok(Outcome::Respond(
            RESP_OK_CAPSET,
            self.shared.capset.to_vec(),
        ))
    }

    fn ctx_create(&mut self, hdr: &CtrlHdr, body: &[u8]) -> Result<Outcome, RequestError> {
        let create = request::ctx_create(body)?;
        let capset = create.context_init & CONTEXT_INIT_CAPSET_ID_MASK;
        if capset != CAPSET_ID_RGPU {
            return Err(RequestError::InvalidParameter(format!(
                "context type {capset}, only {CAPSET_ID_RGPU} (rgpu) is offered"
            )));
        }
        if hdr.ctx_id == 0 || self.sessions.contains_key(&hdr.ctx_id) {
            return Err(RequestError::InvalidContext(hdr.ctx_id));
        }
        let session = Session::spawn_in_tenant(
            hdr.ctx_id,
            create.debug_name.clone(),
            SESSION_DEVICE,
            self.shared.executor.clone(),
            self.shared.counters.clone(),
            self.tenant.clone(),
        )
        .map_err(|e| {
            warn!("context {} ({}): {e}", hdr.ctx_id, create.debug_name);
            RequestError::Session(e)
        })?;
        info!(
            "context {} created for \"{}\"",
            hdr.ctx_id, create.debug_name
        );
        self.sessions.insert(hdr.ctx_id, session);
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn ctx_destroy(&mut self, ctx_id: u32) -> Result<Outcome, RequestError> {
        let session = self
            .sessions
            .remove(&ctx_id)
            .ok_or(RequestError::InvalidContext(ctx_id))?;
        for resource in self.resources.values_mut() {
            resource.contexts.remove(&ctx_id);
        }
        session.shutdown();
        info!("context {ctx_id} destroyed");
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn resource_create_blob(&mut self, body: &[u8]) -> Result<Outcome, RequestError> {
        let create = ResourceCreateBlob::decode(&mut WireReader::new(body))?;
        if create.resource_id == 0 || self.resources.contains_key(&create.resource_id) {
            return Err(RequestError::InvalidResource(create.resource_id));
        }
        if create.blob_mem != BLOB_MEM_GUEST {
            return Err(RequestError::InvalidParameter(format!(
                "blob_mem {}, only guest blobs are offered",
                create.blob_mem
            )));
        }
        let blob = Blob::new(
            create.resource_id,
            create.size,
            &create.entries,
            &self.memory,
        )
        .map_err(|e| RequestError::InvalidParameter(e.to_string()))?;
        blob.set_dma_registered(self.dma.cover(&blob));
        debug!(
            "resource {}: guest blob of {} bytes in {} entries (registered for DMA: {})",
            create.resource_id,
            create.size,
            create.entries.len(),
            blob.dma_registered()
        );
        self.resources.insert(
            create.resource_id,
            Resource {
                blob: Arc::new(blob),
                contexts: BTreeSet::new(),
            },
        );
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn resource_unref(&mut self, body: &[u8]) -> Result<Outcome, RequestError> {
        let id = request::resource_id(body)?;
        let resource = self
            .resources
            .remove(&id)
            .ok_or(RequestError::InvalidResource(id))?;
        for ctx_id in &resource.contexts {
            if let Some(session) = self.sessions.get(ctx_id) {
                session.detach_blob(id);
            }
        }
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn ctx_attach_resource(&mut self, ctx_id: u32, body: &[u8]) -> Result<Outcome, RequestError> {
        let id = request::resource_id(body)?;
        let session = self
            .sessions
            .get(&ctx_id)
            .ok_or(RequestError::InvalidContext(ctx_id))?;
        let resource = self
            .resources
            .get_mut(&id)
            .ok_or(RequestError::InvalidResource(id))?;
        if resource.contexts.insert(ctx_id) {
            session.attach_blob(resource.blob.clone());
        }
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn ctx_detach_resource(&mut self, ctx_id: u32, body: &[u8]) -> Result<Outcome, RequestError> {
        let id = request::resource_id(body)?;
        let session = self
            .sessions
            .get(&ctx_id)
            .ok_or(RequestError::InvalidContext(ctx_id))?;
        let resource = self
            .resources
            .get_mut(&id)
            .ok_or(RequestError::InvalidResource(id))?;
        if resource.contexts.remove(&ctx_id) {
            session.detach_blob(id);
        }
        Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
    }

    fn submit_3d(
        &mut self,
        vring: &Vring,
        chain: &Chain,
        hdr: &CtrlHdr,
        body: &[u8],
    ) -> Result<Outcome, RequestError> {
        let session = self
            .sessions
            .get(&hdr.ctx_id)
            .ok_or(RequestError::InvalidContext(hdr.ctx_id))?;
        let payload = request::submit_payload(body)
            .map_err(|e| RequestError::InvalidParameter(format!("SUBMIT_3D size: {e}")))?;
        let commands = decode_batch(payload)
            .map_err(|e| RequestError::InvalidParameter(format!("batch: {e}")))?;
        if hdr.flags & FLAG_FENCE != 0 {
            let completion = FenceCompletion::new(vring.clone(), chain.clone(), hdr);
            session.submit(commands, Some(Box::new(completion)));
            Ok(Outcome::Deferred)
        } else {
            session.submit(commands, None);
            Ok(Outcome::Respond(RESP_OK_NODATA, Vec::new()))
        }
    }
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

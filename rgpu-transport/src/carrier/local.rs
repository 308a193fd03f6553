//! The local carrier: this process is its own vhost-user frontend (as DPDK's
//! virtio-user is), driving the daemon's virtio-gpu device directly over its
//! socket. "Guest memory" is a memfd shared with the daemon; this module
//! plays both the VMM (vhost-user setup) and the guest's virtio-gpu driver
//! (control queue requests).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rgpu_proto::capset::Capset;
use rgpu_proto::process_group::tagged_debug_name;
use rgpu_proto::virtio_gpu::{self as gpu, CtrlHdr, MemEntry, ResourceCreateBlob};
use rgpu_proto::wire::{WireReader, WireWriter};
use rgpu_proto::{CAPSET_ID_RGPU, PROTOCOL_VERSION};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{
    Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use vmm_sys_util::eventfd::{EventFd, EFD_CLOEXEC, EFD_NONBLOCK};

use super::virtqueue::{SplitQueue, VirtqueueError, QUEUE_SIZE};
use super::{scattered, BlobMapping, Carrier, CarrierError, FenceToken};
use crate::guest_memory::{GuestMemory, GuestMemoryError};

const CONTROL_QUEUE: usize = 0;
const CURSOR_QUEUE: usize = 1;
const NUM_QUEUES: u64 = 2;
/// Largest blob memory entry: its length field is 32 bits.
const MAX_ENTRY_BYTES: u64 = 2 << 30;
/// Largest capset payload accepted from the device.
const MAX_CAPSET_BYTES: u32 = 16 << 20;
/// How long one blocking wait lasts before the socket is checked again.
const POLL_INTERVAL_MS: i32 = 100;
/// Default of `RGPU_SPIN_US`.
const DEFAULT_SPIN_US: u64 = 50;

/// Reads `RGPU_SPIN_US` (default 50): how long to poll before sleeping.
pub fn spin_from_env() -> Duration {
    let us = std::env::var("RGPU_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_SPIN_US);
    Duration::from_micros(us)
}

/// A control request on the device: its buffers and who waits for it.
struct InFlight {
    request: u64,
    gpa: u64,
    response_gpa: u64,
    response_len: u32,
}

struct ControlState {
    queue: SplitQueue,
    /// By descriptor head.
    in_flight: HashMap<u16, InFlight>,
    /// Responses not yet picked up, by request number.
    completed: HashMap<u64, Vec<u8>>,
    /// One thread at a time sleeps on the call eventfd; the others on the
    /// condition variable, woken by whoever drains the used ring.
    poller_active: bool,
    broken: Option<String>,
}

/// The vhost-user frontend of one connection to the daemon.
pub struct LocalCarrier {
    /// Holds the socket open; dropping it (first of the fields) tells the
    /// daemon to free everything this process had.
    _frontend: Frontend,
    socket_fd: RawFd,
    memory: Arc<GuestMemory>,
    capset: Capset,
    control: Mutex<ControlState>,
    drained: Condvar,
    kick: EventFd,
    call: EventFd,
    /// The cursor queue is set up (the device model expects it) but unused.
    _cursor: (EventFd, EventFd),
    spin: Duration,
    next_request: AtomicU64,
    next_ctx: AtomicU32,
    next_resource: AtomicU32,
    next_fence: AtomicU64,
    /// Blob resource id -> where its memory is.
    blobs: Mutex<HashMap<u32, LocalBlob>>,
    /// `RGPU_LOCAL_SCATTER_BLOBS`: large blobs are scattered page runs.
    scatter: bool,
}

/// A blob's memory: a contiguous range of guest memory at `gpa`, and, for
/// a scattered blob, the process's own view of its runs in blob order.
struct LocalBlob {
    gpa: u64,
    scattered_view: Option<(*mut u8, u64)>,
}

// SAFETY: the view pointer is only an address of a mapping this carrier
// owns and unmaps once, under the `blobs` mutex.
unsafe impl Send for LocalBlob {}

fn handshake(step: &'static str) -> impl Fn(vhost::Error) -> CarrierError {
    move |e| CarrierError::Handshake(format!("{step}: {e}"))
}

fn memory_error(e: GuestMemoryError) -> CarrierError {
    match e {
        GuestMemoryError::OutOfMemory(size) => CarrierError::OutOfMemory(size),
        GuestMemoryError::Create { source, .. } => CarrierError::Io(source),
        other => CarrierError::Io(std::io::Error::other(other.to_string())),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A control header for a request without fence.
fn header(type_: u32, ctx_id: u32) -> CtrlHdr {
    CtrlHdr {
        type_,
        ctx_id,
        ..CtrlHdr::default()
    }
}

/// Checks the response type; returns the bytes after the header.
fn expect<'a>(
    response: &'a [u8],
    expected: u32,
    command: &'static str,
) -> Result<WireReader<'a>, CarrierError> {
    let mut r = WireReader::new(response);
    let hdr = CtrlHdr::decode(&mut r).map_err(|_| CarrierError::DeviceError {
        command,
        response: 0,
    })?;
    if hdr.type_ != expected {
        return Err(CarrierError::DeviceError {
            command,
            response: hdr.type_,
        });
    }
    Ok(r)
}

fn short_response(command: &'static str) -> impl Fn(rgpu_proto::DecodeError) -> CarrierError {
    move |_| CarrierError::DeviceError {
        command,
        response: gpu::RESP_ERR_UNSPEC,
    }
}

impl LocalCarrier {
    /// Connects to the daemon's socket, sets up the device and reads the
    /// rgpu capset.
    pub fn connect(socket_path: &Path) -> Result<LocalCarrier, CarrierError> {
        let stream = UnixStream::connect(socket_path).map_err(|source| CarrierError::Connect {
            path: socket_path.display().to_string(),
            source,
        })?;
        let memory = Arc::new(GuestMemory::from_env().map_err(memory_error)?);
        let mut frontend = Frontend::from_stream(stream, NUM_QUEUES);
        let socket_fd = frontend.as_raw_fd();

        frontend.set_owner().map_err(handshake("SET_OWNER"))?;
        let offered = frontend.get_features().map_err(handshake("GET_FEATURES"))?;
        let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let required = [
            (1u64 << VIRTIO_F_VERSION_1, "VERSION_1"),
            (1 << gpu::VIRTIO_GPU_F_VIRGL, "VIRTIO_GPU_F_VIRGL"),
            (
                1 << gpu::VIRTIO_GPU_F_RESOURCE_BLOB,
                "VIRTIO_GPU_F_RESOURCE_BLOB",
            ),
            (
                1 << gpu::VIRTIO_GPU_F_CONTEXT_INIT,
                "VIRTIO_GPU_F_CONTEXT_INIT",
            ),
            (protocol_bit, "VHOST_USER_F_PROTOCOL_FEATURES"),
        ];
        let missing: Vec<&str> = required
            .iter()
            .filter(|(bit, _)| offered & bit == 0)
            .map(|(_, name)| *name)
            .collect();
        if !missing.is_empty() {
            return Err(CarrierError::Handshake(format!(
                "the device at {} is not an rgpu device: it lacks {} (features {offered:#x})",
                socket_path.display(),
                missing.join(", ")
            )));
        }
        let wanted: u64 = required.iter().map(|(bit, _)| bit).sum();

        let offered_protocol = frontend
            .get_protocol_features()
            .map_err(handshake("GET_PROTOCOL_FEATURES"))?;
        let protocol = offered_protocol
            & (VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK);
        frontend
            .set_protocol_features(protocol)
            .map_err(handshake("SET_PROTOCOL_FEATURES"))?;
        // With REPLY_ACK every setup message is acknowledged, so a refusal
        // names its step instead of surfacing later as a broken socket.
        if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        if protocol.contains(VhostUserProtocolFeatures::MQ) {
            let queues = frontend
                .get_queue_num()
                .map_err(handshake("GET_QUEUE_NUM"))?;
            if queues < NUM_QUEUES {
                return Err(CarrierError::Handshake(format!(
                    "the device has {queues} queues, rgpu needs {NUM_QUEUES}"
                )));
            }
        }
        frontend
            .set_features(wanted)
            .map_err(handshake("SET_FEATURES"))?;

        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: memory.size(),
            userspace_addr: memory.base() as u64,
            mmap_offset: 0,
            mmap_handle: memory.fd(),
        };
        frontend
            .set_mem_table(&[region])
            .map_err(handshake("SET_MEM_TABLE"))?;

        let (control_queue, kick, call) = setup_queue(&mut frontend, &memory, CONTROL_QUEUE)?;
        let (_cursor_queue, cursor_kick, cursor_call) =
            setup_queue(&mut frontend, &memory, CURSOR_QUEUE)?;

        frontend.set_hdr_flags(VhostUserHeaderFlag::empty());
        let num_capsets = if protocol.contains(VhostUserProtocolFeatures::CONFIG) {
            let (_, config) = frontend
                .get_config(
                    0,
                    gpu::CONFIG_SIZE as u32,
                    VhostUserConfigFlags::empty(),
                    &[0u8; gpu::CONFIG_SIZE],
                )
                .map_err(handshake("GET_CONFIG"))?;
            let mut r = WireReader::new(&config);
            let num_capsets = r
                .take(12)
                .and_then(|_| r.u32())
                .map_err(|e| CarrierError::Handshake(format!("device config: {e}")))?;
            if num_capsets == 0 {
                return Err(CarrierError::NoCapset);
            }
            num_capsets
        } else {
            log::warn!("the device offers no config space; assuming one capset");
            1
        };

        let mut carrier = LocalCarrier {
            _frontend: frontend,
            socket_fd,
            memory,
            capset: Capset {
                protocol_version: 0,
                driver_version: 0,
                executor: String::new(),
                devices: Vec::new(),
            },
            control: Mutex::new(ControlState {
                queue: control_queue,
                in_flight: HashMap::new(),
                completed: HashMap::new(),
                poller_active: false,
                broken: None,
            }),
            drained: Condvar::new(),
            kick,
            call,
            _cursor: (cursor_kick, cursor_call),
            spin: spin_from_env(),
            next_request: AtomicU64::new(1),
            next_ctx: AtomicU32::new(1),
            next_resource: AtomicU32::new(1),
            next_fence: AtomicU64::new(1),
            blobs: Mutex::new(HashMap::new()),
            scatter: super::scattered::enabled_from_env(),
        };
        carrier.capset = carrier.read_capset(num_capsets)?;
        log::info!(
            "connected to {} (executor {}, {} device(s))",
            socket_path.display(),
            carrier.capset.executor,
            carrier.capset.devices.len()
        );
        Ok(carrier)
    }

    fn read_capset(&self, num_capsets: u32) -> Result<Capset, CarrierError> {
        for index in 0..num_capsets {
            let mut w = WireWriter::new();
            header(gpu::CMD_GET_CAPSET_INFO, 0).encode(&mut w);
            w.u32(index).u32(0);
            let response = self.transact(w.as_bytes(), gpu::CTRL_HDR_SIZE + 16)?;
            let mut r = expect(&response, gpu::RESP_OK_CAPSET_INFO, "GET_CAPSET_INFO")?;
            let bad = short_response("GET_CAPSET_INFO");
            let id = r.u32().map_err(&bad)?;
            let max_version = r.u32().map_err(&bad)?;
            let max_size = r.u32().map_err(&bad)?;
            log::debug!("capset {index}: id {id}, version {max_version}, {max_size} bytes");
            if id != CAPSET_ID_RGPU {
                continue;
            }
            if max_size > MAX_CAPSET_BYTES {
                return Err(CarrierError::BadCapset(
                    rgpu_proto::DecodeError::LengthOutOfRange {
                        length: max_size.into(),
                        limit: MAX_CAPSET_BYTES.into(),
                    },
                ));
            }
            let mut w = WireWriter::new();
            header(gpu::CMD_GET_CAPSET, 0).encode(&mut w);
            w.u32(id).u32(max_version);
            let response = self.transact(w.as_bytes(), gpu::CTRL_HDR_SIZE + max_size as usize)?;
            let mut r = expect(&response, gpu::RESP_OK_CAPSET, "GET_CAPSET")?;
            let payload = r.take(r.remaining()).map_err(CarrierError::BadCapset)?;
            let capset = Capset::decode(payload).map_err(CarrierError::BadCapset)?;
            if capset.protocol_version != PROTOCOL_VERSION {
                return Err(CarrierError::VersionMismatch {
                    guest: PROTOCOL_VERSION,
                    host: capset.protocol_version,
                });
            }
            return Ok(capset);
        }
        Err(CarrierError::NoCapset)
    }

    /// The guest memory shared with the daemon.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.memory
    }

    /// Puts a request on the control queue; returns its request number.
    fn post(&self, request: &[u8], response_len: usize) -> Result<u64, CarrierError> {
        let request_len = u32::try_from(request.len())
            .map_err(|_| CarrierError::OutOfMemory(request.len() as u64))?;
        let response_len = u32::try_from(response_len)
            .map_err(|_| CarrierError::OutOfMemory(response_len as u64))?;
        let response_offset = (u64::from(request_len) + 7) & !7;
        let total = response_offset + u64::from(response_len);
        let (gpa, ptr) = self.memory.alloc(total).map_err(memory_error)?;
        // SAFETY: `ptr` is the start of `total` bytes just allocated for this
        // request and used by nobody else until it completes.
        unsafe { std::ptr::copy_nonoverlapping(request.as_ptr(), ptr, request.len()) };
        let response_gpa = gpa + response_offset;
        let readable = [(gpa, request_len)];
        let writable = [(response_gpa, response_len)];
        let writable: &[(u64, u32)] = if response_len == 0 { &[] } else { &writable };

        let request_number = self.next_request.fetch_add(1, Ordering::Relaxed);
        let mut state = lock(&self.control);
        loop {
            if let Some(why) = &state.broken {
                log::debug!("control queue unusable: {why}");
                let _ = self.memory.free(gpa);
                return Err(CarrierError::Disconnected);
            }
            match state.queue.add(&readable, writable) {
                Ok(head) => {
                    state.in_flight.insert(
                        head,
                        InFlight {
                            request: request_number,
                            gpa,
                            response_gpa,
                            response_len,
                        },
                    );
                    if state.queue.needs_kick() {
                        if let Err(e) = self.kick.write(1) {
                            state.broken = Some(format!("kick: {e}"));
                            continue;
                        }
                    }
                    return Ok(request_number);
                }
                Err(VirtqueueError::Full { .. }) => {
                    drop(state);
                    // Wait until anything completes, then try again.
                    self.wait_for(|s| (s.queue.num_free() >= 2).then_some(()))?;
                    state = lock(&self.control);
                }
                Err(e) => {
                    let _ = self.memory.free(gpa);
                    return Err(CarrierError::Io(std::io::Error::other(e.to_string())));
                }
            }
        }
    }

    /// Moves everything the device completed into `completed`.
    fn drain(&self, state: &mut ControlState) {
        let mut any = false;
        loop {
            match state.queue.poll_used() {
                Ok(Some((head, len))) => {
                    any = true;
                    let Some(done) = state.in_flight.remove(&head) else {
                        continue;
                    };
                    let len = len.min(done.response_len) as usize;
                    let bytes = match self.memory.host_ptr(done.response_gpa, len as u64) {
                        // SAFETY: the response buffer belongs to this request
                        // and the device finished writing it (used entry read
                        // with acquire ordering).
                        Some(p) => unsafe { std::slice::from_raw_parts(p, len) }.to_vec(),
                        None => Vec::new(),
                    };
                    if let Err(e) = self.memory.free(done.gpa) {
                        log::error!("control buffer: {e}");
                    }
                    state.completed.insert(done.request, bytes);
                }
                Ok(None) => break,
                Err(e) => {
                    log::error!("control queue: {e}");
                    state.broken = Some(e.to_string());
                    any = true;
                    break;
                }
            }
        }
        if any {
            self.drained.notify_all();
        }
    }

    /// Sleeps until the device signals the call eventfd, the socket hangs
    /// up, or the poll interval ends.
    fn sleep_on_call(&self) -> Result<(), String> {
        let mut fds = [
            libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.socket_fd,
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the whole call.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                POLL_INTERVAL_MS,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(format!("poll: {e}"));
        }
        if fds[1].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
        {
            return Err("the daemon closed the vhost-user socket".into());
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // Resets the counter; the used ring is drained right after.
            let _ = self.call.read();
        }
        Ok(())
    }

    /// Waits until `check` finds what it wants in the control state: spins
    /// briefly, then sleeps on the call eventfd.
    fn wait_for<T>(
        &self,
        mut check: impl FnMut(&mut ControlState) -> Option<T>,
    ) -> Result<T, CarrierError> {
        let spin_until = Instant::now() + self.spin;
        let mut state = lock(&self.control);
        loop {
            self.drain(&mut state);
            if let Some(found) = check(&mut state) {
                return Ok(found);
            }
            if let Some(why) = &state.broken {
                log::debug!("control queue unusable: {why}");
                return Err(CarrierError::Disconnected);
            }
            if Instant::now() < spin_until {
                drop(state);
                std::hint::spin_loop();
                state = lock(&self.control);
            } else if !state.poller_active {
                state.poller_active = true;
                drop(state);
                let slept = self.sleep_on_call();
                state = lock(&self.control);
                state.poller_active = false;
                if let Err(why) = slept {
                    log::error!("{why}");
                    state.broken = Some(why);
                }
                // Let a sleeping thread take over the eventfd.
                self.drained.notify_all();
            } else {
                state = self
                    .drained
                    .wait_timeout(state, Duration::from_millis(POLL_INTERVAL_MS as u64))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }

    fn wait_request(&self, request: u64) -> Result<Vec<u8>, CarrierError> {
        self.wait_for(|s| s.completed.remove(&request))
    }

    /// One request, one response.
    fn transact(&self, request: &[u8], response_len: usize) -> Result<Vec<u8>, CarrierError> {
        let id = self.post(request, response_len)?;
        self.wait_request(id)
    }

    /// A request whose only good answer is `RESP_OK_NODATA`.
    fn command(&self, request: &[u8], name: &'static str) -> Result<(), CarrierError> {
        let response = self.transact(request, gpu::CTRL_HDR_SIZE)?;
        expect(&response, gpu::RESP_OK_NODATA, name).map(|_| ())
    }

    fn resource_command(
        &self,
        type_: u32,
        ctx_id: u32,
        resource_id: u32,
        name: &'static str,
    ) -> Result<(), CarrierError> {
        let mut w = WireWriter::new();
        header(type_, ctx_id).encode(&mut w);
        w.u32(resource_id).u32(0);
        self.command(w.as_bytes(), name)
    }
    /// [`Carrier::create_blob`]; with `same_address`, the blob id carries
    /// this process's address of the blob, where the host is asked to map
    /// it too.
    fn create_placed_blob(
        &self,
        ctx_id: u32,
        size: u64,
        same_address: bool,
    ) -> Result<BlobMapping, CarrierError> {
        let (gpa, mut ptr) = self.memory.alloc(size).map_err(memory_error)?;
        let size = size.max(1).next_multiple_of(crate::guest_memory::PAGE_SIZE);
        let resource_id = self.next_resource.fetch_add(1, Ordering::Relaxed);
        let mut entries = Vec::new();
        let mut scattered_view = None;
        if self.scatter && size >= scattered::SCATTER_MIN_BYTES {
            let runs = scattered::layout(size / crate::guest_memory::PAGE_SIZE, resource_id.into());
            let view = scattered::map(&runs, self.memory.fd(), gpa).map_err(|e| {
                let _ = self.memory.free(gpa);
                CarrierError::Io(e)
            })?;
            entries = scattered::entries(&runs, gpa);
            scattered_view = Some((view, size));
            ptr = view;
        }
        let mut offset = 0;
        while scattered_view.is_none() && offset < size {
            let length = (size - offset).min(MAX_ENTRY_BYTES);
            entries.push(MemEntry {
                addr: gpa + offset,
                length: length as u32,
            });
            offset += length;
        }
        let forget_view = |view: Option<(*mut u8, u64)>| {
            if let Some((base, len)) = view {
                scattered::unmap(base, len);
            }
        };
        let blob = ResourceCreateBlob {
            resource_id,
            blob_mem: gpu::BLOB_MEM_GUEST,
            blob_flags: gpu::BLOB_FLAG_USE_MAPPABLE,
            // Where this process sees it, for the host to map it there too.
            blob_id: if same_address { ptr as u64 } else { 0 },
            size,
            entries,
        };
        let mut w = WireWriter::new();
        header(gpu::CMD_RESOURCE_CREATE_BLOB, ctx_id).encode(&mut w);
        blob.encode(&mut w);
        if let Err(e) = self.command(w.as_bytes(), "RESOURCE_CREATE_BLOB") {
            forget_view(scattered_view);
            let _ = self.memory.free(gpa);
            return Err(e);
        }
        if let Err(e) = self.attach_blob(ctx_id, resource_id) {
            let _ =
                self.resource_command(gpu::CMD_RESOURCE_UNREF, 0, resource_id, "RESOURCE_UNREF");
            forget_view(scattered_view);
            let _ = self.memory.free(gpa);
            return Err(e);
        }
        lock(&self.blobs).insert(
            resource_id,
            LocalBlob {
                gpa,
                scattered_view,
            },
        );
        Ok(BlobMapping {
            resource_id,
            ptr,
            size,
        })
    }
}

/// Sets up one virtqueue on the device; returns it with its kick and call
/// eventfds.
fn setup_queue(
    frontend: &mut Frontend,
    memory: &GuestMemory,
    index: usize,
) -> Result<(SplitQueue, EventFd, EventFd), CarrierError> {
    let layout = super::virtqueue::QueueLayout::new(QUEUE_SIZE)
        .map_err(|e| CarrierError::Handshake(e.to_string()))?;
    let (gpa, ptr) = memory.alloc(layout.bytes).map_err(memory_error)?;
    // SAFETY: a fresh page-aligned allocation of `layout.bytes` bytes that
    // nothing else in this process uses; the memory lives as long as the
    // carrier (queues are never freed).
    let queue = unsafe { SplitQueue::new(ptr, gpa, QUEUE_SIZE) }
        .map_err(|e| CarrierError::Handshake(e.to_string()))?;
    let (desc, avail, used) = queue.host_addrs();
    let config = VringConfigData {
        queue_max_size: QUEUE_SIZE,
        queue_size: QUEUE_SIZE,
        flags: 0,
        desc_table_addr: desc,
        used_ring_addr: used,
        avail_ring_addr: avail,
        log_addr: None,
    };
    let kick = EventFd::new(EFD_NONBLOCK | EFD_CLOEXEC)?;
    let call = EventFd::new(EFD_NONBLOCK | EFD_CLOEXEC)?;
    frontend
        .set_vring_num(index, QUEUE_SIZE)
        .map_err(handshake("SET_VRING_NUM"))?;
    frontend
        .set_vring_addr(index, &config)
        .map_err(handshake("SET_VRING_ADDR"))?;
    frontend
        .set_vring_base(index, 0)
        .map_err(handshake("SET_VRING_BASE"))?;
    frontend
        .set_vring_call(index, &call)
        .map_err(handshake("SET_VRING_CALL"))?;
    frontend
        .set_vring_kick(index, &kick)
        .map_err(handshake("SET_VRING_KICK"))?;
    frontend
        .set_vring_enable(index, true)
        .map_err(handshake("SET_VRING_ENABLE"))?;
    Ok((queue, kick, call))
}

impl Carrier for LocalCarrier {
    fn capset(&self) -> &Capset {
        &self.capset
    }

    fn shares_host_kernel(&self) -> bool {
        true
    }

    fn create_context(&self, debug_name: &str) -> Result<u32, CarrierError> {
        let ctx_id = self.next_ctx.fetch_add(1, Ordering::Relaxed);
        // The tag groups this process's contexts in one host worker.
        let debug_name = tagged_debug_name(
            crate::process_tag::process_tag(),
            debug_name,
            gpu::CTX_DEBUG_NAME_BYTES,
        );
        let mut name = [0u8; gpu::CTX_DEBUG_NAME_BYTES];
        let name_len = debug_name.len().min(gpu::CTX_DEBUG_NAME_BYTES);
        for (dst, src) in name.iter_mut().zip(debug_name.bytes()) {
            *dst = src;
        }
        let mut w = WireWriter::new();
        header(gpu::CMD_CTX_CREATE, ctx_id).encode(&mut w);
        w.u32(name_len as u32).u32(CAPSET_ID_RGPU).raw(&name);
        self.command(w.as_bytes(), "CTX_CREATE")?;
        Ok(ctx_id)
    }

    fn destroy_context(&self, ctx_id: u32) -> Result<(), CarrierError> {
        let mut w = WireWriter::new();
        header(gpu::CMD_CTX_DESTROY, ctx_id).encode(&mut w);
        self.command(w.as_bytes(), "CTX_DESTROY")
    }

    fn create_blob(&self, ctx_id: u32, size: u64) -> Result<BlobMapping, CarrierError> {
        self.create_placed_blob(ctx_id, size, false)
    }

    fn create_same_address_blob(
        &self,
        ctx_id: u32,
        size: u64,
    ) -> Result<BlobMapping, CarrierError> {
        self.create_placed_blob(ctx_id, size, true)
    }

    fn attach_blob(&self, ctx_id: u32, resource_id: u32) -> Result<(), CarrierError> {
        self.resource_command(
            gpu::CMD_CTX_ATTACH_RESOURCE,
            ctx_id,
            resource_id,
            "CTX_ATTACH_RESOURCE",
        )
    }

    fn destroy_blob(&self, ctx_id: u32, resource_id: u32) -> Result<(), CarrierError> {
        let LocalBlob {
            gpa,
            scattered_view,
        } = lock(&self.blobs)
            .remove(&resource_id)
            .ok_or(CarrierError::DeviceError {
                command: "RESOURCE_UNREF",
                response: gpu::RESP_ERR_INVALID_RESOURCE_ID,
            })?;
        // The process is done with the blob: its own view goes at once.
        if let Some((base, len)) = scattered_view {
            scattered::unmap(base, len);
        }
        let detached = self.resource_command(
            gpu::CMD_CTX_DETACH_RESOURCE,
            ctx_id,
            resource_id,
            "CTX_DETACH_RESOURCE",
        );
        let unref =
            self.resource_command(gpu::CMD_RESOURCE_UNREF, 0, resource_id, "RESOURCE_UNREF");
        match (&detached, &unref) {
            // The device let go of the memory: it can be reused.
            (_, Ok(())) => {
                if let Err(e) = self.memory.free(gpa) {
                    log::error!("blob {resource_id}: {e}");
                }
            }
            // The device may still use it: leak it rather than hand it out again.
            (_, Err(e)) => log::warn!("blob {resource_id} kept: {e}"),
        }
        detached.and(unref)
    }

    fn submit(
        &self,
        ctx_id: u32,
        payload: &[u8],
        fenced: bool,
    ) -> Result<Option<FenceToken>, CarrierError> {
        let size = u32::try_from(payload.len())
            .map_err(|_| CarrierError::OutOfMemory(payload.len() as u64))?;
        let hdr = if fenced {
            CtrlHdr {
                type_: gpu::CMD_SUBMIT_3D,
                flags: gpu::FLAG_FENCE | gpu::FLAG_INFO_RING_IDX,
                fence_id: self.next_fence.fetch_add(1, Ordering::Relaxed),
                ctx_id,
                ring_idx: 0,
            }
        } else {
            header(gpu::CMD_SUBMIT_3D, ctx_id)
        };
        let mut w = WireWriter::with_capacity(gpu::CTRL_HDR_SIZE + 8 + payload.len());
        hdr.encode(&mut w);
        w.u32(size).u32(0).raw(payload);
        let id = self.post(w.as_bytes(), gpu::CTRL_HDR_SIZE)?;
        if fenced {
            return Ok(Some(FenceToken(id)));
        }
        let response = self.wait_request(id)?;
        expect(&response, gpu::RESP_OK_NODATA, "SUBMIT_3D").map(|_| None)
    }

    fn wait_fence(&self, _ctx_id: u32, fence: FenceToken) -> Result<(), CarrierError> {
        let known = {
            let state = lock(&self.control);
            state.completed.contains_key(&fence.0)
                || state.in_flight.values().any(|f| f.request == fence.0)
        };
        if !known {
            return Err(CarrierError::UnknownFence(fence.0));
        }
        let response = self.wait_request(fence.0)?;
        expect(&response, gpu::RESP_OK_NODATA, "SUBMIT_3D").map(|_| ())
    }

    fn raw_control(&self, request: &[u8], response_len: usize) -> Result<Vec<u8>, CarrierError> {
        self.transact(request, response_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn temp_socket(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("rgpu-transport-{}-{name}.sock", std::process::id()))
    }

    #[test]
    fn missing_socket_is_a_connect_error() {
        let path = temp_socket("missing");
        match LocalCarrier::connect(&path) {
            Err(CarrierError::Connect { path: p, .. }) => assert!(p.contains("missing")),
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("connected to nothing"),
        }
    }

    #[test]
    fn a_peer_that_hangs_up_fails_the_handshake() {
        let path = temp_socket("hangup");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let peer = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            drop(stream);
        });
        let result = LocalCarrier::connect(&path);
        peer.join().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(result, Err(CarrierError::Handshake(_))),
            "{:?}",
            result.err()
        );
    }
}

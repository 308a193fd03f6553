//! The device model driven through its vhost-user backend, with a mock split
//! queue playing the guest driver (virtio-queue's test utilities).

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_proto::batch::{encode_batch, BATCH_HEADER_SIZE};
use rgpu_proto::capset::Capset;
use rgpu_proto::virtio_gpu::*;
use rgpu_proto::wire::{WireReader, WireWriter};
use rgpu_proto::{CAPSET_ID_RGPU, PROTOCOL_VERSION};
use rgpu_session::{AtomicGuestMemory, Counters, GuestMemory};
use std::os::fd::FromRawFd;
use vhost_device_rgpu::virtio_gpu::response::Vring;
use vhost_device_rgpu::virtio_gpu::{DaemonShared, GpuBackend};
use vhost_device_rgpu::worker_process::containment::WorkerLimits;
use vhost_device_rgpu::worker_process::{Accounting, WorkerLauncher};
use vhost_user_backend::{VhostUserBackendMut, VringT};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, FileOffset, GuestAddress};
use vmm_sys_util::epoll::EventSet;

const QUEUE_SIZE: u16 = 256;
const MEMORY_SIZE: usize = 32 << 20;
/// Request and response buffers start here, after the queue's rings.
const BUFFERS: u64 = 0x10_0000;
/// Guest memory used as blob backing in the tests.
const BLOB_AREA: u64 = 0x100_0000;

/// A guest driver over a mock queue, and the backend under test.
struct Guest<'a> {
    mem: &'a GuestMemory,
    queue: MockSplitQueue<'a, GuestMemory>,
    vrings: [Vring; 2],
    backend: GpuBackend,
    counters: Arc<Counters>,
    next_desc: u16,
    next_buf: u64,
    used_seen: u16,
}

/// Guest memory shared through a file, as a VMM's is (workers map blobs
/// from it).
fn memory() -> GuestMemory {
    // SAFETY: the name is a valid C string.
    let fd = unsafe { libc::memfd_create(c"rgpu-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(MEMORY_SIZE as u64).unwrap();
    GuestMemory::from_ranges_with_files(&[(
        GuestAddress(0),
        MEMORY_SIZE,
        Some(FileOffset::new(file, 0)),
    )])
    .unwrap()
}

/// Starts workers from the daemon binary, with the sim executor.
fn launcher() -> Arc<WorkerLauncher> {
    Arc::new(
        WorkerLauncher::new(
            env!("CARGO_BIN_EXE_vhost-device-rgpu").into(),
            0,
            vec!["--executor".into(), "sim".into()],
            Accounting::private(),
            None,
            WorkerLimits::default(),
        )
        // The sim's fixture warning and the workers' progress are not what
        // these tests look at; errors still show.
        .with_log_filter("error"),
    )
}

impl<'a> Guest<'a> {
    fn new(mem: &'a GuestMemory) -> Self {
        let atomic = AtomicGuestMemory::new(mem.clone());
        let queue = MockSplitQueue::create(mem, GuestAddress(0), QUEUE_SIZE);
        let control = Vring::new(atomic.clone(), QUEUE_SIZE).unwrap();
        control.set_queue_size(QUEUE_SIZE);
        control
            .set_queue_info(
                queue.desc_table_addr().0,
                queue.avail_addr().0,
                queue.used_addr().0,
            )
            .unwrap();
        control.set_queue_ready(true);
        control.set_enabled(true);
        let cursor = Vring::new(atomic.clone(), QUEUE_SIZE).unwrap();
        let counters = Arc::new(Counters::default());
        let executor = Arc::new(rgpu_executor::sim::SimExecutor::new());
        let shared = DaemonShared::new(executor, counters.clone(), launcher(), None);
        let backend = GpuBackend::new(shared, atomic).unwrap();
        Guest {
            mem,
            queue,
            vrings: [control, cursor],
            backend,
            counters,
            next_desc: 0,
            next_buf: BUFFERS,
            used_seen: 0,
        }
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let addr = self.next_buf;
        self.next_buf += u64::from(len).next_multiple_of(64).max(64);
        addr
    }

    /// Offers a chain of readable `parts` and a writable buffer of
    /// `writable` bytes; returns the head index and the writable address.
    fn offer(&mut self, parts: &[&[u8]], writable: u32) -> (u16, u64) {
        let head = self.next_desc;
        let mut descs = Vec::new();
        let count = parts.len() + 1;
        for (i, part) in parts.iter().enumerate() {
            let addr = self.alloc(part.len() as u32);
            self.mem.write_slice(part, GuestAddress(addr)).unwrap();
            descs.push((addr, part.len() as u32, 0u16, i));
        }
        let out = self.alloc(writable);
        descs.push((out, writable, VRING_DESC_F_WRITE as u16, count - 1));
        let raw: Vec<RawDescriptor> = descs
            .into_iter()
            .map(|(addr, len, flags, i)| {
                let last = i == count - 1;
                let flags = if last {
                    flags
                } else {
                    flags | VRING_DESC_F_NEXT as u16
                };
                let next = if last { 0 } else { head + i as u16 + 1 };
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
            })
            .collect();
        self.queue.add_desc_chains(&raw, head).unwrap();
        self.next_desc += count as u16;
        (head, out)
    }

    fn kick(&mut self) {
        self.backend
            .handle_event(0, EventSet::IN, &self.vrings, 0)
            .unwrap();
    }

    fn used_idx(&self) -> u16 {
        u16::from_le(self.queue.used().idx().load())
    }

    /// Waits for the next used element and returns `(head, len)`.
    fn next_used(&mut self) -> (u16, u32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.used_idx() == self.used_seen {
            assert!(Instant::now() < deadline, "no response arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        let elem = self
            .queue
            .used()
            .ring()
            .ref_at(usize::from(self.used_seen))
            .unwrap()
            .load();
        self.used_seen += 1;
        (elem.id() as u16, elem.len())
    }

    /// Sends one request and returns its response bytes.
    fn request_parts(&mut self, parts: &[&[u8]], writable: u32) -> Vec<u8> {
        let (head, out) = self.offer(parts, writable);
        self.kick();
        let (id, len) = self.next_used();
        assert_eq!(id, head);
        let mut response = vec![0u8; len as usize];
        self.mem
            .read_slice(&mut response, GuestAddress(out))
            .unwrap();
        response
    }

    fn request(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.request_parts(&[bytes], 4096)
    }
}

fn hdr(type_: u32, ctx_id: u32) -> CtrlHdr {
    CtrlHdr {
        type_,
        ctx_id,
        ..CtrlHdr::default()
    }
}

fn request(hdr: CtrlHdr, body: &[u8]) -> Vec<u8> {
    let mut bytes = hdr.to_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn response_hdr(response: &[u8]) -> CtrlHdr {
    CtrlHdr::decode(&mut WireReader::new(response)).expect("response header")
}

fn response_type(response: &[u8]) -> u32 {
    response_hdr(response).type_
}

fn u32s(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn ctx_create_body(context_init: u32, name: &str) -> Vec<u8> {
    let mut body = u32s(&[name.len() as u32, context_init]);
    let mut debug_name = [0u8; CTX_DEBUG_NAME_BYTES];
    debug_name[..name.len()].copy_from_slice(name.as_bytes());
    body.extend_from_slice(&debug_name);
    body
}

fn create_context(guest: &mut Guest<'_>, ctx_id: u32) {
    let response = guest.request(&request(
        hdr(CMD_CTX_CREATE, ctx_id),
        &ctx_create_body(CAPSET_ID_RGPU, "test"),
    ));
    assert_eq!(response_type(&response), RESP_OK_NODATA);
}

fn blob_request(resource_id: u32, blob_mem: u32, entries: &[MemEntry]) -> (Vec<u8>, Vec<u8>) {
    let create = ResourceCreateBlob {
        resource_id,
        blob_mem,
        blob_flags: BLOB_FLAG_USE_MAPPABLE,
        blob_id: 0,
        size: entries.iter().map(|e| u64::from(e.length)).sum(),
        entries: entries.to_vec(),
    };
    let mut w = WireWriter::new();
    hdr(CMD_RESOURCE_CREATE_BLOB, 0).encode(&mut w);
    create.encode(&mut w);
    let bytes = w.into_bytes();
    // Linux puts the entries in a descriptor of their own.
    let split = CTRL_HDR_SIZE + 32;
    (bytes[..split].to_vec(), bytes[split..].to_vec())
}

fn submit_body(payload: &[u8]) -> Vec<u8> {
    let mut body = u32s(&[payload.len() as u32, 0]);
    body.extend_from_slice(payload);
    body
}

#[test]
fn capset_info_and_capset() {
    let mem = memory();
    let mut guest = Guest::new(&mem);

    let response = guest.request(&request(hdr(CMD_GET_CAPSET_INFO, 0), &u32s(&[0, 0])));
    assert_eq!(response.len(), CTRL_HDR_SIZE + 16);
    assert_eq!(response_type(&response), RESP_OK_CAPSET_INFO);
    let mut r = WireReader::new(&response[CTRL_HDR_SIZE..]);
    assert_eq!(r.u32().unwrap(), CAPSET_ID_RGPU);
    assert_eq!(r.u32().unwrap(), PROTOCOL_VERSION);
    let max_size = r.u32().unwrap();

    let response = guest.request(&request(hdr(CMD_GET_CAPSET_INFO, 0), &u32s(&[1, 0])));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    let response = guest.request_parts(
        &[&request(
            hdr(CMD_GET_CAPSET, 0),
            &u32s(&[CAPSET_ID_RGPU, PROTOCOL_VERSION]),
        )],
        CTRL_HDR_SIZE as u32 + max_size,
    );
    assert_eq!(response_type(&response), RESP_OK_CAPSET);
    assert_eq!(response.len(), CTRL_HDR_SIZE + max_size as usize);
    let capset = Capset::decode(&response[CTRL_HDR_SIZE..]).unwrap();
    assert_eq!(capset.protocol_version, PROTOCOL_VERSION);
    assert_eq!(capset.executor, "sim");
    assert!(!capset.devices.is_empty());

    let response = guest.request(&request(hdr(CMD_GET_CAPSET, 0), &u32s(&[4, 0])));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);
}

#[test]
fn display_info_is_empty() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    let response = guest.request(&hdr(CMD_GET_DISPLAY_INFO, 0).to_bytes());
    assert_eq!(response.len(), DISPLAY_INFO_SIZE);
    assert_eq!(response_type(&response), RESP_OK_DISPLAY_INFO);
    assert!(response[CTRL_HDR_SIZE..].iter().all(|b| *b == 0));
}

#[test]
fn ctx_create_checks_capset_and_ids() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    let virgl = guest.request(&request(
        hdr(CMD_CTX_CREATE, 1),
        &ctx_create_body(0, "virgl"),
    ));
    assert_eq!(response_type(&virgl), RESP_ERR_INVALID_PARAMETER);
    let venus = guest.request(&request(
        hdr(CMD_CTX_CREATE, 1),
        &ctx_create_body(4, "venus"),
    ));
    assert_eq!(response_type(&venus), RESP_ERR_INVALID_PARAMETER);

    create_context(&mut guest, 1);
    let again = guest.request(&request(
        hdr(CMD_CTX_CREATE, 1),
        &ctx_create_body(CAPSET_ID_RGPU, "dup"),
    ));
    assert_eq!(response_type(&again), RESP_ERR_INVALID_CONTEXT_ID);
    assert_eq!(guest.backend.device().session_count(), 1);

    let mut long_name = ctx_create_body(CAPSET_ID_RGPU, "x");
    long_name[..4].copy_from_slice(&65u32.to_le_bytes());
    let response = guest.request(&request(hdr(CMD_CTX_CREATE, 2), &long_name));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    let destroy = guest.request(&hdr(CMD_CTX_DESTROY, 1).to_bytes());
    assert_eq!(response_type(&destroy), RESP_OK_NODATA);
    assert_eq!(guest.backend.device().session_count(), 0);
    let destroy = guest.request(&hdr(CMD_CTX_DESTROY, 1).to_bytes());
    assert_eq!(response_type(&destroy), RESP_ERR_INVALID_CONTEXT_ID);
}

#[test]
fn malformed_requests_get_error_responses() {
    let mem = memory();
    let mut guest = Guest::new(&mem);

    // Shorter than a header.
    let response = guest.request(&[0x08, 0x01, 0, 0, 1, 0]);
    assert_eq!(response_type(&response), RESP_ERR_UNSPEC);

    // A header whose body is missing: the fence is still echoed.
    let fenced = CtrlHdr {
        type_: CMD_GET_CAPSET_INFO,
        flags: FLAG_FENCE | FLAG_INFO_RING_IDX,
        fence_id: 77,
        ctx_id: 3,
        ring_idx: 2,
    };
    let response = guest.request(&fenced.to_bytes());
    assert_eq!(response_hdr(&response), fenced.response(RESP_ERR_UNSPEC));
    assert_eq!(response_hdr(&response).fence_id, 77);

    // A command the device does not implement.
    let mut unknown = fenced;
    unknown.type_ = CMD_RESOURCE_CREATE_2D;
    let response = guest.request(&request(unknown, &[0; 24]));
    assert_eq!(response_hdr(&response), unknown.response(RESP_ERR_UNSPEC));
    let response = guest.request(&hdr(0xdead_beef, 0).to_bytes());
    assert_eq!(response_type(&response), RESP_ERR_UNSPEC);

    // A chain with no writable part still comes back.
    let (head, _) = guest.offer(&[&hdr(CMD_GET_DISPLAY_INFO, 0).to_bytes()], 0);
    guest.kick();
    assert_eq!(guest.next_used(), (head, 0));

    // A short writable part gets what fits.
    let response = guest.request_parts(&[&hdr(CMD_GET_DISPLAY_INFO, 0).to_bytes()], 8);
    assert_eq!(response.len(), 8);
}

#[test]
fn blob_resources_attach_detach_unref() {
    let mem = memory();
    let mut guest = Guest::new(&mem);

    let outside = [MemEntry {
        addr: MEMORY_SIZE as u64 - 4096,
        length: 8192,
    }];
    let (head, entries) = blob_request(5, BLOB_MEM_GUEST, &outside);
    let response = guest.request_parts(&[&head, &entries], 64);
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    let pages = [
        MemEntry {
            addr: BLOB_AREA,
            length: 4096,
        },
        MemEntry {
            addr: BLOB_AREA + 0x10000,
            length: 4096,
        },
    ];
    let (head, entries) = blob_request(5, BLOB_MEM_HOST3D, &pages);
    let response = guest.request_parts(&[&head, &entries], 64);
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    let (head, entries) = blob_request(0, BLOB_MEM_GUEST, &pages);
    let response = guest.request_parts(&[&head, &entries], 64);
    assert_eq!(response_type(&response), RESP_ERR_INVALID_RESOURCE_ID);

    let (head, entries) = blob_request(5, BLOB_MEM_GUEST, &pages);
    let response = guest.request_parts(&[&head, &entries], 64);
    assert_eq!(response_type(&response), RESP_OK_NODATA);
    let response = guest.request_parts(&[&head, &entries], 64);
    assert_eq!(response_type(&response), RESP_ERR_INVALID_RESOURCE_ID);

    // Entries missing from the request.
    let response = guest.request_parts(&[&head], 64);
    assert_eq!(response_type(&response), RESP_ERR_UNSPEC);

    let attach = |ctx, res| request(hdr(CMD_CTX_ATTACH_RESOURCE, ctx), &u32s(&[res, 0]));
    let detach = |ctx, res| request(hdr(CMD_CTX_DETACH_RESOURCE, ctx), &u32s(&[res, 0]));
    let unref = |res| request(hdr(CMD_RESOURCE_UNREF, 0), &u32s(&[res, 0]));

    assert_eq!(
        response_type(&guest.request(&attach(1, 5))),
        RESP_ERR_INVALID_CONTEXT_ID
    );
    create_context(&mut guest, 1);
    assert_eq!(
        response_type(&guest.request(&attach(1, 6))),
        RESP_ERR_INVALID_RESOURCE_ID
    );
    assert_eq!(response_type(&guest.request(&attach(1, 5))), RESP_OK_NODATA);
    assert_eq!(response_type(&guest.request(&detach(1, 5))), RESP_OK_NODATA);
    assert_eq!(
        response_type(&guest.request(&detach(2, 5))),
        RESP_ERR_INVALID_CONTEXT_ID
    );
    assert_eq!(response_type(&guest.request(&attach(1, 5))), RESP_OK_NODATA);
    assert_eq!(response_type(&guest.request(&unref(5))), RESP_OK_NODATA);
    assert_eq!(
        response_type(&guest.request(&unref(5))),
        RESP_ERR_INVALID_RESOURCE_ID
    );
    assert_eq!(
        response_type(&guest.request(&attach(1, 5))),
        RESP_ERR_INVALID_RESOURCE_ID
    );
}

#[test]
fn submit_3d_checks_context_size_and_batch() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    let empty_batch = encode_batch(&[]);
    assert_eq!(empty_batch.len(), BATCH_HEADER_SIZE);

    let response = guest.request(&request(hdr(CMD_SUBMIT_3D, 9), &submit_body(&empty_batch)));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_CONTEXT_ID);

    create_context(&mut guest, 9);
    let mut bad_magic = empty_batch.clone();
    bad_magic[0] ^= 0xff;
    let response = guest.request(&request(hdr(CMD_SUBMIT_3D, 9), &submit_body(&bad_magic)));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    // `size` larger than what the request carries.
    let mut body = submit_body(&empty_batch);
    body[..4].copy_from_slice(&64u32.to_le_bytes());
    let response = guest.request(&request(hdr(CMD_SUBMIT_3D, 9), &body));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    // A command that does not decode.
    let mut garbage = empty_batch.clone();
    garbage.extend_from_slice(&[0xff; 16]);
    let len = garbage.len() as u32;
    garbage[8..12].copy_from_slice(&len.to_le_bytes());
    let response = guest.request(&request(hdr(CMD_SUBMIT_3D, 9), &submit_body(&garbage)));
    assert_eq!(response_type(&response), RESP_ERR_INVALID_PARAMETER);

    let response = guest.request(&request(hdr(CMD_SUBMIT_3D, 9), &submit_body(&empty_batch)));
    assert_eq!(response_type(&response), RESP_OK_NODATA);
}

#[test]
fn fenced_submit_is_answered_with_its_fence() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    create_context(&mut guest, 4);
    let fenced = CtrlHdr {
        type_: CMD_SUBMIT_3D,
        flags: FLAG_FENCE | FLAG_INFO_RING_IDX,
        fence_id: 0x1234_5678_9abc,
        ctx_id: 4,
        ring_idx: 1,
    };
    let response = guest.request(&request(fenced, &submit_body(&encode_batch(&[]))));
    let answer = response_hdr(&response);
    assert_eq!(answer.type_, RESP_OK_NODATA);
    assert_eq!(answer.flags, FLAG_FENCE | FLAG_INFO_RING_IDX);
    assert_eq!(answer.fence_id, 0x1234_5678_9abc);
    assert_eq!(answer.ctx_id, 4);
    assert_eq!(answer.ring_idx, 1);
}

/// A worker's /proc status once its seccomp filter is in (it installs it
/// after starting its executor, a moment after it was started).
fn worker_status(pid: u32) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status
            .lines()
            .any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('2'))
            || Instant::now() > deadline
        {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Which worker process a context runs in: one per guest process (the tag
/// in its debug name), never two guest processes in one.
#[test]
fn contexts_of_one_guest_process_share_a_worker_and_no_other() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    let tagged = |tag: u128, ctx_id: u32| {
        let name = rgpu_proto::process_group::tagged_debug_name(tag, "proc", 63);
        request(
            hdr(CMD_CTX_CREATE, ctx_id),
            &ctx_create_body(CAPSET_ID_RGPU, &name),
        )
    };
    for (tag, ctx_id) in [(1u128 << 100, 1), (1 << 100, 2), (7, 3)] {
        assert_eq!(
            response_type(&guest.request(&tagged(tag, ctx_id))),
            RESP_OK_NODATA
        );
    }
    create_context(&mut guest, 4);
    create_context(&mut guest, 5);
    let mut workers = guest.backend.device().workers();
    workers.sort_by_key(|(_, contexts)| contexts.clone());
    let contexts: Vec<Vec<u32>> = workers.iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(contexts, vec![vec![1, 2], vec![3], vec![4], vec![5]]);
    let mut pids: Vec<u32> = workers.iter().map(|(pid, _)| *pid).collect();
    pids.dedup();
    assert_eq!(pids.len(), 4, "{workers:?}");
    // Contained: no new privileges, a seccomp filter, no capabilities.
    for pid in &pids {
        let status = worker_status(*pid);
        for (field, value) in [
            ("NoNewPrivs", "1"),
            ("Seccomp", "2"),
            ("CapEff", "0000000000000000"),
            ("CapPrm", "0000000000000000"),
        ] {
            assert!(
                status.lines().any(|l| l
                    .strip_prefix(field)
                    .and_then(|r| r.strip_prefix(':'))
                    .map(str::trim)
                    == Some(value)),
                "worker {pid}: {field} is not {value}:\n{status}"
            );
        }
    }

    // Destroying a process's last context ends its worker.
    let destroy = |ctx| request(hdr(CMD_CTX_DESTROY, ctx), &[]);
    assert_eq!(response_type(&guest.request(&destroy(3))), RESP_OK_NODATA);
    assert_eq!(response_type(&guest.request(&destroy(1))), RESP_OK_NODATA);
    let left: Vec<Vec<u32>> = {
        let mut w = guest.backend.device().workers();
        w.sort_by_key(|(_, c)| c.clone());
        w.into_iter().map(|(_, c)| c).collect()
    };
    assert_eq!(left, vec![vec![2], vec![4], vec![5]]);
    let gone = workers
        .iter()
        .find(|(_, c)| c == &vec![3])
        .map(|(pid, _)| *pid)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{gone}")).exists() {
        assert!(Instant::now() < deadline, "worker {gone} still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A reset (or a stopped control queue) leaves nothing behind: pending
/// fences are dropped unanswered, workers are gone, and the guest can reuse
/// its context and resource ids.
#[test]
fn a_reset_leaves_no_context_resource_or_pending_answer() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    create_context(&mut guest, 4);
    let pages = [MemEntry {
        addr: BLOB_AREA,
        length: 8192,
    }];
    let (head, entries) = blob_request(5, BLOB_MEM_GUEST, &pages);
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_OK_NODATA
    );
    let pid = guest.backend.device().workers()[0].0;
    guest.backend.stop_vring(0).unwrap();
    assert_eq!(guest.backend.device().session_count(), 0);
    assert!(guest.backend.device().workers().is_empty());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    // The same ids again, as a rebooted guest would use them.
    create_context(&mut guest, 4);
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_OK_NODATA
    );
    guest.backend.reset_device();
    assert_eq!(guest.backend.device().session_count(), 0);
}

/// Two blobs may not share guest pages, nor one blob list a page twice.
#[test]
fn blobs_may_not_alias() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    let page = |addr| MemEntry { addr, length: 4096 };
    let (head, entries) = blob_request(
        1,
        BLOB_MEM_GUEST,
        &[page(BLOB_AREA), page(BLOB_AREA + 4096)],
    );
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_OK_NODATA
    );
    let (head, entries) = blob_request(2, BLOB_MEM_GUEST, &[page(BLOB_AREA + 4096)]);
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_ERR_INVALID_PARAMETER
    );
    let (head, entries) = blob_request(
        3,
        BLOB_MEM_GUEST,
        &[page(BLOB_AREA + 0x10000), page(BLOB_AREA + 0x10000)],
    );
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_ERR_INVALID_PARAMETER
    );
    // Not whole pages.
    let (head, entries) = blob_request(
        4,
        BLOB_MEM_GUEST,
        &[MemEntry {
            addr: BLOB_AREA + 0x20010,
            length: 4096,
        }],
    );
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_ERR_INVALID_PARAMETER
    );
    // Once unreferenced, its pages are free for another blob.
    let unref = request(hdr(CMD_RESOURCE_UNREF, 0), &u32s(&[1, 0]));
    assert_eq!(response_type(&guest.request(&unref)), RESP_OK_NODATA);
    let (head, entries) = blob_request(2, BLOB_MEM_GUEST, &[page(BLOB_AREA + 4096)]);
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_OK_NODATA
    );
}

#[test]
fn event_idx_republishes_avail_event() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    guest.backend.set_event_idx(true);
    guest.vrings[0].set_queue_event_idx(true);
    for _ in 0..3 {
        guest.offer(&[&hdr(CMD_GET_DISPLAY_INFO, 0).to_bytes()], 64);
    }
    guest.kick();
    assert_eq!(guest.used_idx(), 3);
    // avail_event sits after the used ring's elements.
    let avail_event_addr = guest.queue.used_addr().0 + 4 + 8 * u64::from(QUEUE_SIZE);
    let avail_event: u16 = mem.read_obj(GuestAddress(avail_event_addr)).unwrap();
    assert_eq!(avail_event, 3);
}

/// A guest that resets the device leaves its queue not ready, with
/// requests still in its avail ring: a kick then returns at once (it used
/// to go round for ever with EVENT_IDX, logging an iterator error each
/// time), and nothing is answered.
#[test]
fn a_kick_on_a_queue_not_ready_returns() {
    let mem = memory();
    let mut guest = Guest::new(&mem);
    guest.backend.set_event_idx(true);
    guest.vrings[0].set_queue_event_idx(true);
    guest.offer(&[&hdr(CMD_GET_DISPLAY_INFO, 0).to_bytes()], 64);
    guest.vrings[0].set_queue_ready(false);
    let (done, finished) = std::sync::mpsc::channel();
    let (backend, vrings) = (&mut guest.backend, &guest.vrings);
    std::thread::scope(|scope| {
        scope.spawn(move || {
            backend.handle_event(0, EventSet::IN, vrings, 0).unwrap();
            done.send(()).unwrap();
        });
        if finished.recv_timeout(Duration::from_secs(5)).is_err() {
            // The spinning thread cannot be joined: end the test binary.
            eprintln!("a_kick_on_a_queue_not_ready_returns: the kick did not return");
            std::process::exit(101);
        }
    });
    assert_eq!(guest.used_idx(), 0);
}

#[test]
fn config_space_honours_offset_and_size() {
    let mem = memory();
    let guest = Guest::new(&mem);
    let config = guest.backend.get_config(0, CONFIG_SIZE as u32);
    assert_eq!(
        config,
        GpuConfig {
            num_scanouts: 0,
            num_capsets: 1,
            ..GpuConfig::default()
        }
        .to_bytes()
    );
    assert_eq!(guest.backend.get_config(12, 4), 1u32.to_le_bytes());
    assert!(guest.backend.get_config(12, 8).is_empty());
    assert!(guest.backend.get_config(u32::MAX, 4).is_empty());
    let features = guest.backend.features();
    for bit in [
        VIRTIO_GPU_F_VIRGL,
        VIRTIO_GPU_F_RESOURCE_BLOB,
        VIRTIO_GPU_F_CONTEXT_INIT,
    ] {
        assert_ne!(features & (1 << bit), 0);
    }
    assert_eq!(
        guest
            .counters
            .connections_active
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// A fenced doorbell is answered only once the session has executed the ring
/// up to it: here, after the guest published a command and rang again.
#[test]
fn fenced_doorbell_waits_for_the_ring() {
    use rgpu_proto::channel::*;
    use rgpu_proto::command::ChannelLayout;
    use rgpu_proto::{Command, ControlCommand};

    let mem = memory();
    let mut guest = Guest::new(&mem);
    let resource = 7;
    let layout = ChannelLayout {
        resource_id: resource,
        header_offset: 0,
        ring_offset: 4096,
        ring_size: 4096,
        reply_offset: 8192,
        reply_size: 4096,
        bounce_offset: 12288,
        bounce_size: 0,
    };
    mem.write_obj(CHANNEL_MAGIC, GuestAddress(BLOB_AREA + OFFSET_MAGIC))
        .unwrap();
    mem.write_obj(PROTOCOL_VERSION, GuestAddress(BLOB_AREA + OFFSET_VERSION))
        .unwrap();
    let (head, entries) = blob_request(
        resource,
        BLOB_MEM_GUEST,
        &[MemEntry {
            addr: BLOB_AREA,
            length: 12288,
        }],
    );
    assert_eq!(
        response_type(&guest.request_parts(&[&head, &entries], 64)),
        RESP_OK_NODATA
    );
    create_context(&mut guest, 1);
    let attach = request(hdr(CMD_CTX_ATTACH_RESOURCE, 1), &u32s(&[resource, 0]));
    assert_eq!(response_type(&guest.request(&attach)), RESP_OK_NODATA);
    let bind = encode_batch(&[(0, ControlCommand::BindChannel { layout })]);
    let response = guest.request(&request(hdr(CMD_SUBMIT_3D, 1), &submit_body(&bind)));
    assert_eq!(response_type(&response), RESP_OK_NODATA);

    let command = Command::CtxSynchronize.to_bytes(1);
    let until = command.len() as u64;
    let fenced = CtrlHdr {
        type_: CMD_SUBMIT_3D,
        flags: FLAG_FENCE,
        fence_id: 42,
        ctx_id: 1,
        ring_idx: 0,
    };
    let doorbell = encode_batch(&[(0, ControlCommand::Doorbell { until })]);
    let (fenced_head, fenced_out) = guest.offer(&[&request(fenced, &submit_body(&doorbell))], 64);
    guest.kick();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        guest.used_idx(),
        guest.used_seen,
        "fence answered before the ring ran"
    );

    mem.write_slice(&command, GuestAddress(BLOB_AREA + 4096))
        .unwrap();
    mem.write_obj(until, GuestAddress(BLOB_AREA + OFFSET_PRODUCED))
        .unwrap();
    let (ring_head, _) = guest.offer(
        &[&request(hdr(CMD_SUBMIT_3D, 1), &submit_body(&doorbell))],
        64,
    );
    guest.kick();
    let mut heads = [guest.next_used(), guest.next_used()];
    heads.sort();
    let mut expected = [
        (fenced_head, CTRL_HDR_SIZE as u32),
        (ring_head, CTRL_HDR_SIZE as u32),
    ];
    expected.sort();
    assert_eq!(heads, expected);

    let mut response = [0u8; CTRL_HDR_SIZE];
    mem.read_slice(&mut response, GuestAddress(fenced_out))
        .unwrap();
    assert_eq!(response_hdr(&response), fenced.response(RESP_OK_NODATA));
    let consumed: u64 = mem
        .read_obj(GuestAddress(BLOB_AREA + OFFSET_CONSUMED))
        .unwrap();
    assert_eq!(consumed, until);
    let seq: u64 = mem
        .read_obj(GuestAddress(BLOB_AREA + 8192 + REPLY_OFFSET_SEQ))
        .unwrap();
    assert_eq!(seq, 1);
}

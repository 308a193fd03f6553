//! Malformed input against a real daemon (sim executor): bad virtio-gpu
//! control requests, and bad commands written by hand into a channel's ring.
//! Each gets an error response, and the daemon keeps serving.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rgpu_proto::batch::encode_batch;
use rgpu_proto::channel::{
    CHANNEL_MAGIC, HEADER_SIZE, OFFSET_MAGIC, OFFSET_PRODUCED, OFFSET_VERSION, REPLY_OFFSET_LEN,
    REPLY_OFFSET_PAYLOAD, REPLY_OFFSET_RESULT, REPLY_OFFSET_SEQ,
};
use rgpu_proto::command::{padded, ChannelLayout, CommandHeader, Launch, COMMAND_HEADER_SIZE};
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use rgpu_proto::virtio_gpu::{self as vg, CtrlHdr, MemEntry, ResourceCreateBlob};
use rgpu_proto::wire::WireWriter;
use rgpu_proto::{BlobRange, Command, ControlCommand, PROTOCOL_VERSION};
use rgpu_tests::Daemon;
use rgpu_transport::carrier::local::LocalCarrier;
use rgpu_transport::{BlobMapping, Carrier, Channel};

const FENCE_TIMEOUT: Duration = Duration::from_secs(10);

fn connect(daemon: &Daemon) -> Arc<LocalCarrier> {
    Arc::new(LocalCarrier::connect(daemon.socket()).expect("connect a local carrier"))
}

// ---------------------------------------------------------------------------
// Control queue.

fn header(type_: u32, ctx_id: u32) -> WireWriter {
    let mut w = WireWriter::new();
    CtrlHdr {
        type_,
        ctx_id,
        ..CtrlHdr::default()
    }
    .encode(&mut w);
    w
}

/// Sends a raw request; returns the response type.
fn control(carrier: &LocalCarrier, request: &[u8]) -> u32 {
    let response = carrier
        .raw_control(request, vg::CTRL_HDR_SIZE)
        .expect("the device answers a malformed request");
    let bytes: [u8; 4] = response
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_else(|| panic!("short response {response:?}"));
    u32::from_le_bytes(bytes)
}

fn create_blob_request(ctx_id: u32, resource_id: u32, size: u64, entries: &[MemEntry]) -> Vec<u8> {
    let mut w = header(vg::CMD_RESOURCE_CREATE_BLOB, ctx_id);
    ResourceCreateBlob {
        resource_id,
        blob_mem: vg::BLOB_MEM_GUEST,
        blob_flags: vg::BLOB_FLAG_USE_MAPPABLE,
        blob_id: 0,
        size,
        entries: entries.to_vec(),
    }
    .encode(&mut w);
    w.into_bytes()
}

fn ctx_create_request(ctx_id: u32, context_init: u32) -> Vec<u8> {
    let mut w = header(vg::CMD_CTX_CREATE, ctx_id);
    let name = b"malformed";
    w.u32(name.len() as u32).u32(context_init);
    let mut debug_name = [0u8; vg::CTX_DEBUG_NAME_BYTES];
    debug_name[..name.len()].copy_from_slice(name);
    w.raw(&debug_name);
    w.into_bytes()
}

fn attach_request(ctx_id: u32, resource_id: u32) -> Vec<u8> {
    let mut w = header(vg::CMD_CTX_ATTACH_RESOURCE, ctx_id);
    w.u32(resource_id).u32(0);
    w.into_bytes()
}

fn submit_request(ctx_id: u32, size_field: u32, payload: &[u8]) -> Vec<u8> {
    let mut w = header(vg::CMD_SUBMIT_3D, ctx_id);
    w.u32(size_field).u32(0).raw(payload);
    w.into_bytes()
}

#[test]
fn control_queue_rejects_malformed_requests() {
    let mut daemon = Daemon::start("sim");
    let carrier = connect(&daemon);
    let ctx = carrier
        .create_context("malformed-control")
        .expect("create a context");
    let blob = carrier.create_blob(ctx, 4096).expect("create a blob");
    const UNKNOWN_CTX: u32 = 0x7777_0001;
    const UNKNOWN_RESOURCE: u32 = 0x7777_0002;
    // Far beyond any guest memory the local carrier maps (RGPU_LOCAL_MEMORY_MB).
    const OUTSIDE_GUEST_MEMORY: u64 = 1 << 46;

    let full = header(vg::CMD_GET_CAPSET_INFO, 0).into_bytes();
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("truncated header", full[..10].to_vec(), vg::RESP_ERR_UNSPEC),
        ("empty request", Vec::new(), vg::RESP_ERR_UNSPEC),
        (
            "unknown command type",
            header(0x0999, 0).into_bytes(),
            vg::RESP_ERR_UNSPEC,
        ),
        (
            "SUBMIT_3D size field past the request",
            submit_request(ctx, 0xffff_fff0, &[0u8; 16]),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "SUBMIT_3D size field larger than any batch",
            submit_request(ctx, u32::MAX, &[]),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "SUBMIT_3D with a bad batch magic",
            submit_request(ctx, 16, &[0xee; 16]),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "SUBMIT_3D to an unknown context",
            submit_request(UNKNOWN_CTX, 0, &[]),
            vg::RESP_ERR_INVALID_CONTEXT_ID,
        ),
        (
            "CTX_CREATE with another capset",
            ctx_create_request(0x7777_0010, 5),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "RESOURCE_CREATE_BLOB outside guest memory",
            create_blob_request(
                ctx,
                0x7777_0020,
                4096,
                &[MemEntry {
                    addr: OUTSIDE_GUEST_MEMORY,
                    length: 4096,
                }],
            ),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "RESOURCE_CREATE_BLOB whose address range overflows",
            create_blob_request(
                ctx,
                0x7777_0021,
                4096,
                &[MemEntry {
                    addr: u64::MAX - 100,
                    length: 4096,
                }],
            ),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "RESOURCE_CREATE_BLOB whose entries do not cover its size",
            create_blob_request(
                ctx,
                0x7777_0022,
                1 << 20,
                &[MemEntry {
                    addr: 0,
                    length: 4096,
                }],
            ),
            vg::RESP_ERR_INVALID_PARAMETER,
        ),
        (
            "RESOURCE_CREATE_BLOB with resource id 0",
            create_blob_request(
                ctx,
                0,
                4096,
                &[MemEntry {
                    addr: 0,
                    length: 4096,
                }],
            ),
            vg::RESP_ERR_INVALID_RESOURCE_ID,
        ),
        (
            "CTX_ATTACH_RESOURCE to an unknown context",
            attach_request(UNKNOWN_CTX, blob.resource_id),
            vg::RESP_ERR_INVALID_CONTEXT_ID,
        ),
        (
            "CTX_ATTACH_RESOURCE of an unknown resource",
            attach_request(ctx, UNKNOWN_RESOURCE),
            vg::RESP_ERR_INVALID_RESOURCE_ID,
        ),
        (
            "CTX_DESTROY of an unknown context",
            header(vg::CMD_CTX_DESTROY, UNKNOWN_CTX).into_bytes(),
            vg::RESP_ERR_INVALID_CONTEXT_ID,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, request, expected) in &cases {
        let got = control(&carrier, request);
        if got != *expected {
            wrong.push(format!("{what}: expected {expected:#x}, got {got:#x}"));
        }
    }
    assert!(wrong.is_empty(), "wrong responses:\n{}", wrong.join("\n"));

    // Requests that are malformed in ways with no single natural code still
    // get some error.
    let mut too_many_entries = header(vg::CMD_RESOURCE_CREATE_BLOB, ctx);
    too_many_entries
        .u32(0x7777_0030)
        .u32(vg::BLOB_MEM_GUEST)
        .u32(vg::BLOB_FLAG_USE_MAPPABLE)
        .u32(u32::MAX)
        .u64(0)
        .u64(4096);
    let got = control(&carrier, too_many_entries.as_bytes());
    assert!(
        got >= vg::RESP_ERR_UNSPEC,
        "too many blob entries: got {got:#x}"
    );
    let got = control(
        &carrier,
        &header(vg::CMD_CTX_CREATE, 0x7777_0011).into_bytes(),
    );
    assert!(
        got >= vg::RESP_ERR_UNSPEC,
        "CTX_CREATE without a body: got {got:#x}"
    );

    // Still serving: this connection, and a new one.
    let mut capset_info = header(vg::CMD_GET_CAPSET_INFO, 0);
    capset_info.u32(0).u32(0);
    assert_eq!(
        control(&carrier, capset_info.as_bytes()),
        vg::RESP_OK_CAPSET_INFO
    );
    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
    assert_mem_alloc_works(&connect(&daemon));
    carrier
        .destroy_blob(ctx, blob.resource_id)
        .expect("destroy the blob");
    carrier.destroy_context(ctx).expect("destroy the context");
}

/// A fresh channel through the transport's own implementation works.
fn assert_mem_alloc_works(carrier: &Arc<LocalCarrier>) {
    let dyn_carrier: Arc<dyn Carrier> = carrier.clone();
    let channel = Channel::open(dyn_carrier, "after-malformed").expect("open a channel");
    let reply = channel
        .call(&Command::MemAlloc { size: 4096 })
        .expect("MemAlloc through a fresh channel");
    assert_eq!(reply.result, CUDA_SUCCESS);
    assert_eq!(reply.payload.len(), 8);
    channel.close().expect("close the channel");
}

// ---------------------------------------------------------------------------
// A channel driven by hand.

const RING_SIZE: u64 = 64 * 1024;
const REPLY_SIZE: u64 = 4096;
const BOUNCE_SIZE: u64 = 4096;

/// A channel whose ring this test writes byte by byte (rgpu_proto::channel).
struct HandChannel {
    carrier: Arc<LocalCarrier>,
    ctx: u32,
    blob: BlobMapping,
    layout: ChannelLayout,
    produced: u64,
    next_seq: u64,
}

/// A reply record as the host wrote it.
#[derive(Debug)]
struct ReplyRecord {
    seq: u64,
    result: u32,
    payload: Vec<u8>,
}

impl HandChannel {
    fn open(carrier: Arc<LocalCarrier>) -> Self {
        let ctx = carrier
            .create_context("hand-channel")
            .expect("create a context");
        let size = HEADER_SIZE + RING_SIZE + REPLY_SIZE + BOUNCE_SIZE;
        let blob = carrier
            .create_blob(ctx, size)
            .expect("create the channel blob");
        assert!(blob.size >= size);
        let layout = ChannelLayout {
            resource_id: blob.resource_id,
            header_offset: 0,
            ring_offset: HEADER_SIZE,
            ring_size: RING_SIZE,
            reply_offset: HEADER_SIZE + RING_SIZE,
            reply_size: REPLY_SIZE,
            bounce_offset: HEADER_SIZE + RING_SIZE + REPLY_SIZE,
            bounce_size: BOUNCE_SIZE,
        };
        let channel = Self {
            carrier,
            ctx,
            blob,
            layout,
            produced: 0,
            next_seq: 1,
        };
        // The carrier's memory may hold an earlier request's bytes (as
        // guest-lib's channel does, clear the header first).
        channel.write(0, &vec![0u8; HEADER_SIZE as usize]);
        channel.write(OFFSET_MAGIC, &CHANNEL_MAGIC.to_le_bytes());
        channel.write(OFFSET_VERSION, &PROTOCOL_VERSION.to_le_bytes());
        channel.submit_and_wait(&ControlCommand::BindChannel { layout });
        channel
    }

    /// Writes into the channel blob at `offset`.
    fn write(&self, offset: u64, bytes: &[u8]) {
        let end = offset
            .checked_add(bytes.len() as u64)
            .expect("offset overflow");
        assert!(end <= self.blob.size, "write past the channel blob");
        // SAFETY: the range lies inside the blob mapping (checked above),
        // which lives as long as the carrier we hold.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.blob.ptr.add(offset as usize),
                bytes.len(),
            )
        };
    }

    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = offset.checked_add(len as u64).expect("offset overflow");
        assert!(end <= self.blob.size, "read past the channel blob");
        let mut out = vec![0u8; len];
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.blob.ptr.add(offset as usize), out.as_mut_ptr(), len)
        };
        out
    }

    fn atomic_u64(&self, offset: u64) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.blob.size);
        // SAFETY: in bounds and 8-byte aligned (the mapping is page aligned);
        // the host accesses this word only atomically too.
        unsafe { AtomicU64::from_ptr(self.blob.ptr.add(offset as usize).cast()) }
    }

    /// Sends a fenced SUBMIT_3D with one command and waits for its fence.
    fn submit_and_wait(&self, command: &ControlCommand) {
        let batch = encode_batch(&[(0, command.clone())]);
        let fence = self
            .carrier
            .submit(self.ctx, &batch, true)
            .expect("submit")
            .expect("a fenced submit returns a fence");
        let carrier = Arc::clone(&self.carrier);
        let ctx = self.ctx;
        let (done, wait) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(carrier.wait_fence(ctx, fence));
        });
        match wait.recv_timeout(FENCE_TIMEOUT) {
            Ok(result) => result.expect("wait for the fence"),
            Err(_) => panic!("the fence of {command:?} did not signal within {FENCE_TIMEOUT:?}"),
        }
    }

    /// Appends raw command bytes at the ring's write position (they must not
    /// reach the ring's end: these tests write far less than one ring).
    fn append(&mut self, bytes: &[u8]) {
        let position = self.produced % RING_SIZE;
        assert!(position + bytes.len() as u64 <= RING_SIZE, "test ring full");
        self.write(self.layout.ring_offset + position, bytes);
    }

    /// Publishes `produced` and rings a fenced doorbell up to it.
    fn publish(&mut self, produced: u64) {
        self.produced = produced;
        self.atomic_u64(self.layout.header_offset + OFFSET_PRODUCED)
            .store(produced, Ordering::SeqCst);
        self.submit_and_wait(&ControlCommand::Doorbell { until: produced });
    }

    fn reply(&self) -> ReplyRecord {
        let base = self.layout.reply_offset;
        let seq = self
            .atomic_u64(base + REPLY_OFFSET_SEQ)
            .load(Ordering::Acquire);
        let word = |offset| {
            let bytes = self.read(base + offset, 4);
            u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
        };
        let result = word(REPLY_OFFSET_RESULT);
        let len = (word(REPLY_OFFSET_LEN) as u64).min(REPLY_SIZE - REPLY_OFFSET_PAYLOAD);
        let payload = self.read(base + REPLY_OFFSET_PAYLOAD, len as usize);
        ReplyRecord {
            seq,
            result,
            payload,
        }
    }

    /// Writes `bytes` (a whole command, header included, padded) with a
    /// fresh reply number patched in, runs it, and returns its reply.
    fn run_raw(&mut self, mut bytes: Vec<u8>) -> ReplyRecord {
        let seq = self.next_seq;
        self.next_seq += 1;
        bytes[8..16].copy_from_slice(&seq.to_le_bytes());
        self.append(&bytes);
        self.publish(self.produced + bytes.len() as u64);
        let reply = self.reply();
        assert_eq!(reply.seq, seq, "no reply for {bytes:?}: {reply:?}");
        reply
    }

    fn run(&mut self, command: &Command) -> ReplyRecord {
        self.run_raw(command.to_bytes(1))
    }

    fn range(&self, offset: u64, length: u64) -> BlobRange {
        BlobRange {
            resource_id: self.layout.resource_id,
            offset,
            length,
        }
    }
}

/// A command with a hand-made header: `body` as given, padded to 8 bytes.
fn raw_command(opcode: u16, body_len: u32, body: &[u8]) -> Vec<u8> {
    let mut w = WireWriter::new();
    CommandHeader {
        opcode,
        flags: 0,
        body_len,
        reply_seq: 1,
        stamp: 0,
    }
    .encode(&mut w);
    w.raw(body).pad_to(8);
    w.into_bytes()
}

#[test]
fn channel_rejects_malformed_commands() {
    let mut daemon = Daemon::start("sim");
    let carrier = connect(&daemon);
    let mut ch = HandChannel::open(Arc::clone(&carrier));

    let alloc = ch.run(&Command::MemAlloc { size: 4096 });
    assert_eq!(alloc.result, CUDA_SUCCESS, "{alloc:?}");
    let dptr = u64::from_le_bytes(
        alloc
            .payload
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .expect("a device pointer"),
    );
    assert_ne!(dptr, 0);

    let bounce = ch.layout.bounce_offset;
    let blob_size = ch.blob.size;
    let unknown = 0x0bad_0001;
    let expectations: Vec<(&str, Command, u32)> = vec![
        (
            "unknown stream",
            Command::StreamSynchronize { stream: unknown },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "unknown stream query",
            Command::StreamQuery { stream: unknown },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "destroy unknown stream",
            Command::StreamDestroy { stream: unknown },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "copy on an unknown stream",
            Command::MemcpyHtoD {
                stream: unknown,
                dst: dptr,
                src: ch.range(bounce, 64),
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "unknown event",
            Command::EventSynchronize { event: unknown },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "record unknown event",
            Command::EventRecord {
                event: unknown,
                stream: 0,
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "wait for an unknown event",
            Command::StreamWaitEvent {
                stream: 0,
                event: unknown,
                flags: 0,
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "elapsed time of unknown events",
            Command::EventElapsedTime {
                start: unknown,
                end: unknown + 1,
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "function of an unknown module",
            Command::ModuleGetFunction {
                module: unknown,
                function: 5,
                name: b"rgpu_empty".to_vec(),
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "global of an unknown module",
            Command::ModuleGetGlobal {
                module: unknown,
                name: b"rgpu_global_counter".to_vec(),
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "unload an unknown module",
            Command::ModuleUnload { module: unknown },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "launch an unknown function",
            Command::LaunchKernel {
                launch: Launch {
                    function: unknown,
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    shared_mem_bytes: 0,
                    stream: 0,
                    params: Vec::new(),
                },
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "attribute of an unknown function",
            Command::FuncGetAttribute {
                function: unknown,
                attribute: 0,
            },
            CUDA_ERROR_INVALID_HANDLE,
        ),
        (
            "HtoD from past the blob's end",
            Command::MemcpyHtoD {
                stream: 0,
                dst: dptr,
                src: ch.range(blob_size - 8, 64),
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
        (
            "DtoH into past the blob's end",
            Command::MemcpyDtoH {
                stream: 0,
                dst: ch.range(blob_size, 1),
                src: dptr,
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
        (
            "HtoD with offset + length overflowing",
            Command::MemcpyHtoD {
                stream: 0,
                dst: dptr,
                src: ch.range(u64::MAX - 8, 64),
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
        (
            "DtoH with offset + length overflowing",
            Command::MemcpyDtoH {
                stream: 0,
                dst: ch.range(16, u64::MAX),
                src: dptr,
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
        (
            "HtoD from an unknown resource",
            Command::MemcpyHtoD {
                stream: 0,
                dst: dptr,
                src: BlobRange {
                    resource_id: unknown,
                    offset: 0,
                    length: 64,
                },
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
        (
            "DtoH into an unknown resource",
            Command::MemcpyDtoH {
                stream: 0,
                dst: BlobRange {
                    resource_id: unknown,
                    offset: 0,
                    length: 64,
                },
                src: dptr,
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
        (
            "module image past the blob's end",
            Command::ModuleLoad {
                module: 77,
                image: ch.range(blob_size - 8, 4096),
            },
            CUDA_ERROR_INVALID_VALUE,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, command, expected) in &expectations {
        let reply = ch.run(command);
        if reply.result != *expected {
            wrong.push(format!("{what}: expected {expected}, got {}", reply.result));
        }
    }
    assert!(wrong.is_empty(), "wrong results:\n{}", wrong.join("\n"));

    // Framing is intact but the body is not: an error reply each.
    let truncated = ch.run_raw(raw_command(
        rgpu_proto::Opcode::MemAlloc as u16,
        4,
        &[1, 2, 3, 4],
    ));
    assert_ne!(
        truncated.result, CUDA_SUCCESS,
        "truncated MemAlloc body: {truncated:?}"
    );
    let unknown_opcode = ch.run_raw(raw_command(0x7777, 8, &[0; 8]));
    assert_ne!(
        unknown_opcode.result, CUDA_SUCCESS,
        "unknown opcode: {unknown_opcode:?}"
    );
    let mut bad_blob_range = Command::MemcpyHtoD {
        stream: 0,
        dst: dptr,
        src: ch.range(bounce, 64),
    }
    .to_bytes(1);
    // BlobRange.reserved (after header, stream, dst, resource id).
    bad_blob_range[COMMAND_HEADER_SIZE + 16..COMMAND_HEADER_SIZE + 20]
        .copy_from_slice(&1u32.to_le_bytes());
    let reply = ch.run_raw(bad_blob_range);
    assert_ne!(
        reply.result, CUDA_SUCCESS,
        "non-zero reserved field: {reply:?}"
    );

    // After all of it, the channel still does real work: a round trip of
    // data through the bounce area.
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    ch.write(bounce, &pattern);
    let reply = ch.run(&Command::MemcpyHtoD {
        stream: 0,
        dst: dptr,
        src: ch.range(bounce, 64),
    });
    assert_eq!(reply.result, CUDA_SUCCESS, "{reply:?}");
    ch.write(bounce, &[0u8; 64]);
    let reply = ch.run(&Command::MemcpyDtoH {
        stream: 0,
        dst: ch.range(bounce, 64),
        src: dptr,
    });
    assert_eq!(reply.result, CUDA_SUCCESS, "{reply:?}");
    assert_eq!(ch.read(bounce, 64), pattern);
    let reply = ch.run(&Command::MemAlloc { size: 1 << 20 });
    assert_eq!(reply.result, CUDA_SUCCESS, "{reply:?}");

    // Last: a header whose body runs past the ring's end. The host must give
    // up on this ring, not hang or crash; if it answers, it is an error.
    let position = ch.produced % RING_SIZE;
    assert!(position > 0);
    let body_len = (RING_SIZE - position) as u32; // header + body cross the end
    let seq = ch.next_seq;
    let mut poison = raw_command(rgpu_proto::Opcode::MemAlloc as u16, body_len, &[]);
    poison[8..16].copy_from_slice(&seq.to_le_bytes());
    ch.append(&poison);
    let claimed = ch.produced + padded(COMMAND_HEADER_SIZE + body_len as usize) as u64;
    ch.produced = claimed;
    ch.atomic_u64(ch.layout.header_offset + OFFSET_PRODUCED)
        .store(claimed, Ordering::SeqCst);
    let batch = encode_batch(&[(0, ControlCommand::Doorbell { until: claimed })]);
    let fence = carrier.submit(ch.ctx, &batch, true);
    if let Ok(Some(fence)) = fence {
        let (done, wait) = mpsc::channel();
        let waiter = Arc::clone(&carrier);
        let ctx = ch.ctx;
        std::thread::spawn(move || {
            let _ = done.send(waiter.wait_fence(ctx, fence));
        });
        assert!(
            wait.recv_timeout(FENCE_TIMEOUT).is_ok(),
            "the doorbell after a poisoned ring was never answered"
        );
    }
    let reply = ch.reply();
    if reply.seq == seq {
        assert_ne!(
            reply.result, CUDA_SUCCESS,
            "poisoned command succeeded: {reply:?}"
        );
    }

    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
    // A new context on the same connection, and a new connection, both work.
    assert_mem_alloc_works(&carrier);
    assert_mem_alloc_works(&connect(&daemon));
    let _ = carrier.destroy_context(ch.ctx);
    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
}

/// Handles of objects the guest destroyed (a stream, an event, a function
/// of an unloaded module). The session's tables are the only place a
/// handle is checked: the cuda executor takes these as driver objects, so
/// one that got past the session would reach the driver freed. Each is
/// refused, and the session goes on with live ones (one made in the very
/// place the driver may reuse).
#[test]
fn handles_of_destroyed_objects_are_refused() {
    let mut daemon = Daemon::start("sim");
    let carrier: Arc<dyn Carrier> = connect(&daemon);
    let channel = Channel::open(carrier, "stale-handles").expect("open a channel");
    let result = |command: Command| {
        channel
            .call(&command)
            .unwrap_or_else(|e| panic!("{command:?}: {e}"))
            .result
    };
    let ptx = std::fs::read(rgpu_tests::reference_ptx()).expect("the reference PTX");
    let load = |module| {
        channel
            .call_with_data(&ptx, &|image| Command::ModuleLoad { module, image })
            .expect("load the module")
            .result
    };
    let launch = |function, stream| Command::LaunchKernel {
        launch: Launch {
            function,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
            stream,
            params: Vec::new(),
        },
    };
    let get_function = |module, function| Command::ModuleGetFunction {
        module,
        function,
        name: b"rgpu_empty".to_vec(),
    };
    const MODULE: u32 = 1;
    const FUNCTION: u32 = 2;
    const STREAM: u32 = 3;
    const EVENT: u32 = 4;

    let create_stream = || Command::StreamCreate {
        stream: STREAM,
        flags: 0,
        priority: 0,
    };
    // The module, its function, the stream and the event made under their
    // guest handles, and each used once.
    let make_and_use_all = || {
        assert_eq!(load(MODULE), CUDA_SUCCESS);
        assert_eq!(result(get_function(MODULE, FUNCTION)), CUDA_SUCCESS);
        assert_eq!(result(create_stream()), CUDA_SUCCESS);
        assert_eq!(
            result(Command::EventCreate {
                event: EVENT,
                flags: 0
            }),
            CUDA_SUCCESS
        );
        assert_eq!(result(launch(FUNCTION, STREAM)), CUDA_SUCCESS);
        assert_eq!(
            result(Command::EventRecord {
                event: EVENT,
                stream: STREAM
            }),
            CUDA_SUCCESS
        );
        assert_eq!(
            result(Command::EventSynchronize { event: EVENT }),
            CUDA_SUCCESS
        );
    };
    make_and_use_all();
    assert_eq!(
        result(Command::StreamDestroy { stream: STREAM }),
        CUDA_SUCCESS
    );
    assert_eq!(result(Command::EventDestroy { event: EVENT }), CUDA_SUCCESS);
    assert_eq!(
        result(Command::ModuleUnload { module: MODULE }),
        CUDA_SUCCESS
    );

    let stale = [
        ("launch on a destroyed stream", launch(FUNCTION, STREAM)),
        (
            "synchronize a destroyed stream",
            Command::StreamSynchronize { stream: STREAM },
        ),
        (
            "query a destroyed stream",
            Command::StreamQuery { stream: STREAM },
        ),
        (
            "destroy a stream twice",
            Command::StreamDestroy { stream: STREAM },
        ),
        (
            "launch a function of an unloaded module",
            launch(FUNCTION, 0),
        ),
        (
            "attribute of a function of an unloaded module",
            Command::FuncGetAttribute {
                function: FUNCTION,
                attribute: 0,
            },
        ),
        (
            "record a destroyed event",
            Command::EventRecord {
                event: EVENT,
                stream: 0,
            },
        ),
        (
            "query a destroyed event",
            Command::EventQuery { event: EVENT },
        ),
        (
            "synchronize a destroyed event",
            Command::EventSynchronize { event: EVENT },
        ),
        (
            "wait for a destroyed event",
            Command::StreamWaitEvent {
                stream: 0,
                event: EVENT,
                flags: 0,
            },
        ),
        (
            "destroy an event twice",
            Command::EventDestroy { event: EVENT },
        ),
        (
            "function of an unloaded module",
            get_function(MODULE, FUNCTION + 10),
        ),
    ];
    let wrong: Vec<String> = stale
        .into_iter()
        .filter_map(|(what, command)| {
            let got = result(command);
            (got != CUDA_ERROR_INVALID_HANDLE)
                .then(|| format!("{what}: expected {CUDA_ERROR_INVALID_HANDLE}, got {got}"))
        })
        .collect();
    assert!(wrong.is_empty(), "wrong results:\n{}", wrong.join("\n"));

    // A stream with work on it, destroyed before the scheduler fenced that
    // work, and the next submission a while later: the session must not
    // name the destroyed stream when it fences (with the cuda executor that
    // recorded an event on a freed stream and killed the worker, in the
    // compatibility suite's `memory` program; the sim stops in debug
    // builds). Repeated so that some destruction lands between samples.
    assert_eq!(load(MODULE), CUDA_SUCCESS);
    assert_eq!(result(get_function(MODULE, FUNCTION)), CUDA_SUCCESS);
    for round in 0..40 {
        assert_eq!(result(create_stream()), CUDA_SUCCESS, "round {round}");
        channel
            .send(&launch(FUNCTION, STREAM))
            .expect("launch on the stream");
        assert_eq!(
            result(Command::StreamDestroy { stream: STREAM }),
            CUDA_SUCCESS,
            "round {round}"
        );
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(result(launch(FUNCTION, 0)), CUDA_SUCCESS, "round {round}");
    }
    assert_eq!(
        result(Command::ModuleUnload { module: MODULE }),
        CUDA_SUCCESS
    );

    // The same guest handles made again name live objects.
    make_and_use_all();
    assert_eq!(result(Command::CtxSynchronize), CUDA_SUCCESS);
    channel.close().expect("close the channel");
    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
}

//! What one connection may cost the daemon, and what it may hold up (issue
//! 7's findings, through a real daemon with the sim executor and a guest
//! that speaks the control queue itself):
//! - contexts and worker processes per connection are capped;
//! - destroying a context whose GPU work is still running answers later
//!   and holds up nothing else on the control queue;
//! - a flood of unfenced doorbells at a busy session queues nothing.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_proto::batch::encode_batch;
use rgpu_proto::command::Launch;
use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::process_group::tagged_debug_name;
use rgpu_proto::virtio_gpu::{self as vg, CtrlHdr};
use rgpu_proto::wire::WireWriter;
use rgpu_proto::{Command, ControlCommand, CAPSET_ID_RGPU};
use rgpu_tests::{reference_ptx, Daemon};
use rgpu_transport::carrier::local::LocalCarrier;
use rgpu_transport::{Carrier, Channel};

const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(30);

fn connect(daemon: &Daemon) -> Arc<LocalCarrier> {
    Arc::new(LocalCarrier::connect(daemon.socket()).expect("connect a local carrier"))
}

fn header(type_: u32, ctx_id: u32, flags: u32) -> WireWriter {
    let mut w = WireWriter::new();
    CtrlHdr {
        type_,
        ctx_id,
        flags,
        ..CtrlHdr::default()
    }
    .encode(&mut w);
    w
}

/// Sends a raw request; returns the response type.
fn control(carrier: &LocalCarrier, request: &[u8]) -> u32 {
    let response = carrier
        .raw_control(request, vg::CTRL_HDR_SIZE)
        .expect("the device answers");
    let bytes: [u8; 4] = response
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_else(|| panic!("short response {response:?}"));
    u32::from_le_bytes(bytes)
}

/// CTX_CREATE of an rgpu context named as guest process `tag` names them.
fn ctx_create(ctx_id: u32, tag: u128) -> Vec<u8> {
    let name = tagged_debug_name(tag, "bounds", vg::CTX_DEBUG_NAME_BYTES);
    let mut w = header(vg::CMD_CTX_CREATE, ctx_id, 0);
    w.u32(name.len() as u32).u32(CAPSET_ID_RGPU);
    let mut debug_name = [0u8; vg::CTX_DEBUG_NAME_BYTES];
    debug_name[..name.len()].copy_from_slice(name.as_bytes());
    w.raw(&debug_name);
    w.into_bytes()
}

fn ctx_destroy(ctx_id: u32) -> Vec<u8> {
    header(vg::CMD_CTX_DESTROY, ctx_id, 0).into_bytes()
}

/// The pid of each worker that serves a guest process, in the order they
/// were taken, from the daemon's log ("worker N: process P serves guest
/// process ...").
fn worker_pids(daemon: &Daemon) -> Vec<u32> {
    daemon
        .log()
        .lines()
        .filter_map(|l| l.split(": process ").nth(1))
        .filter_map(|rest| {
            rest.split(" serves guest process")
                .next()
                .filter(|_| rest.contains(" serves "))
        })
        .filter_map(|pid| pid.trim().parse().ok())
        .collect()
}

#[test]
fn contexts_and_workers_per_connection_are_capped() {
    let daemon = Daemon::start("sim");
    let carrier = connect(&daemon);
    // One guest process: 1024 contexts, in one worker.
    for ctx in 1..=1024 {
        assert_eq!(
            control(&carrier, &ctx_create(ctx, 7)),
            vg::RESP_OK_NODATA,
            "context {ctx}"
        );
    }
    assert_eq!(
        control(&carrier, &ctx_create(1025, 7)),
        vg::RESP_ERR_OUT_OF_MEMORY,
        "the 1025th context of a connection"
    );
    for ctx in 1..=1024 {
        assert_eq!(control(&carrier, &ctx_destroy(ctx)), vg::RESP_OK_NODATA);
    }
    // 64 guest processes, a worker each; the 65th is refused.
    for process in 0..64u32 {
        assert_eq!(
            control(
                &carrier,
                &ctx_create(2000 + process, 1000 + u128::from(process))
            ),
            vg::RESP_OK_NODATA,
            "guest process {process}"
        );
    }
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "64 workers", |s| {
        s.get("workers_active") == 64
    });
    assert_eq!(
        control(&carrier, &ctx_create(3000, 99_999)),
        vg::RESP_ERR_OUT_OF_MEMORY,
        "a 65th guest process"
    );
    // Its worker's end makes room again.
    assert_eq!(control(&carrier, &ctx_destroy(2000)), vg::RESP_OK_NODATA);
    assert_eq!(
        control(&carrier, &ctx_create(3000, 99_999)),
        vg::RESP_OK_NODATA
    );
    drop(carrier);
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "every worker gone", |s| {
        s.get("workers_active") == 0 && s.get("connections_active") == 0
    });
}

/// A channel whose session is kept waiting on the GPU for `spin`: a
/// `rgpu_spin` kernel, then a synchronisation that needs no reply.
fn busy_channel(carrier: Arc<dyn Carrier>, spin: Duration) -> Channel {
    let channel = Channel::open(carrier, "busy").expect("open a channel");
    let ptx = std::fs::read(reference_ptx()).expect("the reference PTX");
    let reply = channel
        .call_with_data(&ptx, &|image| Command::ModuleLoad { module: 1, image })
        .expect("load the module");
    assert_eq!(reply.result, CUDA_SUCCESS);
    let reply = channel
        .call(&Command::ModuleGetFunction {
            module: 1,
            function: 1,
            name: b"rgpu_spin".to_vec(),
        })
        .expect("look up rgpu_spin");
    assert_eq!(reply.result, CUDA_SUCCESS);
    let nanos = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
    channel
        .send(&Command::LaunchKernel {
            launch: Launch {
                function: 1,
                grid: [1, 1, 1],
                block: [1, 1, 1],
                shared_mem_bytes: 0,
                stream: 0,
                params: nanos.to_le_bytes().to_vec(),
            },
        })
        .expect("launch");
    channel.send(&Command::CtxSynchronize).expect("synchronize");
    channel
}

#[test]
fn destroying_a_busy_context_holds_up_nothing_else() {
    let daemon = Daemon::start("sim");
    let carrier = connect(&daemon);
    let dyn_carrier: Arc<dyn Carrier> = carrier.clone();
    let busy = busy_channel(dyn_carrier.clone(), Duration::from_secs(20));
    let busy_ctx = busy.ctx_id();
    // Let the session reach the synchronisation.
    std::thread::sleep(Duration::from_millis(300));

    let destroyer = {
        let carrier = carrier.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let response = control(&carrier, &ctx_destroy(busy_ctx));
            (response, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    // Meanwhile another guest process of the connection creates a context,
    // a blob, and attaches it: none of it waits for the busy one.
    let started = Instant::now();
    assert_eq!(
        control(&carrier, &ctx_create(500, 0xabc)),
        vg::RESP_OK_NODATA
    );
    let blob = carrier.create_blob(500, 1 << 20).expect("a blob beside");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the control queue waited {took:?} for a busy context's destroy"
    );
    carrier
        .destroy_blob(500, blob.resource_id)
        .expect("destroy the blob");
    // The destroy is answered once its worker ended the busy work (it is
    // killed after its grace period: the kernel would run 20 s).
    let (response, destroy_took) = destroyer.join().expect("the destroying thread");
    assert_eq!(response, vg::RESP_OK_NODATA);
    assert!(
        destroy_took < Duration::from_secs(15),
        "the destroy took {destroy_took:?}"
    );
    drop(busy);
}

#[test]
fn a_doorbell_flood_at_a_busy_session_queues_nothing() {
    let daemon = Daemon::start("sim");
    let carrier = connect(&daemon);
    let dyn_carrier: Arc<dyn Carrier> = carrier.clone();
    let busy = busy_channel(dyn_carrier, Duration::from_secs(60));
    let worker = *worker_pids(&daemon).last().expect("a worker");
    let rss = || {
        std::fs::read_to_string(format!("/proc/{worker}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            })
            .expect("the worker's VmRSS")
    };
    std::thread::sleep(Duration::from_millis(300));
    let before = rss();
    let doorbell = {
        let batch = encode_batch(&[(0, ControlCommand::Doorbell { until: 0 })]);
        let mut w = header(vg::CMD_SUBMIT_3D, busy.ctx_id(), 0);
        w.u32(batch.len() as u32).u32(0).raw(&batch);
        w.into_bytes()
    };
    let flood = 100_000;
    for _ in 0..flood {
        assert_eq!(control(&carrier, &doorbell), vg::RESP_OK_NODATA);
    }
    let after = rss();
    // Queued one by one, 100,000 submissions would hold several MiB.
    assert!(
        after.saturating_sub(before) < 2048,
        "the worker grew from {before} kB to {after} kB under {flood} doorbells"
    );
    drop(busy);
    drop(carrier);
}

/// The guest frees a blob's pages when its unref is answered, so the answer
/// (and the detach's) waits until no queued GPU work can touch them.
#[test]
fn an_unref_is_answered_after_the_work_that_may_touch_the_blob() {
    let daemon = Daemon::start("sim");
    let carrier = connect(&daemon);
    let dyn_carrier: Arc<dyn Carrier> = carrier.clone();
    let spin = Duration::from_millis(1500);
    let busy = busy_channel(dyn_carrier, spin);
    let launched = Instant::now();
    // Let the session submit the kernel and block in the synchronisation
    // (a detach ahead of a kernel not yet submitted owes that kernel
    // nothing: it cannot name the detached blob any more).
    std::thread::sleep(Duration::from_millis(300));
    let blob = carrier
        .create_blob(busy.ctx_id(), 1 << 20)
        .expect("a blob of the busy context");
    carrier
        .destroy_blob(busy.ctx_id(), blob.resource_id)
        .expect("detach and unref");
    let answered = launched.elapsed();
    assert!(
        answered >= spin - Duration::from_millis(200),
        "the unref was answered {answered:?} after the launch, before the {spin:?} kernel ended"
    );
    busy.close().expect("close the channel");
}

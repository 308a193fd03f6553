//! Sessions end to end with the guest side played by hand: a channel blob and
//! a data blob in anonymous "guest memory", commands written into the ring
//! with rgpu-proto's encoders, doorbells through `Session::submit`.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::sync::Arc;
use std::time::{Duration, Instant};

use guest::*;
use rgpu_executor::sim::{SimExecutor, SIM_TOTAL_MEM};
use rgpu_proto::channel::{
    GUEST_READS_IDLE_EPOCH, HOST_IDLE_DOORBELL, HOST_IDLE_WAKE_WORD, OFFSET_MAGIC, OFFSET_WAKE,
};
use rgpu_proto::command::{CommandHeader, Launch, COMMAND_HEADER_SIZE, COMMAND_STAMP_OFFSET};
use rgpu_proto::cuda_result::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS,
};
use rgpu_proto::reply::{decode_u64s, FunctionInfo};
use rgpu_proto::wire::WireWriter;
use rgpu_proto::{BlobRange, Command, ControlCommand};
use rgpu_session::{Blob, Counters, Session};

/// The reference kernels (the sim runs them by name).
const REFERENCE_KERNELS: &str = include_str!("../../tests/programs/reference_kernels.ptx");

fn setup() -> (Guest, Session, Arc<Counters>, Arc<SimExecutor>) {
    let guest = Guest::new();
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let session = guest.start(executor.clone(), counters.clone());
    (guest, session, counters, executor)
}

#[test]
fn alloc_copy_memset_copy_back() {
    let (mut guest, session, counters, _executor) = setup();
    assert_eq!(Counters::get(&counters.sessions_active), 1);
    assert_eq!(Counters::get(&counters.sessions_total), 1);

    let ptr = guest.alloc(&session, 4096);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 4096);

    let input: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
    guest.data.write(0, &input).unwrap();
    guest.send(
        &session,
        Command::MemcpyHtoD {
            stream: 0,
            dst: ptr,
            src: Guest::data_range(0, 4096),
        },
    );
    guest.send(
        &session,
        Command::Memset {
            stream: 0,
            dst: ptr + 1024,
            value: 0xabcd_1234,
            element_size: 4,
            count: 16,
        },
    );
    let back = guest.read_device(&session, ptr, 8192, 4096);

    let mut expected = input.clone();
    for chunk in expected[1024..1024 + 64].chunks_mut(4) {
        chunk.copy_from_slice(&0xabcd_1234u32.to_le_bytes());
    }
    assert_eq!(back, expected);
    assert_eq!(Counters::get(&counters.zero_copy_bytes), 8192);

    // Staged: the source is a Padding body in the ring itself.
    let staged: Vec<u8> = (0..100u8).collect();
    let src = guest.stage(&session, &staged);
    guest.send(
        &session,
        Command::MemcpyHtoD {
            stream: 0,
            dst: ptr + 8,
            src,
        },
    );
    let back = guest.read_device(&session, ptr + 8, 0, 100);
    assert_eq!(back, staged);
    assert_eq!(Counters::get(&counters.staged_bytes), 100);

    let (result, payload) = guest.call(&session, Command::MemGetInfo);
    assert_eq!(result, CUDA_SUCCESS);
    let [free, total] = decode_u64s::<2>(&payload).unwrap();
    assert_eq!((free, total), (SIM_TOTAL_MEM - 4096, SIM_TOTAL_MEM));

    let (result, _) = guest.call(&session, Command::MemFree { device_ptr: ptr });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 0);
    assert_eq!(Counters::get(&counters.command_errors), 0);
    session.shutdown();
}

#[test]
fn ring_wraps_around_with_padding_and_short_tails() {
    let (mut guest, session, counters, _executor) = setup();
    let count = 1000u32;
    let ptr = guest.alloc(&session, u64::from(count) * 4);
    // 48-byte memsets leave a 32-byte tail at the ring's end (a Padding).
    for i in 0..count {
        guest.send(
            &session,
            Command::Memset {
                stream: 0,
                dst: ptr + u64::from(i) * 4,
                value: i * 3,
                element_size: 4,
                count: 1,
            },
        );
    }
    // 24-byte commands leave an 8-byte tail: no room for a header.
    // (Limits 0 to 9, all the sim knows.)
    for limit in 0..700 {
        guest.send(&session, Command::CtxGetLimit { limit: limit % 10 });
    }
    let mut expected: Vec<u32> = (0..count).map(|i| i * 3).collect();
    // Staged copies of odd sizes move the wrap point around.
    for i in 0..300u32 {
        for k in 0..=(i % 37) {
            expected[k as usize] = i * 1000 + k;
        }
        let values: Vec<u8> = (0..(i % 37) + 1)
            .flat_map(|k| (i * 1000 + k).to_le_bytes())
            .collect();
        let src = guest.stage(&session, &values);
        guest.send(
            &session,
            Command::MemcpyHtoD {
                stream: 0,
                dst: ptr,
                src,
            },
        );
    }
    assert!(guest.produced > 4 * RING_SIZE);
    let back = guest.read_device(&session, ptr, 0, u64::from(count) * 4);
    assert_eq!(u32s(&back), expected);
    assert_eq!(Counters::get(&counters.command_errors), 0);
    session.shutdown();
}

#[test]
fn unknown_handles_and_bad_ranges() {
    let (mut guest, session, counters, _executor) = setup();
    let ptr = guest.alloc(&session, 1024);
    let invalid_handle = [
        Command::StreamSynchronize { stream: 77 },
        Command::StreamDestroy { stream: 0 },
        Command::EventRecord {
            event: 5,
            stream: 0,
        },
        Command::ModuleUnload { module: 3 },
        Command::FuncGetAttribute {
            function: 9,
            attribute: 0,
        },
        Command::LaunchKernel {
            launch: Launch {
                function: 9,
                ..Launch::default()
            },
        },
        Command::MemcpyHtoD {
            stream: 12,
            dst: ptr,
            src: Guest::data_range(0, 16),
        },
    ];
    for command in invalid_handle {
        let (result, _) = guest.call(&session, command.clone());
        assert_eq!(result, CUDA_ERROR_INVALID_HANDLE, "{command:?}");
    }
    let bad_ranges = [
        Guest::data_range(DATA_SIZE - 8, 16),
        Guest::data_range(u64::MAX - 4, 16),
        BlobRange {
            resource_id: 99,
            offset: 0,
            length: 16,
        },
    ];
    for range in bad_ranges {
        let (result, _) = guest.call(
            &session,
            Command::MemcpyHtoD {
                stream: 0,
                dst: ptr,
                src: range,
            },
        );
        assert_eq!(result, CUDA_ERROR_INVALID_VALUE, "{range:?}");
        let (result, _) = guest.call(
            &session,
            Command::MemcpyDtoH {
                stream: 0,
                dst: range,
                src: ptr,
            },
        );
        assert_eq!(result, CUDA_ERROR_INVALID_VALUE, "{range:?}");
    }
    // Handles the guest may not create: zero, duplicates, the per-thread stream.
    let (result, _) = guest.call(
        &session,
        Command::StreamCreate {
            stream: 4,
            flags: 0,
            priority: 0,
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    for stream in [0, 4, u32::MAX] {
        let (result, _) = guest.call(
            &session,
            Command::StreamCreate {
                stream,
                flags: 0,
                priority: 0,
            },
        );
        assert_eq!(result, CUDA_ERROR_INVALID_VALUE, "stream {stream}");
    }
    let (result, _) = guest.call(&session, Command::StreamSynchronize { stream: 4 });
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, Command::StreamDestroy { stream: 4 });
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, Command::StreamSynchronize { stream: 4 });
    assert_eq!(result, CUDA_ERROR_INVALID_HANDLE);
    // Unknown device pointer.
    let (result, _) = guest.call(&session, Command::MemFree { device_ptr: 12345 });
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(Counters::get(&counters.command_errors), 18);
    session.shutdown();
}

#[test]
fn modules_functions_launches_and_events() {
    let (mut guest, session, _counters, executor) = setup();
    // Starts with a comment: bytes from its second on are no image.
    let image = REFERENCE_KERNELS.as_bytes();
    let result = guest.load_module(&session, 1, 4096, image);
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(
        &session,
        Command::ModuleLoad {
            module: 2,
            image: Guest::data_range(4097, 10),
        },
    );
    assert_eq!(result, rgpu_proto::cuda_result::CUDA_ERROR_INVALID_IMAGE);

    let get = |function, name: &[u8]| Command::ModuleGetFunction {
        module: 1,
        function,
        name: name.to_vec(),
    };
    let (result, payload) = guest.call(&session, get(10, b"rgpu_fill_index"));
    assert_eq!(result, CUDA_SUCCESS);
    let info = FunctionInfo::decode(&payload).unwrap();
    assert_eq!(info.buffer_size(), 16);
    // Looking the same handle up again replaces it.
    let (result, _) = guest.call(&session, get(10, b"rgpu_fill_index"));
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, get(11, b"missing"));
    assert_eq!(result, CUDA_ERROR_NOT_FOUND);
    let (result, _) = guest.call(&session, get(11, &[0xff, 0xfe]));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    let (result, payload) = guest.call(
        &session,
        Command::FuncGetAttribute {
            function: 10,
            attribute: 4,
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    // CU_FUNC_ATTRIBUTE_NUM_REGS, as the sim answers it.
    assert_eq!(payload, 16i32.to_le_bytes());

    let out = guest.alloc(&session, 256);
    let mut params = out.to_le_bytes().to_vec();
    params.extend_from_slice(&500u32.to_le_bytes());
    params.extend_from_slice(&64u32.to_le_bytes());
    let launch = |params: Vec<u8>| Command::LaunchKernel {
        launch: Launch {
            function: 10,
            grid: [2, 1, 1],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            stream: 0,
            params,
        },
    };
    let (result, _) = guest.call(&session, launch(params[..12].to_vec()));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    guest.send(&session, launch(params.clone()));
    let back = guest.read_device(&session, out, 0, 256);
    assert_eq!(u32s(&back), (500..564).collect::<Vec<u32>>());
    assert_eq!(executor.observer().launches(), 1);

    for event in [20, 21] {
        guest.send(&session, Command::EventCreate { event, flags: 0 });
        guest.send(&session, Command::EventRecord { event, stream: 0 });
    }
    let (result, payload) = guest.call(&session, Command::EventElapsedTime { start: 20, end: 21 });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(payload.len(), 4);
    let (result, _) = guest.call(&session, Command::EventDestroy { event: 20 });
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, Command::EventQuery { event: 20 });
    assert_eq!(result, CUDA_ERROR_INVALID_HANDLE);

    // Unloading the module forgets its functions.
    let (result, _) = guest.call(&session, Command::ModuleUnload { module: 1 });
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, launch(params));
    assert_eq!(result, CUDA_ERROR_INVALID_HANDLE);
    session.shutdown();
}

/// A command header (no stamp), encoded; the body is the caller's to add.
fn header(opcode: u16, body_len: u32, reply_seq: u64) -> WireWriter {
    let mut w = WireWriter::new();
    CommandHeader {
        opcode,
        flags: 0,
        body_len,
        reply_seq,
        stamp: 0,
    }
    .encode(&mut w);
    w
}

#[test]
fn garbage_poisons_the_ring_but_the_session_keeps_answering() {
    let (mut guest, session, counters, _executor) = setup();
    // A header whose body length is past any limit.
    guest.push_raw(&session, &[0xff; 16]);
    guest.publish();
    guest.kick(&session);
    // The poison surfaces as the result of the next request, once.
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);

    // A sound header whose body runs past `produced`.
    let w = header(rgpu_proto::Opcode::MemAlloc as u16, 8, 0);
    guest.push_raw(&session, w.as_bytes());
    guest.publish();
    guest.kick(&session);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);

    // A sound header with an unknown opcode: skipped, answered with an error.
    let seq = 9999;
    let mut w = header(0x7777, 8, seq);
    w.u64(0);
    let (result, _) = guest.call_raw(&session, w.as_bytes(), seq);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);

    let ptr = guest.alloc(&session, 64);
    assert_ne!(ptr, 0);
    assert_eq!(Counters::get(&counters.command_errors), 3);
    session.shutdown();
}

#[test]
fn a_wild_produced_counter_is_skipped_once() {
    let (mut guest, session, counters, _executor) = setup();
    // Far more than a ring ahead, and not even command aligned.
    guest.produced = (1 << 62) + 3;
    guest.publish();
    guest.kick(&session);
    assert_eq!(guest.consumed(), guest.produced);
    assert_eq!(Counters::get(&counters.command_errors), 1);
    // The ring works on from there.
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    for _ in 0..400 {
        let (result, _) = guest.call(&session, Command::CtxGetLimit { limit: 1 });
        assert_eq!(result, CUDA_SUCCESS);
    }
    assert_eq!(Counters::get(&counters.command_errors), 1);
    session.shutdown();
}

/// Waits (a bounded time) for the reply numbered `seq`.
fn await_reply(guest: &Guest, seq: u64) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (got, result, _) = guest.reply();
        if got == seq {
            return result;
        }
        assert!(Instant::now() < deadline, "no reply {seq} (last {got})");
        std::thread::yield_now();
    }
}

/// Waits until the host's `consumed` reaches `position`: it answers a
/// command first and moves `consumed` past it after.
fn await_consumed(guest: &Guest, position: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while guest.consumed() < position {
        assert!(
            Instant::now() < deadline,
            "consumed stayed at {} (waiting for {position})",
            guest.consumed()
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_stamped_command_runs_before_produced_says_so_and_a_stale_stamp_does_not() {
    let mut guest = Guest::new();
    // The host polls its ring for 5 s after each command.
    let tenant = rgpu_session::Tenant::with_settings(rgpu_session::SessionSettings::new(
        5_000_000, 50, 0, None,
    ));
    let counters = Arc::new(Counters::default());
    let session = guest.start_in(Arc::new(SimExecutor::new()), counters.clone(), tenant);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);

    // The stamp of another position: not a command yet.
    let before = guest.produced;
    let stale = guest.next_seq;
    guest.next_seq += 1;
    guest.push_stamped(&session, &Command::CtxSynchronize, stale, Some(before + 8));
    std::thread::sleep(Duration::from_millis(100));
    assert_ne!(guest.reply().0, stale);
    assert_eq!(guest.consumed(), before);
    // `produced` says it is: it runs.
    guest.publish();
    assert_eq!(await_reply(&guest, stale), CUDA_SUCCESS);

    // Its own position's stamp and nothing else: it runs, past `produced`.
    let published = guest.produced;
    let stamped = guest.next_seq;
    guest.next_seq += 1;
    guest.push_stamped(&session, &Command::CtxSynchronize, stamped, None);
    assert_eq!(await_reply(&guest, stamped), CUDA_SUCCESS);
    await_consumed(&guest, published + 1);
    assert_eq!(
        guest.counter(rgpu_proto::channel::OFFSET_PRODUCED),
        published
    );
    guest.publish();
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);

    // A stamped Padding carrying the data of a command not written yet:
    // the host moves past it but does not give its space back until the
    // command has run.
    await_consumed(&guest, guest.produced);
    let before = guest.consumed();
    assert_eq!(before, guest.produced);
    let mut staged = header(rgpu_proto::Opcode::Padding as u16, 64, 0)
        .as_bytes()
        .to_vec();
    staged.extend_from_slice(&[0x5a; 64]);
    guest.push_raw_stamped(&session, &staged, None);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(guest.consumed(), before);
    let after_data = guest.next_seq;
    guest.next_seq += 1;
    guest.push_stamped(&session, &Command::CtxSynchronize, after_data, None);
    assert_eq!(await_reply(&guest, after_data), CUDA_SUCCESS);
    let deadline = Instant::now() + Duration::from_secs(5);
    while guest.consumed() != guest.produced {
        assert!(
            Instant::now() < deadline,
            "consumed stayed at {}",
            guest.consumed()
        );
        std::thread::yield_now();
    }
    guest.publish();

    // A stamped header that does not decode poisons the ring once; its
    // stamp is not believed again (the host does not read it over and
    // over), and the guest goes on once it publishes.
    let mut garbage = vec![0xffu8; COMMAND_STAMP_OFFSET];
    garbage.resize(COMMAND_HEADER_SIZE, 0);
    let errors = Counters::get(&counters.command_errors);
    guest.push_raw_stamped(&session, &garbage, None);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(Counters::get(&counters.command_errors), errors + 1);
    guest.produced -= COMMAND_HEADER_SIZE as u64;
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(Counters::get(&counters.command_errors), errors + 1);
    session.shutdown();
}

#[test]
fn sessions_and_blobs_cross_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Session>();
    shared::<Blob>();
}

#[test]
fn asynchronous_errors_are_sticky_until_reported() {
    let (mut guest, session, counters, _executor) = setup();
    guest.send(&session, Command::MemFree { device_ptr: 0xdead });
    guest.send(&session, Command::StreamQuery { stream: 55 });
    // The first error wins, and a successful request reports it.
    let (result, payload) = guest.call(&session, Command::MemGetInfo);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    assert!(payload.is_empty());
    let (result, payload) = guest.call(&session, Command::MemGetInfo);
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(payload.len(), 16);
    // A request that fails itself reports its own error; the sticky one
    // waits for the next success.
    guest.send(&session, Command::EventSynchronize { event: 3 });
    let (result, _) = guest.call(&session, Command::MemFree { device_ptr: 1 });
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_HANDLE);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(Counters::get(&counters.command_errors), 4);
    session.shutdown();
}

#[test]
fn a_synchronize_right_after_one_answers_without_the_driver() {
    let (mut guest, session, counters, executor) = setup();
    let observer = executor.observer();
    let synchronize = |guest: &mut Guest| {
        let (result, _) = guest.call(&session, Command::CtxSynchronize);
        assert_eq!(result, CUDA_SUCCESS);
        observer.synchronizations()
    };
    assert_eq!(synchronize(&mut guest), 1);
    assert_eq!(synchronize(&mut guest), 1, "nothing ran since the last");
    assert_eq!(synchronize(&mut guest), 1);
    // Any other command between, even a query, and the driver is asked.
    let (result, _) = guest.call(&session, Command::MemGetInfo);
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(synchronize(&mut guest), 2);
    assert_eq!(synchronize(&mut guest), 2);
    // A command that failed anywhere (another session's) may have left an
    // error the driver reports at the next synchronize.
    Counters::add(&counters.command_errors, 1);
    assert_eq!(synchronize(&mut guest), 3);
    assert_eq!(synchronize(&mut guest), 3);
    // A failed synchronize arms nothing: the next one asks again.
    guest.send(&session, Command::MemFree { device_ptr: 0xdead });
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(observer.synchronizations(), 4);
    assert_eq!(synchronize(&mut guest), 5);
    assert_eq!(synchronize(&mut guest), 5);
    session.shutdown();
}

/// A scheduler that never arbitrates: the tenant has the GPU to itself.
#[derive(Debug)]
struct AlwaysFree;

impl rgpu_session::ComputeGate for AlwaysFree {
    fn admission(&self) -> Option<rgpu_session::Admission> {
        Some(rgpu_session::Admission::Free)
    }
    fn wait_for_grant(&self, _: Duration) -> Option<rgpu_session::Admission> {
        Some(rgpu_session::Admission::Free)
    }
    fn submitting(&self, _: Instant) -> bool {
        false
    }
    fn set_busy(&self, _: bool) {}
    fn set_waiting(&self, _: bool) {}
}

/// The scheduler's fence samples of an unarbitrated tenant (one per
/// millisecond of submissions, the first at once) wait until no launch is
/// left queued for the driver: a sample that fenced drained the launch
/// queue while the launch thread sat idle, once a millisecond through a
/// whole burst. The sim holds launches back until a fence, as a launch
/// thread may; a burst the session finds whole in its ring (written while
/// it slept, then one doorbell) must reach the driver in one batch, at
/// the fence of what follows it, not in a first batch of one at the
/// burst's first sample.
#[test]
fn an_unarbitrated_burst_of_launches_is_not_drained_for_fence_samples() {
    let guest_side = Guest::new();
    let executor = Arc::new(SimExecutor::new().deferring_launches());
    let observer = executor.observer();
    let tenant = rgpu_session::Tenant::with_shares(
        None,
        Some(Arc::new(AlwaysFree)),
        None,
        None,
        None,
        rgpu_session::SessionSettings::default(),
    );
    let session = guest_side.start_in(executor.clone(), Arc::new(Counters::default()), tenant);
    let mut guest = guest_side;
    let image = REFERENCE_KERNELS.as_bytes();
    let result = guest.load_module(&session, 1, 4096, image);
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(
        &session,
        Command::ModuleGetFunction {
            module: 1,
            function: 10,
            name: b"rgpu_empty".to_vec(),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    guest.await_host_idle(HOST_IDLE_DOORBELL);
    let empty = Command::LaunchKernel {
        launch: Launch {
            function: 10,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            ..Launch::default()
        },
    };
    let launches = 40;
    for _ in 0..launches {
        guest.push(&session, &empty, 0);
    }
    guest.push(&session, &Command::CtxSynchronize, 900);
    guest.publish();
    guest.kick(&session);
    assert_eq!(
        guest.await_reply(900, "the burst never finished"),
        CUDA_SUCCESS
    );
    assert_eq!(observer.launches(), launches);
    assert_eq!(
        observer.deferred_batches(),
        vec![launches],
        "a fence sample drained the launch queue during the burst"
    );
    session.shutdown();
}

#[test]
fn idle_host_needs_a_doorbell() {
    let (mut guest, session, counters, _executor) = setup();
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);
    // Past the bounded spin the worker announces that it sleeps.
    guest.await_host_idle(HOST_IDLE_DOORBELL);
    let seq = 500;
    guest.push(&session, &Command::CtxSynchronize, seq);
    guest.publish();
    std::thread::sleep(Duration::from_millis(50));
    assert_ne!(
        guest.reply().0,
        seq,
        "an idle host must not run without a doorbell"
    );
    // An unfenced doorbell wakes it.
    session.submit(
        vec![decoded(ControlCommand::Doorbell {
            until: guest.produced,
        })],
        None,
    );
    assert_eq!(
        guest.await_reply(seq, "doorbell did not wake the host"),
        CUDA_SUCCESS
    );
    assert!(Counters::get(&counters.doorbell_wakeups) >= 1);
    assert_eq!(Counters::get(&counters.wake_word_wakeups), 0);
    session.shutdown();
}

/// A guest that reads numbered idle spells sees each spell of the host
/// numbered anew (the mode in the low bits), however often the host says
/// it is idle during one; a guest that does not sees the plain value.
#[test]
fn the_host_numbers_its_idle_spells_for_a_guest_that_reads_them() {
    for numbered in [true, false] {
        let guest = Guest::new();
        if numbered {
            guest.announce_features(GUEST_READS_IDLE_EPOCH);
        }
        let session = guest.start(Arc::new(SimExecutor::new()), Arc::new(Counters::default()));
        let mut guest = guest;
        let mut seen = vec![];
        for _ in 0..3 {
            seen.push(guest.await_host_idle(HOST_IDLE_DOORBELL));
            let (result, _) = guest.call(&session, Command::CtxSynchronize);
            assert_eq!(result, CUDA_SUCCESS);
        }
        if numbered {
            assert!(seen.iter().all(|&v| v >> 2 >= 1), "{seen:?}");
            assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        } else {
            assert_eq!(seen, vec![HOST_IDLE_DOORBELL; 3]);
        }
        session.shutdown();
    }
}

/// Shuts `session` down, which must not wait for its worker's own look
/// at a wake word (once a second): the shutdown rings it.
fn shutdown_at_once(session: Session) {
    let started = Instant::now();
    session.shutdown();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "shutdown waited {:?} for the worker's own look",
        started.elapsed()
    );
}

/// A guest that announced the wake word (local mode) wakes its sleeping
/// worker through it, with no doorbell; the worker, asleep on the word and
/// not on its mailbox, still takes a doorbell, a blob and its shutdown at
/// once, as every post rings the word too.
#[test]
fn a_host_asleep_on_the_wake_word_wakes_for_the_guest_and_the_mailbox() {
    let guest = Guest::new();
    guest.announce_wake_word();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters.clone());
    let mut guest = guest;
    guest.await_host_idle(HOST_IDLE_WAKE_WORD);
    // The flag is up before the worker's last look at the ring: let it
    // reach its sleep, or it finds the command without a wake (as it
    // should).
    std::thread::sleep(Duration::from_millis(20));
    let seq = 500;
    guest.push(&session, &Command::CtxSynchronize, seq);
    guest.publish();
    std::thread::sleep(Duration::from_millis(50));
    assert_ne!(guest.reply().0, seq, "the host ran without being woken");
    guest.wake_word();
    assert_eq!(
        guest.await_reply(seq, "the wake word did not wake the host"),
        CUDA_SUCCESS
    );
    assert_eq!(Counters::get(&counters.wake_word_wakeups), 1);
    assert_eq!(Counters::get(&counters.doorbell_wakeups), 0);
    // A mailbox message: a fenced doorbell for commands published without
    // a wake. The worker looks at the word at most once a second unwoken.
    guest.await_host_idle(HOST_IDLE_WAKE_WORD);
    guest.push(&session, &Command::CtxSynchronize, seq + 1);
    guest.publish();
    let started = Instant::now();
    guest.kick(&session);
    assert_eq!(guest.reply().0, seq + 1);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a posted doorbell waited {:?} for the worker's own look",
        started.elapsed()
    );
    assert_eq!(Counters::get(&counters.doorbell_wakeups), 1);
    guest.await_host_idle(HOST_IDLE_WAKE_WORD);
    shutdown_at_once(session);
}

/// A guest that announces the wake word and then never wakes the worker
/// (a VM guest claiming to share the host's kernel) only slows itself:
/// its published commands run at the worker's next look (within a
/// second), and its session still shuts down at once. One that bumps and
/// wakes the word without pause only spins its own worker, which keeps
/// answering.
#[test]
fn a_guest_that_lies_about_the_wake_word_or_floods_it_only_slows_itself() {
    let guest = Guest::new();
    guest.announce_wake_word();
    let session = guest.start(Arc::new(SimExecutor::new()), Arc::new(Counters::default()));
    let mut guest = guest;
    guest.await_host_idle(HOST_IDLE_WAKE_WORD);
    let seq = 700;
    guest.push(&session, &Command::CtxSynchronize, seq);
    guest.publish();
    assert_eq!(
        guest.await_reply(seq, "an unwoken worker never looked again"),
        CUDA_SUCCESS
    );

    // The flooder's own view of the channel blob (the guest's is borrowed
    // mutably by its calls).
    let view = Blob::new(
        CHANNEL_BLOB,
        CHANNEL_SIZE,
        &channel_entries(),
        &guest.memory,
    )
    .unwrap();
    let word = view.atomic_u32(HEADER_OFFSET + OFFSET_WAKE).unwrap();
    let flooding = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                word.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                rgpu_proto::futex::wake(word);
            }
        });
        for i in 1..=20 {
            let (result, _) = guest.call(&session, Command::CtxSynchronize);
            assert_eq!(result, CUDA_SUCCESS, "call {i} under a flood of wake-ups");
        }
        flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    });
    shutdown_at_once(session);
}

#[test]
fn shutdown_completes_pending_and_frees_everything() {
    let (mut guest, session, counters, executor) = setup();
    guest.alloc(&session, 1000);
    guest.alloc(&session, 3000);
    let (result, _) = guest.call(
        &session,
        Command::StreamCreate {
            stream: 1,
            flags: 0,
            priority: 0,
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 4000);
    // A fence for commands the guest never writes stays pending...
    let (done, rx) = signal();
    session.submit(
        vec![decoded(ControlCommand::Doorbell {
            until: guest.produced + 4096,
        })],
        Some(done),
    );
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    // ...until the session ends.
    session.shutdown();
    rx.recv_timeout(WAIT).expect("completion at shutdown");
    assert_eq!(Counters::get(&counters.sessions_active), 0);
    assert_eq!(Counters::get(&counters.sessions_total), 1);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 0);
    assert_eq!(executor.observer().live_contexts(), 0);
}

#[test]
fn detached_blobs_are_gone() {
    let (mut guest, session, _counters, _executor) = setup();
    let ptr = guest.alloc(&session, 64);
    session.detach_blob(DATA_BLOB);
    let (result, _) = guest.call(
        &session,
        Command::MemcpyHtoD {
            stream: 0,
            dst: ptr,
            src: Guest::data_range(0, 64),
        },
    );
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    // Detaching the channel's blob unbinds the channel: doorbells complete
    // at once.
    session.detach_blob(CHANNEL_BLOB);
    let (done, rx) = signal();
    session.submit(
        vec![decoded(ControlCommand::Doorbell {
            until: guest.produced + 64,
        })],
        Some(done),
    );
    rx.recv_timeout(WAIT).expect("doorbell without channel");
    session.shutdown();
}

#[test]
fn submit_rejects_bad_channels_and_ring_commands() {
    let guest = Guest::new();
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let session = Session::spawn(3, "bad".into(), 0, executor, counters.clone()).unwrap();
    assert_eq!(session.ctx_id(), 3);
    assert_eq!(session.debug_name(), "bad");
    // Not attached yet.
    let (done, rx) = signal();
    session.submit(
        vec![decoded(ControlCommand::BindChannel { layout: layout() })],
        Some(done),
    );
    rx.recv_timeout(WAIT).unwrap();
    assert_eq!(Counters::get(&counters.command_errors), 1);
    // Attached, but the guest did not write the magic.
    session.attach_blob(Arc::new(
        Blob::new(
            CHANNEL_BLOB,
            CHANNEL_SIZE,
            &channel_entries(),
            &guest.memory,
        )
        .unwrap(),
    ));
    guest
        .channel
        .write(HEADER_OFFSET + OFFSET_MAGIC, &0u32.to_le_bytes())
        .unwrap();
    let (done, rx) = signal();
    session.submit(
        vec![
            decoded(ControlCommand::BindChannel { layout: layout() }),
            // The device model's, never the session's.
            decoded(ControlCommand::PlaceNextBlob {
                address: 0x7000_0000,
                size: 4096,
            }),
            decoded(ControlCommand::Doorbell { until: 64 }),
        ],
        Some(done),
    );
    // No channel bound: the doorbell completes at once.
    rx.recv_timeout(WAIT).unwrap();
    assert_eq!(Counters::get(&counters.command_errors), 3);
    session.shutdown();
}

#[test]
fn context_creation_failure_comes_back_from_spawn() {
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let err = Session::spawn(1, "x".into(), 5, executor, counters.clone()).unwrap_err();
    assert!(
        matches!(
            err,
            rgpu_session::SessionError::CreateContext {
                device: 5,
                code: rgpu_proto::cuda_result::CUDA_ERROR_INVALID_DEVICE
            }
        ),
        "{err}"
    );
    assert_eq!(Counters::get(&counters.sessions_active), 0);
    assert_eq!(Counters::get(&counters.sessions_total), 0);
}

/// The guest attaches a blob on the control queue before writing a command
/// that names it, but the attach reaches the session through its worker
/// process (which maps the blob first) and can arrive after the ring
/// command: the command waits for it instead of failing.
#[test]
fn a_command_waits_for_the_attach_of_the_blob_it_names() {
    let mut guest = Guest::new();
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let session = Session::spawn(7, "test".into(), 0, executor, counters).unwrap();
    session.attach_blob(Arc::new(
        Blob::new(
            CHANNEL_BLOB,
            CHANNEL_SIZE,
            &channel_entries(),
            &guest.memory,
        )
        .unwrap(),
    ));
    let (done, rx) = signal();
    session.submit(
        vec![decoded(ControlCommand::BindChannel { layout: layout() })],
        Some(done),
    );
    rx.recv_timeout(WAIT).unwrap();

    let ptr = guest.alloc(&session, 4096);
    let input: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
    guest.data.write(0, &input).unwrap();
    // The copy from the data blob is in the ring before the data blob is
    // attached; the attach comes 200 ms later.
    let memory = guest.memory.clone();
    let late = {
        let session = &session;
        std::thread::scope(|scope| {
            scope.spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                session.attach_blob(Arc::new(
                    Blob::new(DATA_BLOB, DATA_SIZE, &data_entries(), &memory).unwrap(),
                ));
            });
            guest.call(
                session,
                Command::MemcpyHtoD {
                    stream: 0,
                    dst: ptr,
                    src: Guest::data_range(0, 4096),
                },
            )
        })
    };
    assert_eq!(late.0, CUDA_SUCCESS, "{late:?}");
    let back = guest.read_device(&session, ptr, 8192, 4096);
    assert_eq!(back, input);
    session.shutdown();
}

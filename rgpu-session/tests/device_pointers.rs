//! Device pointers a guest passes to copies and memsets are checked against
//! what its process owns. The sim executor, like NVIDIA's driver with
//! unified addressing, lets every context reach every allocation of the
//! host process: only the session's check keeps tenants apart.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::sync::Arc;

use guest::*;
use rgpu_executor::sim::SimExecutor;
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use rgpu_proto::Command;
use rgpu_session::{Counters, Session, Tenant};

const MARKER: &[u8] = b"rgpu marker: must survive every forged pointer";

fn spawn(
    guest: &Guest,
    ctx_id: u32,
    executor: &Arc<SimExecutor>,
    counters: &Arc<Counters>,
    tenant: &Arc<Tenant>,
) -> Session {
    let session = Session::spawn_in_tenant(
        ctx_id,
        format!("ctx{ctx_id}"),
        0,
        executor.clone(),
        counters.clone(),
        tenant.clone(),
    )
    .expect("spawn a session");
    guest.bind(session)
}

fn htod(dst: u64, offset: u64, length: u64) -> Command {
    Command::MemcpyHtoD {
        stream: 0,
        dst,
        src: Guest::data_range(offset, length),
    }
}

fn dtoh(offset: u64, length: u64, src: u64) -> Command {
    Command::MemcpyDtoH {
        stream: 0,
        dst: Guest::data_range(offset, length),
        src,
    }
}

fn dtod(dst: u64, src: u64, size: u64) -> Command {
    Command::MemcpyDtoD {
        stream: 0,
        dst,
        src,
        size,
    }
}

fn memset(dst: u64, element_size: u32, count: u64) -> Command {
    Command::Memset {
        stream: 0,
        dst,
        value: 0x5a5a_5a5a,
        element_size,
        count,
    }
}

/// Reads `len` bytes of device memory at `ptr` through `session`.
fn read_back(guest: &mut Guest, session: &Session, ptr: u64, len: u64) -> Vec<u8> {
    let (result, _) = guest.call(session, dtoh(128 * 1024, len, ptr));
    assert_eq!(result, CUDA_SUCCESS, "read back {ptr:#x}+{len}");
    let mut back = vec![0u8; len as usize];
    guest
        .data
        .read(128 * 1024, &mut back)
        .expect("read the data blob");
    back
}

/// Writes `bytes` to device memory at `ptr` through `session`.
fn write(guest: &mut Guest, session: &Session, ptr: u64, bytes: &[u8]) {
    guest.data.write(0, bytes).expect("write the data blob");
    let (result, _) = guest.call(session, htod(ptr, 0, bytes.len() as u64));
    assert_eq!(result, CUDA_SUCCESS, "write {ptr:#x}");
}

/// Every kind of copy and memset with one forged range: each must fail with
/// INVALID_VALUE; returns how many commands were sent.
fn assert_all_refused(
    guest: &mut Guest,
    session: &Session,
    own: u64,
    forged: u64,
    len: u64,
) -> u64 {
    let commands = [
        htod(forged, 0, len),
        dtoh(0, len, forged),
        dtod(forged, own, len),
        dtod(own, forged, len),
        memset(forged, 1, len),
        memset(forged & !1, 2, len.div_ceil(2)),
        memset(forged & !3, 4, len.div_ceil(4)),
    ];
    for command in &commands {
        let (result, _) = guest.call(session, command.clone());
        assert_eq!(result, CUDA_ERROR_INVALID_VALUE, "{command:?}");
    }
    commands.len() as u64
}

#[test]
fn forged_pointers_fail_and_the_session_goes_on() {
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let mut guest = Guest::new();
    let tenant = Tenant::new();
    let session = spawn(&guest, 1, &executor, &counters, &tenant);
    // Memory of another tenant of this host process, right behind ours.
    let mut neighbour_guest = Guest::new();
    let neighbour = spawn(&neighbour_guest, 2, &executor, &counters, &Tenant::new());

    let size = 4096;
    let own = guest.alloc(&session, size);
    let theirs = neighbour_guest.alloc(&neighbour, size);
    write(&mut guest, &session, own, MARKER);
    write(&mut neighbour_guest, &neighbour, theirs, MARKER);
    let freed = guest.alloc(&session, size);
    let (result, _) = guest.call(&session, Command::MemFree { device_ptr: freed });
    assert_eq!(result, CUDA_SUCCESS);
    let errors_before = Counters::get(&counters.command_errors);

    let mut refused = 0;
    for (forged, len) in [
        (own + size, 16),       // just past the end
        (own + size - 8, 16),   // straddling the end
        (own - 16, 32),         // straddling the start
        (own, size + 1),        // one byte too long
        (own + (1 << 30), 16),  // never handed out
        (0x7e00_0000_0000, 64), // a host-looking address
        (theirs, 16),           // another tenant's allocation
        (theirs + 64, 64),      // inside it
        (freed, 16),            // freed
        (u64::MAX - 7, 16),     // wraps around
        (8, 16),                // near null
    ] {
        refused += assert_all_refused(&mut guest, &session, own, forged, len);
    }
    // A memset whose byte count overflows.
    let (result, _) = guest.call(&session, memset(own, 4, u64::MAX / 2));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    refused += 1;
    assert_eq!(
        Counters::get(&counters.command_errors) - errors_before,
        refused
    );

    // Nothing was touched, and the session still works: a valid copy
    // inside the allocation reads back what was written.
    assert_eq!(
        read_back(&mut guest, &session, own, MARKER.len() as u64),
        MARKER
    );
    assert_eq!(
        read_back(
            &mut neighbour_guest,
            &neighbour,
            theirs,
            MARKER.len() as u64
        ),
        MARKER
    );
    write(&mut guest, &session, own + 100, b"after");
    assert_eq!(read_back(&mut guest, &session, own + 100, 5), b"after");
    let (result, _) = guest.call(&session, dtod(own + 200, own + 100, 5));
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(read_back(&mut guest, &session, own + 200, 5), b"after");
    let (result, _) = guest.call(&session, memset(own + size - 4, 4, 1));
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(
        read_back(&mut guest, &session, own + size - 4, 4),
        [0x5a; 4]
    );
    // Zero-length copies name no byte: they behave as before the check.
    for command in [
        htod(own + size, 0, 0),
        dtod(own + size, own, 0),
        memset(own + size, 1, 0),
    ] {
        let (result, _) = guest.call(&session, command.clone());
        assert_eq!(result, CUDA_SUCCESS, "{command:?}");
    }
    session.shutdown();
    neighbour.shutdown();
}

#[test]
fn a_second_session_of_the_same_process_may_use_the_first_ones_memory() {
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let tenant = Tenant::new();
    let (mut first_guest, mut second_guest) = (Guest::new(), Guest::new());
    let first = spawn(&first_guest, 1, &executor, &counters, &tenant);
    let second = spawn(&second_guest, 2, &executor, &counters, &tenant);

    let shared = first_guest.alloc(&first, 4096);
    let own = second_guest.alloc(&second, 4096);
    assert_eq!(tenant.device_range_count(), 2);
    write(&mut first_guest, &first, shared, MARKER);
    // Read, written, copied and set by the other context.
    let len = MARKER.len() as u64;
    assert_eq!(read_back(&mut second_guest, &second, shared, len), MARKER);
    let (result, _) = second_guest.call(&second, dtod(own, shared, len));
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(read_back(&mut second_guest, &second, own, len), MARKER);
    write(
        &mut second_guest,
        &second,
        shared + 1000,
        b"from the second",
    );
    assert_eq!(
        read_back(&mut first_guest, &first, shared + 1000, 15),
        b"from the second"
    );
    let (result, _) = second_guest.call(&second, memset(shared + 2000, 1, 4));
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(
        read_back(&mut first_guest, &first, shared + 2000, 4),
        [0x5a; 4]
    );

    // Freed by its owner: gone for both.
    let (result, _) = first_guest.call(&first, Command::MemFree { device_ptr: shared });
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = second_guest.call(&second, dtoh(0, 16, shared));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);

    // A session that ends takes its memory with it.
    let gone = first_guest.alloc(&first, 64);
    assert_eq!(tenant.device_range_count(), 2);
    let (result, _) = second_guest.call(&second, dtoh(0, 64, gone));
    assert_eq!(result, CUDA_SUCCESS);
    first.shutdown();
    assert_eq!(tenant.device_range_count(), 1);
    let (result, _) = second_guest.call(&second, dtoh(0, 64, gone));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(read_back(&mut second_guest, &second, own, len), MARKER);
    second.shutdown();
    assert_eq!(tenant.device_range_count(), 0);
}

#[test]
fn a_session_of_another_tenant_gets_invalid_value() {
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());
    let (mut owner_guest, mut intruder_guest) = (Guest::new(), Guest::new());
    let owner = spawn(&owner_guest, 1, &executor, &counters, &Tenant::new());
    let intruder = spawn(&intruder_guest, 2, &executor, &counters, &Tenant::new());
    let secret = owner_guest.alloc(&owner, 4096);
    let own = intruder_guest.alloc(&intruder, 4096);
    write(&mut owner_guest, &owner, secret, MARKER);

    assert_all_refused(&mut intruder_guest, &intruder, own, secret, 16);
    // Not even a copy inside its own allocation from theirs, or a read of
    // the whole of theirs.
    let (result, _) = intruder_guest.call(&intruder, dtoh(0, 4096, secret));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    let mut leaked = vec![0u8; MARKER.len()];
    intruder_guest
        .data
        .read(0, &mut leaked)
        .expect("read the data blob");
    assert_ne!(leaked, MARKER);

    let len = MARKER.len() as u64;
    assert_eq!(read_back(&mut owner_guest, &owner, secret, len), MARKER);
    let (result, _) = intruder_guest.call(&intruder, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);
    owner.shutdown();
    intruder.shutdown();
}

//! Forged device pointers end to end, through a real daemon with the sim
//! executor, which reaches host memory registered for DMA by its address
//! just as NVIDIA's driver does.
//!
//! - `forged_pointer_test.c`, linked against guest-lib, tries copies and
//!   memsets on pointers it was never given (past an allocation's end,
//!   straddling it, never handed out, freed, null) and scans the addresses
//!   where the daemon registers guest memory; every try must fail with
//!   CUDA_ERROR_INVALID_VALUE and change nothing (the same program passes on
//!   NVIDIA's driver).
//! - A guest that bypasses guest-lib, whose own checks may stop a forged
//!   pointer before it leaves the guest, sends the same through a channel:
//!   the daemon must refuse them itself, and log the refusals at a bounded
//!   rate.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;
use rgpu_tests::{Daemon, GuestLib, GuestProcess};
use rgpu_transport::carrier::local::LocalCarrier;
use rgpu_transport::{Carrier, Channel};

const RUN_TIMEOUT: Duration = Duration::from_secs(300);
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(15);
/// What the session logs for each refused pointer.
const REFUSAL_LOG: &str = "none of this process's allocations or globals; refused";
/// Lines one log call site may write per second (rgpu_session::log_limit).
const LOG_LINES_PER_SECOND: u64 = 10;
const MIB: u64 = 1 << 20;
/// As forged_pointer_test.c: whole 2 MiB pages.
const BUFFER_BYTES: u64 = 2 * MIB;
/// A page-locked buffer that a 64 MiB probe grid cannot miss.
const PINNED_BYTES: u64 = 128 * MIB;
/// The scan of forged_pointer_test.c: the top 2 TiB of the address space,
/// where ASLR puts the daemon's mappings.
const SCAN_START: u64 = 0x7e00_0000_0000;
const SCAN_END: u64 = 0x8000_0000_0000;
const SCAN_STEP: u64 = 64 * MIB;

#[test]
fn forged_pointer_test_passes_and_changes_nothing() {
    let guest = GuestLib::new();
    let program = guest.build_program("forged_pointer_test.c");
    let daemon = Daemon::start("sim");
    let outcome = GuestProcess::spawn(guest.command(&program, &daemon)).finish(RUN_TIMEOUT);
    assert!(
        outcome.passed("forged_pointer_test"),
        "forged_pointer_test failed ({}):\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        outcome.status,
        outcome.stdout,
        outcome.stderr,
        daemon.log()
    );
    let after = daemon.wait_until_idle(ACCOUNTING_TIMEOUT);
    assert_eq!(after.get("device_memory_bytes"), 0, "{after:?}");
}

/// A channel of a guest that speaks the protocol itself.
struct RawGuest {
    carrier: Arc<dyn Carrier>,
    channel: Channel,
}

impl RawGuest {
    fn call(&self, command: Command) -> u32 {
        self.channel
            .call(&command)
            .unwrap_or_else(|e| panic!("{command:?}: {e}"))
            .result
    }

    fn alloc(&self, size: u64) -> u64 {
        let reply = self
            .channel
            .call(&Command::MemAlloc { size })
            .expect("MemAlloc");
        assert_eq!(reply.result, CUDA_SUCCESS);
        let [ptr] = decode_u64s::<1>(&reply.payload).expect("a pointer");
        ptr
    }

    fn read(&self, src: u64, len: u64) -> (u32, Vec<u8>) {
        let mut bytes = vec![0u8; len as usize];
        let result = self
            .channel
            .copy_from_device(0, &mut bytes, src)
            .expect("copy from the device");
        (result, bytes)
    }

    fn write(&self, dst: u64, bytes: &[u8]) -> u32 {
        self.channel
            .copy_to_device(0, dst, bytes, true)
            .expect("copy to the device")
    }

    /// Every copy and memset on `[forged, forged + len)`; one line per
    /// command that was not refused.
    fn not_refused(&self, what: &str, forged: u64, len: u64, own: u64) -> Vec<String> {
        let memset = |element_size: u32| Command::Memset {
            stream: 0,
            dst: forged & !u64::from(element_size - 1),
            value: 0xeeee_eeee,
            element_size,
            count: len.div_ceil(element_size.into()),
        };
        let dtod = |dst, src| Command::MemcpyDtoD {
            stream: 0,
            dst,
            src,
            size: len,
        };
        let mut results = vec![
            ("DtoH", self.read(forged, len).0),
            ("DtoD from", self.call(dtod(own, forged))),
            ("DtoD to", self.call(dtod(forged, own))),
            ("memset 1", self.call(memset(1))),
            ("memset 2", self.call(memset(2))),
            ("memset 4", self.call(memset(4))),
        ];
        // A host-to-device copy is staged in pieces: keep to one piece, or
        // a piece inside the buffer would land before the next is refused.
        if len <= 64 * 1024 {
            results.push(("HtoD", self.write(forged, &vec![0xee; len as usize])));
        }
        results
            .into_iter()
            .filter(|(_, result)| *result != CUDA_ERROR_INVALID_VALUE)
            .map(|(kind, result)| format!("{what} {forged:#x}+{len}: {kind} -> {result}"))
            .collect()
    }
}

#[test]
fn the_daemon_refuses_forged_pointers_sent_past_the_guest_library() {
    // The refusal warnings must be in the log to be counted.
    let daemon = Daemon::start_with_env("sim", &[("RGPU_LOG", "info")]);
    let carrier: Arc<dyn Carrier> =
        Arc::new(LocalCarrier::connect(daemon.socket()).expect("connect a local carrier"));
    let channel = Channel::open(carrier.clone(), "forged-raw").expect("open a channel");
    let guest = RawGuest { carrier, channel };
    let started = Instant::now();

    let buffer = guest.alloc(BUFFER_BYTES);
    let freed = guest.alloc(BUFFER_BYTES);
    let marker: Vec<u8> = (0..BUFFER_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(guest.write(buffer, &marker), CUDA_SUCCESS);
    assert_eq!(guest.write(freed, &marker), CUDA_SUCCESS);
    assert_eq!(
        guest.call(Command::MemFree { device_ptr: freed }),
        CUDA_SUCCESS
    );
    // Registered for DMA by the daemon, at an address of its own.
    let pinned = guest
        .carrier
        .create_blob(guest.channel.ctx_id(), PINNED_BYTES)
        .expect("a pinned blob");

    let mut wrong = Vec::new();
    for (what, forged, len) in [
        ("just past the end", buffer + BUFFER_BYTES, 16),
        ("straddling the end", buffer + BUFFER_BYTES - 8, 16),
        ("one byte too many", buffer, BUFFER_BYTES + 1),
        ("never handed out", buffer + 1024 * MIB, 64),
        ("freed", freed, 64),
        ("inside a freed allocation", freed + 4096, 64),
        ("null", 0, 16),
        ("wrapping around", u64::MAX - 7, 16),
    ] {
        wrong.extend(guest.not_refused(what, forged, len, buffer));
    }
    let mut probes = 0;
    for probe in (SCAN_START..SCAN_END).step_by(SCAN_STEP as usize) {
        if (buffer..buffer + BUFFER_BYTES).contains(&probe) {
            continue; // ours
        }
        probes += 1;
        let (result, _) = guest.read(probe, 64);
        if result != CUDA_ERROR_INVALID_VALUE {
            wrong.push(format!("probe {probe:#x}: DtoH -> {result}"));
        }
    }
    let elapsed = started.elapsed();
    println!("{probes} probes in {elapsed:?}");
    assert!(
        wrong.is_empty(),
        "forged pointers not refused:\n{}",
        wrong.join("\n")
    );

    // Nothing was written, and the channel works on.
    let (result, back) = guest.read(buffer, BUFFER_BYTES);
    assert_eq!(result, CUDA_SUCCESS);
    assert!(back == marker, "the marker changed");
    assert_eq!(guest.write(buffer + 100, b"after"), CUDA_SUCCESS);
    assert_eq!(
        guest.read(buffer + 100, 5),
        (CUDA_SUCCESS, b"after".to_vec())
    );
    assert_eq!(guest.call(Command::CtxSynchronize), CUDA_SUCCESS);
    guest
        .carrier
        .destroy_blob(guest.channel.ctx_id(), pinned.resource_id)
        .expect("destroy the pinned blob");
    guest.channel.close().expect("close the channel");

    // Thousands of refusals, logged at most at the limited rate, with word
    // of the rest.
    daemon.wait_for_stats(ACCOUNTING_TIMEOUT, "the guest gone", |s| {
        s.get("sessions_active") == 0
    });
    let log = daemon.log();
    let refusal_lines = log.lines().filter(|l| l.contains(REFUSAL_LOG)).count() as u64;
    let bound = LOG_LINES_PER_SECOND * (elapsed.as_secs() + 2);
    assert!(
        refusal_lines > 0 && refusal_lines <= bound,
        "{refusal_lines} refusal lines in {elapsed:?} (bound {bound})"
    );
    assert!(
        log.contains("more lines like the one above are suppressed"),
        "no word of the suppressed lines:\n{log}"
    );
}

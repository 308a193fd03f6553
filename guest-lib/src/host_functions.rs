//! Host functions (`cuLaunchHostFunc`) run in this process, in stream
//! order, without holding up the calling thread: each call gets a gate, two
//! words of page-locked memory that the host's GPU reaches by their address
//! (unified addressing). The stream is given three memory operations:
//! write `request = 1`, wait until `done == 1`, write `done = 0`. A runner
//! thread watches the armed gates; when the GPU raises a request it clears
//! it, runs the function and sets `done`, and the stream goes on. The
//! stream waits on the GPU, so nothing else of the process stalls. A call
//! on a capturing stream records the three operations in the graph; its
//! gate stays armed, and every replay runs the function.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::api::memory::alloc_page_locked;
use crate::state::Context;

/// `CUhostFn`, checked non-NULL.
pub(crate) type HostFunction = unsafe extern "C" fn(*mut c_void);

/// Bytes of one page of gates, and of one gate (its two words padded).
const PAGE_BYTES: usize = 4096;
const GATE_BYTES: usize = 16;
/// Pages of gates one context may hold (16384 gates).
const MAX_PAGES_PER_CONTEXT: usize = 64;
/// `CU_STREAM_WAIT_VALUE_EQ`.
pub(crate) const WAIT_EQUAL: u32 = 0x1;

/// One gate: where this process and the host's GPU see it.
#[derive(Debug, Clone, Copy)]
struct Gate {
    /// The `request` word; `done` follows it.
    host: usize,
    device: u64,
}

impl Gate {
    fn request(&self) -> &AtomicU32 {
        // SAFETY: `host` is a 16-byte slot of a page-locked page that is
        // never freed (`Pools` keeps its pages for the process's life); an
        // AtomicU32 may alias memory that the GPU writes too.
        unsafe { &*(self.host as *const AtomicU32) }
    }

    fn done(&self) -> &AtomicU32 {
        // SAFETY: as for `request`, four bytes further in the same slot.
        unsafe { &*((self.host + 4) as *const AtomicU32) }
    }
}

/// Free gates, by context (`Context::id`); pages are kept for the
/// process's life, so an armed gate's memory never goes away.
#[derive(Default)]
struct Pools {
    free: HashMap<u64, Vec<Gate>>,
    pages: HashMap<u64, usize>,
}

static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

/// A free gate of `ctx`, a new page of them if none is left; `None` where
/// the host's GPU cannot reach page-locked memory (the network carrier)
/// or the context has its most pages.
fn take_gate(ctx: &Arc<Context>) -> Option<Gate> {
    let mut guard = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let pools = guard.get_or_insert_with(Pools::default);
    if let Some(gate) = pools.free.get_mut(&ctx.id).and_then(Vec::pop) {
        return Some(gate);
    }
    let pages = pools.pages.entry(ctx.id).or_default();
    // No page-locked memory is the host's over the network: not even tried
    // (each try would cost a page).
    if *pages >= MAX_PAGES_PER_CONTEXT || ctx.over_network() {
        return None;
    }
    let (host, device) = match alloc_page_locked(ctx, PAGE_BYTES) {
        Ok((host, Some(device))) => (host as usize, device),
        Ok((host, None)) => {
            log::debug!("rgpu: host functions: the host's GPU cannot reach {host:p}");
            // Not kept: the next try would take another page.
            if let Err(code) = crate::api::memory::free_host(host.cast()) {
                log::debug!("rgpu: host functions: freeing {host:p} failed (error {code})");
            }
            return None;
        }
        Err(code) => {
            log::debug!("rgpu: host functions: no page of gates (error {code})");
            return None;
        }
    };
    *pages += 1;
    let free = pools.free.entry(ctx.id).or_default();
    free.extend((1..PAGE_BYTES / GATE_BYTES).map(|i| Gate {
        host: host + i * GATE_BYTES,
        device: device + (i * GATE_BYTES) as u64,
    }));
    Some(Gate { host, device })
}

fn give_back(context: u64, gate: Gate) {
    let mut guard = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pools) = guard.as_mut() {
        pools.free.entry(context).or_default().push(gate);
    }
}

/// A gate the runner watches.
struct Armed {
    gate: Gate,
    function: HostFunction,
    data: usize,
    /// A direct call's gate goes back to its context's pool once run (and
    /// the GPU reset it); a captured one stays armed.
    once: Option<u64>,
}

/// What the runner and the graph calls share.
#[derive(Default)]
struct Armory {
    armed: Vec<Armed>,
    /// Gates the runner is running now (taken from `armed` this round).
    running: Vec<usize>,
    /// Gates let go while the GPU may still reset them: given back to
    /// their context's pool once `done` is 0 again.
    retired: Vec<(u64, Gate)>,
}

struct Runner {
    armory: Mutex<Armory>,
    wake: Condvar,
}

impl Runner {
    fn armory(&self) -> std::sync::MutexGuard<'_, Armory> {
        self.armory.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn runner() -> &'static Runner {
    static RUNNER: OnceLock<&'static Runner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let runner: &'static Runner = Box::leak(Box::new(Runner {
            armory: Mutex::new(Armory::default()),
            wake: Condvar::new(),
        }));
        let started = std::thread::Builder::new()
            .name("rgpu-host-fn".into())
            .spawn(move || run(runner));
        if let Err(e) = started {
            log::error!("rgpu: the host-function thread did not start: {e}");
        }
        runner
    })
}

/// The runner thread: runs the functions whose gates the GPU raised, in
/// the order it finds them; polls while any gate is armed (briefly
/// spinning after a hit, then every 20 µs), sleeps while none is.
fn run(runner: &'static Runner) {
    // Run gates whose `done` the GPU has not reset yet.
    let mut draining: Vec<(u64, Gate)> = Vec::new();
    let mut quiet_rounds = 0u32;
    loop {
        let raised: Vec<(Gate, HostFunction, usize, Option<u64>)> = {
            let mut armory = runner.armory();
            while armory.armed.is_empty() && armory.retired.is_empty() && draining.is_empty() {
                armory = runner
                    .wake
                    .wait(armory)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            draining.append(&mut armory.retired);
            let mut raised = Vec::new();
            armory.armed.retain(|a| {
                if a.gate.request().load(Ordering::Acquire) != 1 {
                    return true;
                }
                raised.push((a.gate, a.function, a.data, a.once));
                a.once.is_none()
            });
            armory.running = raised.iter().map(|(gate, ..)| gate.host).collect();
            raised
        };
        for (gate, function, data, once) in &raised {
            gate.request().store(0, Ordering::Release);
            // SAFETY: the application's host function and argument, run
            // once per time the stream reached it, as the driver runs it.
            unsafe { function(*data as *mut c_void) };
            gate.done().store(1, Ordering::Release);
            if let Some(context) = once {
                draining.push((*context, *gate));
            }
        }
        if !raised.is_empty() {
            // A gate let go while it ran goes back once the GPU reset it.
            let mut armory = runner.armory();
            armory.running.clear();
            draining.append(&mut armory.retired);
        }
        draining.retain(|(context, gate)| {
            let reset = gate.done().load(Ordering::Acquire) == 0;
            if reset {
                give_back(*context, *gate);
            }
            !reset
        });
        if raised.is_empty() {
            quiet_rounds = quiet_rounds.saturating_add(1);
            if quiet_rounds > 64 {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::yield_now();
            }
        } else {
            quiet_rounds = 0;
        }
    }
}

/// Clears `gate` and has the runner watch it for `function(data)`; `once`
/// (the context) gives it back to its pool after one run.
fn arm(
    gate: Gate,
    function: HostFunction,
    data: *mut c_void,
    once: Option<u64>,
) -> &'static Runner {
    gate.request().store(0, Ordering::Release);
    gate.done().store(0, Ordering::Release);
    let runner = runner();
    runner.armory().armed.push(Armed {
        gate,
        function,
        data: data as usize,
        once,
    });
    runner.wake.notify_one();
    runner
}

/// Queues `function(data)` on stream `stream` of `ctx` through a gate;
/// `captured` keeps the gate armed for the graph's replays. `Ok(false)`
/// when no gate can be had (the caller falls back).
pub(crate) fn launch(
    ctx: &Arc<Context>,
    stream: u32,
    function: HostFunction,
    data: *mut c_void,
    captured: bool,
) -> Result<bool, u32> {
    let Some(gate) = take_gate(ctx) else {
        return Ok(false);
    };
    let runner = arm(gate, function, data, (!captured).then_some(ctx.id));
    let write = |address: u64, value: u64| Command::StreamWriteValue {
        stream,
        width: 4,
        address,
        value,
        flags: 0,
    };
    let done = gate.device + 4;
    let sent = ctx
        .send(&write(gate.device, 1))
        .and_then(|()| {
            ctx.send(&Command::StreamWaitValue {
                stream,
                width: 4,
                address: done,
                value: 1,
                flags: WAIT_EQUAL,
            })
        })
        .and_then(|()| ctx.send(&write(done, 0)));
    if let Err(code) = sent {
        // Nothing reached the stream (a transport failure): the gate is
        // dropped, not reused.
        runner.armory().armed.retain(|a| a.gate.host != gate.host);
        return Err(code);
    }
    Ok(true)
}

/// `CUDA_ERROR_INVALID_VALUE` for a NULL function.
pub(crate) fn checked(function: Option<HostFunction>) -> Result<HostFunction, u32> {
    function.ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// A gate's addresses, for a graph's host node: where the GPU reaches its
/// words, and where this process does (its name among armed gates).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GateAddresses {
    pub request: u64,
    pub done: u64,
    pub host: usize,
}

/// A gate of `ctx` armed for good with `function(data)` (a graph's host
/// node runs at every launch); `None` where there is no gate to be had.
pub(crate) fn arm_for_graph(
    ctx: &Arc<Context>,
    function: HostFunction,
    data: *mut c_void,
) -> Option<GateAddresses> {
    let gate = take_gate(ctx)?;
    arm(gate, function, data, None);
    Some(GateAddresses {
        request: gate.device,
        done: gate.device + 4,
        host: gate.host,
    })
}

/// The armed gate at `host` runs `function(data)` from now on.
pub(crate) fn rearm(host: usize, function: HostFunction, data: *mut c_void) {
    let runner = runner();
    let mut armory = runner.armory();
    for a in armory.armed.iter_mut().filter(|a| a.gate.host == host) {
        a.function = function;
        a.data = data as usize;
    }
}

/// Gates of `ctx` to let go once each of `streams` has passed the work
/// queued on it now (the last launch of their executable graph).
struct Retirement {
    context: u64,
    gates: Vec<usize>,
    /// Streams still to pass; the last lets the gates go.
    streams_left: AtomicU32,
}

/// A host function queued after the last launches: counts the streams
/// down and lets the gates go after the last.
unsafe extern "C" fn retire(data: *mut c_void) {
    let retirement = data.cast::<Retirement>().cast_const();
    // SAFETY: `data` is the leaked `Retirement` of `disarm_after`, alive
    // until the last stream's call below takes it back.
    let left = unsafe { &*retirement }
        .streams_left
        .fetch_sub(1, Ordering::AcqRel);
    if left == 1 {
        // SAFETY: the last of its calls: nothing else holds it now.
        let retirement = unsafe { Box::from_raw(retirement.cast_mut()) };
        for host in &retirement.gates {
            disarm(retirement.context, *host);
        }
    }
}

/// Lets go of `gates` of `ctx` (an executable graph is gone) once each of
/// `streams` has passed what is queued on it now, through a host function
/// queued on each; at once without streams. Where one cannot be queued
/// (no gate for it, a capturing stream) the gates stay armed for good.
pub(crate) fn disarm_after(ctx: &Arc<Context>, gates: Vec<usize>, streams: &[u32]) {
    if gates.is_empty() {
        return;
    }
    if streams.is_empty() {
        for host in gates {
            disarm(ctx.id, host);
        }
        return;
    }
    if streams
        .iter()
        .any(|s| crate::api::graph::capture_of(ctx, *s).is_some())
    {
        return;
    }
    let retirement = Box::into_raw(Box::new(Retirement {
        context: ctx.id,
        gates,
        streams_left: AtomicU32::new(streams.len() as u32),
    }));
    for (queued, stream) in streams.iter().enumerate() {
        match launch(ctx, *stream, retire, retirement.cast(), false) {
            Ok(true) => {}
            _ => {
                // The calls queued so far count down but never to zero:
                // the gates stay armed (leaked), which is safe.
                log::debug!("rgpu: the gates of a destroyed graph stay armed");
                if queued == 0 {
                    // SAFETY: nothing was queued with it.
                    drop(unsafe { Box::from_raw(retirement) });
                }
                return;
            }
        }
    }
}

/// Lets go of the gate at `host` of context `context` (its graph or
/// executable graph is gone): back to the pool once idle. A launch still
/// in flight may reach it, as natively (an executable graph destroyed in
/// flight finishes): one the GPU raised runs once more first.
pub(crate) fn disarm(context: u64, host: usize) {
    let runner = runner();
    let mut armory = runner.armory();
    let Some(i) = armory.armed.iter().position(|a| a.gate.host == host) else {
        return;
    };
    if armory.armed[i].gate.request().load(Ordering::Acquire) == 1 {
        armory.armed[i].once = Some(context);
        return;
    }
    let gate = armory.armed.remove(i).gate;
    let idle = !armory.running.contains(&host) && gate.done().load(Ordering::Acquire) == 0;
    if idle {
        drop(armory);
        give_back(context, gate);
    } else {
        armory.retired.push((context, gate));
        runner.wake.notify_one();
    }
}

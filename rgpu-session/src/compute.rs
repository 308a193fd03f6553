//! A tenant's share of GPU time (the sharing issue's `compute_weight`,
//! `compute_max` and `priority`), as a session sees it.
//!
//! The daemon's scheduler grants tenants the GPU ([`ComputeGate`]); a
//! session asks before each command that puts work on the GPU and tells it
//! while work it submitted may still run. It learns that with fences:
//! events it records behind its own submissions (never in the guest's
//! handle table), which [`Fences`] keeps in order.
//!
//! - When the tenant has the GPU to itself ([`Admission::Free`]) a fence is
//!   sampled (one per [`SAMPLE_EVERY`] of submissions, once no launch is
//!   left on the context's launch thread, plus one behind the last), which
//!   is enough to tell the scheduler when the tenant is busy at the cost of
//!   one event record per sample.
//! - When the scheduler arbitrates ([`Admission::Fenced`]) every submission
//!   gets a fence and at most [`FENCES_AHEAD`] may be pending, so a tenant
//!   whose turn ends drains in a few kernels, not in a queue of hundreds.
//! - The first [`PROBATION`] of a burst after the tenant was idle is fenced
//!   as if arbitrated, even when unarbitrated, if other tenants share the
//!   GPU: until the scheduler has seen the tenant, what it queues is beyond
//!   the scheduler's reach (several tenants starting at once would each
//!   queue freely). A tenant alone on its GPU pays nothing for this.
//! - When the tenant's turn has ended, the session waits for its own fences
//!   (that is its drain) and then for the next grant.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rgpu_executor::{ContextExecutor, CuResult, StreamRef};
use rgpu_proto::cuda_result::CUDA_ERROR_NOT_READY;

/// How a granted session submits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The tenant runs unarbitrated: sample fences.
    Free,
    /// The scheduler arbitrates: fence every submission, few ahead.
    Fenced,
}

/// The daemon's scheduler, as one tenant's sessions see it. Every method is
/// cheap except [`ComputeGate::wait_for_grant`].
pub trait ComputeGate: Send + Sync + std::fmt::Debug {
    /// May the tenant submit now? `None`: its turn is over (or not come).
    fn admission(&self) -> Option<Admission>;
    /// Waits (at most `timeout`) for the tenant's next grant. The caller has
    /// no work of its own pending on the GPU.
    fn wait_for_grant(&self, timeout: Duration) -> Option<Admission>;
    /// The session is about to submit (priority looks at how recently).
    /// True when the tenant had not submitted for a while and other tenants
    /// share its GPU: a burst starts that the scheduler has not seen yet
    /// and may have to arbitrate. `now`: the caller's clock reading (one
    /// per command serves all its bookkeeping).
    fn submitting(&self, now: std::time::Instant) -> bool;
    /// The session has work that may be on the GPU (`true`) or none now.
    fn set_busy(&self, busy: bool);
    /// The session waits for a grant (`true`) or no longer.
    fn set_waiting(&self, waiting: bool);
}

/// How long a burst is fenced as if arbitrated (a few of the scheduler's
/// steps).
pub const PROBATION: Duration = Duration::from_micros(600);
/// How often a fence is sampled while the tenant runs unarbitrated. A
/// sample waits until the context's launch queue is empty: one that
/// drained the queue and recorded an event on the session's thread while
/// the launch thread waited cost a few percent of a launch burst at
/// 200 µs, and about one wait of 11-14 µs per millisecond at 1 ms (the
/// launch thread's profile on the H200: 1.1-1.8% of a burst, whether the
/// session napped or spun meanwhile). A tenant alone needs no finer view:
/// it is busy while anything is unfenced, and the last fence goes in when
/// the session idles or at the next command that fences anyway.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(1);
/// How often pending fences are looked at between submissions.
const POLL_EVERY: Duration = Duration::from_micros(50);
/// Fences pending at most while the scheduler arbitrates.
pub const FENCES_AHEAD: usize = 4;
/// Fences pending at most unarbitrated (a bound on the host's memory, not
/// on the GPU's queue).
const FENCES_MAX: usize = 1024;
/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: a session that waits
/// for a fence sleeps, and a fence costs no timestamp.
const FENCE_FLAGS: u32 = 0x1 | 0x2;

/// A session's fences, oldest first.
#[derive(Debug, Default)]
pub struct Fences {
    pending: VecDeque<u64>,
    /// Recorded fences whose work completed, for reuse.
    spare: Vec<u64>,
    /// Streams with submissions behind the last fence on them.
    unfenced: Vec<StreamRef>,
    last_fence: Option<Instant>,
    last_poll: Option<Instant>,
}

impl Fences {
    /// Whether work of the session may still be on the GPU.
    pub fn busy(&self) -> bool {
        !self.pending.is_empty() || !self.unfenced.is_empty()
    }

    /// Whether fences are pending (the idle session keeps looking).
    pub fn pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Notes a submission on `stream`, fencing it as `admission` asks;
    /// `now` is when it was admitted (one clock read per command).
    pub fn submitted(
        &mut self,
        ctx: &mut dyn ContextExecutor,
        stream: StreamRef,
        admission: Admission,
        now: Instant,
    ) -> CuResult<()> {
        if !self.unfenced.contains(&stream) {
            self.unfenced.push(stream);
        }
        let due = match admission {
            Admission::Fenced => true,
            Admission::Free => {
                self.last_fence
                    .is_none_or(|t| now.saturating_duration_since(t) >= SAMPLE_EVERY)
                    && !ctx.launches_queued()
            }
        };
        if due {
            self.fence_unfenced(ctx)?;
        }
        let bound = match admission {
            Admission::Fenced => FENCES_AHEAD,
            Admission::Free => FENCES_MAX,
        };
        while self.pending.len() > bound {
            self.wait_oldest(ctx)?;
        }
        Ok(())
    }

    /// Stream `stream` is about to be destroyed: its unfenced submissions
    /// are fenced now, while it can still be named (the executor takes a
    /// stream as the driver's object, so a destroyed one must never reach
    /// it again).
    pub fn stream_ending(&mut self, ctx: &mut dyn ContextExecutor, stream: StreamRef) {
        if self.unfenced.contains(&stream) && self.fence_unfenced(ctx).is_err() {
            self.unfenced.clear();
        }
    }

    /// Fences every stream with unfenced submissions.
    fn fence_unfenced(&mut self, ctx: &mut dyn ContextExecutor) -> CuResult<()> {
        // The events go behind launches still on the launch thread.
        ctx.fence();
        for stream in std::mem::take(&mut self.unfenced) {
            let event = match self.spare.pop() {
                Some(event) => event,
                None => ctx.event_create(FENCE_FLAGS)?,
            };
            match ctx.event_record(event, stream) {
                Ok(()) => self.pending.push_back(event),
                Err(_) => self.spare.push(event),
            }
        }
        self.last_fence = Some(Instant::now());
        Ok(())
    }

    fn wait_oldest(&mut self, ctx: &mut dyn ContextExecutor) -> CuResult<()> {
        if let Some(event) = self.pending.pop_front() {
            // An error (a faulted context) also means nothing more runs.
            let result = ctx.event_synchronize(event);
            self.spare.push(event);
            result?;
        }
        Ok(())
    }

    /// Drops the fences whose work completed. `force` (the idle session):
    /// looks now, not only every `POLL_EVERY`, and fences submissions that
    /// have none once the rest completed, so [`Fences::busy`] turns false
    /// only when everything is done.
    pub fn poll(&mut self, ctx: &mut dyn ContextExecutor, force: bool, now: Instant) {
        if !force
            && self
                .last_poll
                .is_some_and(|t| now.saturating_duration_since(t) < POLL_EVERY)
        {
            return;
        }
        self.last_poll = Some(now);
        while let Some(&event) = self.pending.front() {
            if ctx.event_query(event) == Err(CUDA_ERROR_NOT_READY) {
                return;
            }
            self.pending.pop_front();
            self.spare.push(event);
        }
        // Between submissions the next sample (`submitted`) fences them:
        // a fence here too, every poll while the GPU kept up, drained the
        // launch queue that often.
        if force && !self.unfenced.is_empty() && self.fence_unfenced(ctx).is_err() {
            // No fence can be recorded (a faulted context): nothing runs.
            self.unfenced.clear();
        }
    }

    /// Waits until everything the session submitted is done.
    pub fn drain(&mut self, ctx: &mut dyn ContextExecutor) {
        if self.fence_unfenced(ctx).is_err() {
            self.unfenced.clear();
        }
        while self.pending.back().is_some() {
            let _ = self.wait_oldest(ctx);
        }
    }

    /// The whole context was synchronized: everything is done.
    pub fn all_done(&mut self) {
        self.spare.extend(self.pending.drain(..));
        self.unfenced.clear();
    }

    /// Destroys the events (before the context goes).
    pub fn destroy(&mut self, ctx: &mut dyn ContextExecutor) {
        self.all_done();
        for event in self.spare.drain(..) {
            let _ = ctx.event_destroy(event);
        }
    }
}

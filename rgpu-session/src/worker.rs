//! The session's worker thread: owns the device context (created by the
//! first command that needs it), the attached blobs, the handle tables and
//! the bound channel, and drains the channel's ring in order, following the
//! doorbell protocol of rgpu_proto::channel.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_executor::{ContextExecutor, CuResult, Executor};
use rgpu_proto::command::{ChannelLayout, ControlCommand, Decoded};
use rgpu_proto::cuda_result::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY, CUDA_SUCCESS,
};
use rgpu_proto::Command;

use crate::channel::{Channel, RingEntry};
use crate::command_profile::CommandProfile;
use crate::completions::Completions;
use crate::compute::{Admission, Fences, PROBATION};
use crate::handles::Handles;
use crate::mailbox_bell::MailboxBell;
use crate::tenant::{Tenant, Usage};
use crate::{Blob, Completion, Counters, ModuleCache};

/// Whether a command's error result is a failure: a busy stream or event,
/// and an image the module cache does not hold, are answers.
fn is_failure(command: &Command, result: &CuResult<Vec<u8>>) -> bool {
    match result {
        Ok(_) => false,
        Err(CUDA_ERROR_NOT_READY) => false,
        Err(CUDA_ERROR_NOT_FOUND) => !matches!(command, Command::ModuleLoadCached { .. }),
        Err(_) => true,
    }
}

/// Whether a command may make the driver print console output (it waits
/// for the device) even when it asks for no reply.
fn may_synchronize(command: &Command) -> bool {
    matches!(
        command,
        Command::CtxSynchronize
            | Command::StreamSynchronize { .. }
            | Command::EventSynchronize { .. }
    )
}

/// How long a session waits for its tenant's grant between looks at its
/// mailbox (a detach or a shutdown must not wait for a turn on the GPU).
const GRANT_WAIT_SLICE: Duration = Duration::from_millis(5);
/// Polls of the ring between a spinning session's other looks.
const POLLS_PER_LOOK: u32 = 16;
/// How often a spinning session looks at what the guest may query, and at
/// `produced` (commands without a stamp).
const SPIN_LOOK: Duration = Duration::from_micros(5);
/// How often an idle session with fences pending looks at them.
const IDLE_POLL: Duration = Duration::from_micros(100);

/// How long a command waits for a blob it names to be attached.
const ATTACH_WAIT: Duration = Duration::from_secs(2);
/// The longest sleep on a wake word between two looks at the ring and the
/// mailbox: a bound on a wake-up lost to a guest that stopped waking.
const WAKE_WORD_LOOK: Duration = Duration::from_secs(1);

/// The blobs a command reads or writes.
fn blobs_named(command: &Command) -> impl Iterator<Item = u32> {
    let range = match command {
        Command::MemcpyHtoD { src, .. } => Some(src),
        Command::MemcpyDtoH { dst, .. } => Some(dst),
        Command::HostDevicePointer { range } => Some(range),
        Command::ModuleLoad { image, .. } | Command::ModuleLoadHashed { image, .. } => Some(image),
        _ => None,
    };
    range.map(|r| r.resource_id).into_iter()
}

/// Commands executed between two looks at the message queue, so detach and
/// shutdown are not starved by a guest that keeps the ring full.
const COMMANDS_PER_ROUND: usize = 256;

pub enum Message {
    Attach(Arc<Blob>),
    /// The worker process could not map this blob (too many page runs):
    /// commands naming it fail with `CUDA_ERROR_OUT_OF_MEMORY` at once.
    Unmappable(u32),
    /// Detach a blob; the completion (if any) is completed once no queued
    /// GPU work of the session can touch it any more and it was let go.
    Detach(u32, Option<Box<dyn Completion>>),
    Submit {
        commands: Vec<Decoded<ControlCommand>>,
        completion: Option<Box<dyn Completion>>,
    },
    /// Look at the ring (an unfenced doorbell). At most one is queued at a
    /// time ([`crate::Session::wake`]), so a doorbell flood costs nothing.
    Wake,
    Shutdown,
}

/// A blob attached to the session (its DMA registration lives and ends with
/// the blob's mapping).
pub struct Attached {
    pub blob: Arc<Blob>,
}

/// The session's device context, created on first use.
pub(crate) enum DeviceContext {
    NotCreated,
    Ready(Box<dyn ContextExecutor>),
    /// Creation failed with this CUDA error: every command that needs the
    /// context fails with it (as a CUDA context that failed to create).
    Failed(u32),
}

impl DeviceContext {
    /// The context, created now if this is the first command needing it.
    pub(crate) fn get(
        &mut self,
        executor: &dyn Executor,
        device: u32,
        ctx_id: u32,
        usage: &Usage,
    ) -> CuResult<&mut dyn ContextExecutor> {
        if let DeviceContext::NotCreated = self {
            *self = match executor.create_context(device) {
                Ok(context) => {
                    log::debug!("ctx {ctx_id}: device context created on device {device}");
                    usage.set_has_context(true);
                    DeviceContext::Ready(context)
                }
                Err(code) => {
                    crate::warn_limited!(
                        "ctx {ctx_id}: cannot create a device context on device {device}: CUDA \
                         error {code}; every command that needs it fails with that"
                    );
                    DeviceContext::Failed(code)
                }
            };
        }
        match self {
            DeviceContext::Ready(context) => Ok(&mut **context),
            DeviceContext::Failed(code) => Err(*code),
            DeviceContext::NotCreated => Err(rgpu_proto::cuda_result::CUDA_ERROR_UNKNOWN),
        }
    }

    /// The context if one was created (nothing to wait for otherwise),
    /// every launch queued before now handed to the driver.
    fn created(&mut self) -> Option<&mut dyn ContextExecutor> {
        let context = self.created_unfenced()?;
        context.fence();
        Some(context)
    }

    /// The context if one was created, launches possibly still queued on
    /// its launch thread: for what needs no order against them (queries
    /// of events recorded earlier).
    fn created_unfenced(&mut self) -> Option<&mut dyn ContextExecutor> {
        match self {
            DeviceContext::Ready(context) => Some(&mut **context),
            _ => None,
        }
    }

    /// The first error a queued launch met since the last call.
    fn launch_failure(&mut self) -> Option<u32> {
        self.created_unfenced()?.take_launch_failure()
    }
}

pub struct Worker {
    pub(crate) ctx_id: u32,
    /// Shared with the [`crate::Session`]: whether a `Wake` is in the
    /// mailbox, and the wake word its senders ring.
    bell: Arc<MailboxBell>,
    debug_name: String,
    receiver: Receiver<Message>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) module_cache: Arc<ModuleCache>,
    spin: Duration,
    /// `RGPU_PROFILE_LAUNCHES=1`: where the time of launches and of
    /// synchronizations the guest waits for goes.
    profiles: Option<Profiles>,
    pub(crate) blobs: HashMap<u32, Attached>,
    /// Blobs the worker process could not map (see [`Message::Unmappable`]).
    unmappable: std::collections::HashSet<u32>,
    pub(crate) channel: Option<Channel>,
    /// Fenced doorbells: completed once `consumed >= until`.
    pending: Vec<(u64, Box<dyn Completion>)>,
    /// The first error of a command that asked for no reply.
    sticky: Option<u32>,
    /// `command_errors` when the last command, a `CtxSynchronize`, found
    /// the context idle without error: another synchronize answers without
    /// the driver while nothing was submitted since and the counters this
    /// session shares with the process's other contexts counted no error
    /// (the driver's idle synchronize costs more than the round trip to
    /// the worker).
    synchronized_at_errors: Option<u64>,
    /// Driver console output (device printf) not yet sent with a reply.
    console: Vec<u8>,
    /// A kernel was launched since the last synchronising command collected
    /// the console.
    kernels_since_collect: bool,
    /// The ring's next look loads `produced`: nothing ran since the last
    /// one that did, or the last entry was a `Padding` whose space is given
    /// back only once `produced` shows nothing follows it. After a command
    /// the worker looks for the next one's stamp alone (its `produced`
    /// loads missed once per command on the line the guest had just
    /// written); full looks record `produced`, which the stamp looks honour.
    look_at_produced: bool,
    pub(crate) handles: Handles,
    pub(crate) device: u32,
    pub(crate) executor: Arc<dyn Executor>,
    pub(crate) tenant: Arc<Tenant>,
    /// This session's entry in its tenant.
    pub(crate) usage: Arc<Usage>,
    /// What the session submitted that may still run (the scheduler's view).
    fences: Fences,
    /// Events and streams the guest may query, until seen complete.
    completions: Completions,
    /// Stream captures begun and not ended: while one runs, the session
    /// makes no CUDA call of its own (a fence recorded on a capturing
    /// stream would join the graph, and a query can invalidate a capture).
    captures: usize,
    /// What the tenant's scheduler was last told ([`Fences::busy`]).
    busy_reported: bool,
    /// Until then, submissions are fenced as if arbitrated (a burst the
    /// scheduler has not seen yet: [`PROBATION`]).
    probation_until: Option<Instant>,
    /// When the command being run was admitted (the scheduler's clock).
    admitted_at: Instant,
    /// Declared last: dropped after everything that refers to its objects.
    pub(crate) context: DeviceContext,
}

/// What `--profile-launches` times.
struct Profiles {
    launches: CommandProfile,
    synchronizations: CommandProfile,
}

enum Wake {
    Work,
    Message(Message),
    Idle,
}

/// What ended an idle [`Worker::sleep`].
enum Woke {
    Message(Message),
    /// The guest published commands (asleep on the wake word).
    Ring,
    Timeout,
    Disconnected,
}

/// What a round of draining the ring did.
enum Drained {
    Worked,
    Idle,
    ShutDown,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx_id: u32,
        debug_name: String,
        device: u32,
        executor: Arc<dyn Executor>,
        tenant: Arc<Tenant>,
        receiver: Receiver<Message>,
        counters: Arc<Counters>,
        bell: Arc<MailboxBell>,
    ) -> Self {
        Counters::add(&counters.sessions_active, 1);
        Counters::add(&counters.sessions_total, 1);
        let usage = tenant.join(ctx_id, rgpu_proto::process_group::guest_pid(&debug_name));
        let completions = Completions::looking_every(tenant.settings().look_every);
        Self {
            ctx_id,
            bell,
            debug_name,
            receiver,
            counters,
            module_cache: Arc::clone(&tenant.settings().module_cache),
            spin: tenant.settings().spin,
            profiles: tenant.settings().profile_launches.then(|| Profiles {
                launches: CommandProfile::new("launches"),
                synchronizations: CommandProfile::new("synchronizations"),
            }),
            blobs: HashMap::new(),
            unmappable: std::collections::HashSet::new(),
            channel: None,
            pending: Vec::new(),
            sticky: None,
            synchronized_at_errors: None,
            console: Vec::new(),
            kernels_since_collect: false,
            look_at_produced: true,
            handles: Handles::default(),
            device,
            executor,
            tenant,
            usage,
            fences: Fences::default(),
            completions,
            captures: 0,
            busy_reported: false,
            probation_until: None,
            admitted_at: Instant::now(),
            context: DeviceContext::NotCreated,
        }
    }

    /// Tells the scheduler (and the worker's gauge, which whoever reaps a
    /// killed worker gives back) whether work of this session may run.
    fn report_busy(&mut self) {
        let busy = self.fences.busy();
        if busy == self.busy_reported {
            return;
        }
        self.busy_reported = busy;
        if let Some(gate) = self.tenant.compute_gate() {
            gate.set_busy(busy);
        }
        if busy {
            Counters::add(&self.counters.gpu_busy_sessions, 1);
        } else {
            Counters::sub(&self.counters.gpu_busy_sessions, 1);
        }
    }

    /// Waits for the tenant's turn on the GPU before a command that puts
    /// work there. `Err(())`: shut down meanwhile. `Ok(None)`: no scheduler.
    fn admit(&mut self) -> Result<Option<Admission>, ()> {
        let Some(gate) = self.tenant.compute_gate().cloned() else {
            return Ok(None);
        };
        // One clock read for the whole command's bookkeeping.
        let now = Instant::now();
        self.admitted_at = now;
        if gate.submitting(now) {
            self.probation_until = Some(now + PROBATION);
        }
        if let (Some(ctx), 0) = (self.context.created_unfenced(), self.captures) {
            self.fences.poll(ctx, false, now);
        }
        self.report_busy();
        if let Some(admission) = gate.admission() {
            let on_probation = self.probation_until.is_some_and(|t| now < t);
            return Ok(Some(if on_probation {
                Admission::Fenced
            } else {
                admission
            }));
        }
        // The tenant's turn is over: what this session queued finishes
        // first (its drain), then it waits for the next turn.
        if let (Some(ctx), 0) = (self.context.created(), self.captures) {
            self.usage.begin_wait(0);
            self.fences.drain(ctx);
            self.usage.end_wait();
        }
        self.report_busy();
        gate.set_waiting(true);
        Counters::add(&self.counters.gpu_waiting_sessions, 1);
        let admitted = loop {
            if let Some(admission) = gate.wait_for_grant(GRANT_WAIT_SLICE) {
                break Ok(Some(admission));
            }
            if !self.absorb_messages() {
                break Err(());
            }
            let _ = gate.submitting(Instant::now());
        };
        gate.set_waiting(false);
        Counters::sub(&self.counters.gpu_waiting_sessions, 1);
        self.admitted_at = Instant::now();
        admitted
    }

    /// Before a `StreamDestroy`: the scheduler's fence for the stream's
    /// unfenced work is recorded while the stream still exists.
    fn stream_ending(&mut self, command: &Command) {
        let Command::StreamDestroy { stream } = command else {
            return;
        };
        if self.captures > 0 {
            return;
        }
        let Ok(stream) = self.handles.stream(*stream) else {
            return;
        };
        if let Some(ctx) = self.context.created_unfenced() {
            self.fences.stream_ending(ctx, stream);
        }
    }

    /// Notes what a command that ran put on the GPU.
    fn track(&mut self, command: &Command, admission: Option<Admission>) {
        let Some(admission) = admission else {
            return;
        };
        if self.captures > 0 {
            return;
        }
        // Fences record events behind the launches (Fences fences first).
        let Some(ctx) = self.context.created_unfenced() else {
            return;
        };
        if matches!(command, Command::CtxSynchronize) {
            self.fences.all_done();
        } else if let Some(stream) = command.work_stream() {
            if let Ok(stream) = self.handles.stream(stream) {
                if let Err(code) = self
                    .fences
                    .submitted(ctx, stream, admission, self.admitted_at)
                {
                    self.remember(code);
                }
            }
        }
        self.report_busy();
    }

    /// Idle, with work of the session possibly still on the GPU: waits for
    /// a message while looking at the fences (so the scheduler learns when
    /// the work is done) and at the events and streams the guest may query
    /// (so it can answer them itself) now and then. `None`: nothing is left
    /// to look at (or there is no context), go to sleep.
    fn idle_with_fences(&mut self) -> Option<Woke> {
        if self.captures > 0 {
            return None;
        }
        loop {
            let ctx = self.context.created()?;
            self.fences.poll(ctx, true, Instant::now());
            if let Some(channel) = &self.channel {
                self.completions
                    .look(ctx, &self.handles, channel, channel.consumed());
            }
            let fences = self.fences.pending();
            self.report_busy();
            let wait = match (fences, self.completions.watching()) {
                (false, false) => return None,
                (true, false) => IDLE_POLL,
                (_, true) => self.completions.every(),
            };
            match self.sleep(Some(wait)) {
                Woke::Timeout => {}
                woke => return Some(woke),
            }
        }
    }

    /// Sleeps until a message comes, or `timeout` passes: on the mailbox,
    /// or, where the guest wakes this thread by futex, on the channel's wake
    /// word, which the guest bumps after publishing and the mailbox's
    /// senders after posting (so the ring's work ends it too).
    fn sleep(&self, timeout: Option<Duration>) -> Woke {
        let Some((channel, word)) = self
            .channel
            .as_ref()
            .and_then(|channel| Some((channel, channel.wake_word()?)))
        else {
            let received = match timeout {
                Some(timeout) => self.receiver.recv_timeout(timeout),
                None => self
                    .receiver
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
            };
            return match received {
                Ok(message) => Woke::Message(message),
                Err(RecvTimeoutError::Timeout) => Woke::Timeout,
                Err(RecvTimeoutError::Disconnected) => Woke::Disconnected,
            };
        };
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        loop {
            // Read before looking: a publish or post after the looks below
            // moved it, and the wait returns at once.
            let seen = word.load(Ordering::SeqCst);
            // Again each time: the guest can write the flag too.
            channel.set_host_idle(true);
            match self.receiver.try_recv() {
                Ok(message) => return Woke::Message(message),
                Err(TryRecvError::Disconnected) => return Woke::Disconnected,
                Err(TryRecvError::Empty) => {}
            }
            if channel.has_work() {
                return Woke::Ring;
            }
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => WAKE_WORD_LOOK,
            };
            if left.is_zero() {
                return Woke::Timeout;
            }
            rgpu_proto::futex::wait(word, seen, left.min(WAKE_WORD_LOOK));
        }
    }

    /// Publishes the events and streams found complete, `position` being
    /// the end of the last command run. Between commands, so without a
    /// fence: draining the launch queue here, every look while launches
    /// keep coming, left the launch thread idle while this thread asked the
    /// driver. What the queue still holds keeps its stream busy
    /// (`ContextExecutor::stream_query`), and every event's record ran on
    /// this thread, after a fence.
    fn look_at_completions(&mut self, position: u64) {
        if self.captures > 0 {
            return;
        }
        if let (Some(ctx), Some(channel)) = (self.context.created_unfenced(), &self.channel) {
            self.completions.look(ctx, &self.handles, channel, position);
        }
    }

    /// Handles every message waiting in the mailbox; false means shut down.
    fn absorb_messages(&mut self) -> bool {
        loop {
            match self.receiver.try_recv() {
                Ok(message) => {
                    if !self.handle(message) {
                        return false;
                    }
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Waits (a bounded time) until every blob `command` names is attached.
    /// The guest attached it on the control queue before writing the
    /// command, but that attach reaches this thread through its worker
    /// process (which maps and registers the blob first), and the ring can
    /// be faster. False means shut down.
    fn await_blobs_of(&mut self, command: &Command) -> bool {
        let mut deadline = None;
        while let Some(missing) = blobs_named(command)
            .find(|id| !self.blobs.contains_key(id) && !self.unmappable.contains(id))
        {
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + ATTACH_WAIT);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                crate::warn_limited!(
                    "ctx {}: a command names blob {missing}, which was not attached within \
                     {ATTACH_WAIT:?}",
                    self.ctx_id
                );
                return true;
            }
            match self.receiver.recv_timeout(left) {
                Ok(message) => {
                    if !self.handle(message) {
                        return false;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
        true
    }

    pub fn run(mut self) {
        loop {
            if !self.absorb_messages() {
                break;
            }
            match self.drain_ring() {
                Drained::Worked => continue,
                Drained::Idle => {}
                Drained::ShutDown => break,
            }
            match self.spin_for_work() {
                Wake::Work => continue,
                Wake::Message(message) => {
                    if !self.handle(message) {
                        break;
                    }
                    continue;
                }
                Wake::Idle => {}
            }
            if let Some(channel) = &self.channel {
                channel.set_host_idle(true);
                // The guest may have published just before it saw the flag.
                if channel.has_work() {
                    channel.set_host_idle(false);
                    continue;
                }
            }
            let woke = match self.idle_with_fences() {
                Some(woke) => woke,
                None => self.sleep(None),
            };
            if let Some(channel) = &self.channel {
                channel.set_host_idle(false);
            }
            self.count_wakeup(&woke);
            match woke {
                Woke::Message(message) => {
                    if !self.handle(message) {
                        break;
                    }
                }
                Woke::Ring | Woke::Timeout => {}
                Woke::Disconnected => break,
            }
        }
        self.finish();
    }

    /// Counts how a sleeping session was woken to look at its ring.
    fn count_wakeup(&self, woke: &Woke) {
        let counter = match woke {
            Woke::Ring => &self.counters.wake_word_wakeups,
            Woke::Message(Message::Wake) => &self.counters.doorbell_wakeups,
            Woke::Message(Message::Submit { commands, .. })
                if commands
                    .iter()
                    .any(|c| matches!(c.command, ControlCommand::Doorbell { .. })) =>
            {
                &self.counters.doorbell_wakeups
            }
            _ => return,
        };
        Counters::add(counter, 1);
    }

    /// Handles one message; false means shut down.
    fn handle(&mut self, message: Message) -> bool {
        match message {
            Message::Attach(blob) => self.attach(blob),
            Message::Unmappable(resource_id) => {
                self.unmappable.insert(resource_id);
            }
            Message::Detach(resource_id, completion) => {
                self.detach(resource_id);
                if let Some(completion) = completion {
                    completion.complete();
                }
            }
            Message::Submit {
                commands,
                completion,
            } => self.submit(commands, completion),
            Message::Wake => self.bell.wake_queued.store(false, Ordering::Release),
            Message::Shutdown => return false,
        }
        true
    }

    fn attach(&mut self, blob: Arc<Blob>) {
        let resource_id = blob.resource_id();
        self.detach(resource_id);
        log::debug!(
            "ctx {}: attached blob {resource_id} ({} bytes, {} runs)",
            self.ctx_id,
            blob.size(),
            blob.runs().len(),
        );
        self.blobs.insert(resource_id, Attached { blob });
    }

    fn detach(&mut self, resource_id: u32) {
        self.unmappable.remove(&resource_id);
        let Some(attached) = self.blobs.remove(&resource_id) else {
            return;
        };
        if self
            .channel
            .as_ref()
            .is_some_and(|c| c.resource_id() == resource_id)
        {
            log::debug!("ctx {}: channel blob {resource_id} detached", self.ctx_id);
            self.bell.hang(None);
            self.channel = None;
            self.usage.set_reply_target(None);
            self.complete_all();
        }
        // Copies queued on the GPU may still read or write this memory.
        if let Some(Err(code)) = self.context.created().map(|c| c.synchronize()) {
            self.remember(code);
        }
        let member = self.usage.member;
        let page_locked = crate::device_ranges::RangeKind::PageLocked { resource_id };
        self.tenant
            .device_ranges_mut()
            .remove_where(|owner| owner.session == member && owner.kind == page_locked);
        drop(attached);
        log::debug!("ctx {}: detached blob {resource_id}", self.ctx_id);
    }

    fn submit(
        &mut self,
        commands: Vec<Decoded<ControlCommand>>,
        completion: Option<Box<dyn Completion>>,
    ) {
        let mut until: Option<u64> = None;
        for decoded in commands {
            match decoded.command {
                ControlCommand::BindChannel { layout } => self.bind(layout),
                ControlCommand::Doorbell { until: u } => {
                    until = Some(until.map_or(u, |v| v.max(u)));
                }
                // The device model's, which takes it out of a submission.
                ControlCommand::PlaceNextBlob { .. } => {
                    crate::warn_limited!(
                        "ctx {}: PlaceNextBlob reached the session; ignored",
                        self.ctx_id
                    );
                    Counters::add(&self.counters.command_errors, 1);
                }
            }
        }
        let Some(completion) = completion else {
            return;
        };
        match (until, &self.channel) {
            (Some(until), Some(channel)) if channel.consumed() < until => {
                self.pending.push((until, completion));
            }
            _ => completion.complete(),
        }
    }

    fn bind(&mut self, layout: ChannelLayout) {
        let Some(attached) = self.blobs.get(&layout.resource_id) else {
            crate::error_limited!(
                "ctx {}: BindChannel names blob {} which is not attached",
                self.ctx_id,
                layout.resource_id
            );
            Counters::add(&self.counters.command_errors, 1);
            return;
        };
        match Channel::bind(attached.blob.clone(), layout) {
            Ok(channel) => {
                if self.channel.is_some() {
                    crate::info_limited!("ctx {}: channel replaced", self.ctx_id);
                    // The old ring's positions mean nothing in the new one.
                    self.complete_all();
                }
                self.usage.set_reply_target(Some(channel.reply_target()));
                self.look_at_produced = true;
                log::debug!(
                    "ctx {}: channel bound in blob {} (ring {} bytes at {}, consumed {})",
                    self.ctx_id,
                    layout.resource_id,
                    layout.ring_size,
                    layout.ring_offset,
                    channel.consumed()
                );
                self.bell.hang(channel.wake_word().cloned());
                self.channel = Some(channel);
            }
            Err(e) => {
                crate::error_limited!("ctx {}: BindChannel refused: {e}", self.ctx_id);
                Counters::add(&self.counters.command_errors, 1);
            }
        }
    }

    /// Executes up to a round of commands; true if it did anything.
    fn drain_ring(&mut self) -> Drained {
        let mut worked = false;
        for _ in 0..COMMANDS_PER_ROUND {
            let Some(channel) = self.channel.as_ref() else {
                break;
            };
            if !channel.has_work_by(self.look_at_produced) {
                break;
            }
            // A blob attached on the control queue before the guest wrote a
            // command that uses it must be known before that command runs:
            // its Attach may have arrived while this ring was draining.
            if !self.absorb_messages() {
                return Drained::ShutDown;
            }
            let Some(channel) = self.channel.as_mut() else {
                break;
            };
            if !channel.has_work_by(self.look_at_produced) {
                break;
            }
            worked = true;
            let read_at = self.profiles.as_ref().map(|_| Instant::now());
            let (entry, len) = channel.read();
            match entry {
                RingEntry::Bad(reason) => {
                    crate::error_limited!(
                        "ctx {}: command ring poisoned at {}: {reason}; skipping to produced",
                        self.ctx_id,
                        channel.consumed()
                    );
                    channel.skip_to_produced();
                    self.look_at_produced = true;
                    Counters::add(&self.counters.command_errors, 1);
                    self.sticky.get_or_insert(CUDA_ERROR_INVALID_VALUE);
                }
                RingEntry::Command(Err((reply_seq, e))) => {
                    crate::warn_limited!(
                        "ctx {}: undecodable command at {} skipped: {e}",
                        self.ctx_id,
                        channel.consumed()
                    );
                    self.finish_command(reply_seq, Err(CUDA_ERROR_INVALID_VALUE), true);
                    self.advance(len);
                }
                RingEntry::Command(Ok(mut decoded)) => {
                    let admission = if decoded.command.work_stream().is_some() {
                        match self.admit() {
                            Ok(admission) => admission,
                            Err(()) => return Drained::ShutDown,
                        }
                    } else {
                        None
                    };
                    if !self.await_blobs_of(&decoded.command) {
                        return Drained::ShutDown;
                    }
                    if decoded.command != Command::Padding {
                        // The process's watchdog (if any) sees a session
                        // that waits on the GPU; launches never wait.
                        let may_wait = decoded.reply_seq != 0 || may_synchronize(&decoded.command);
                        if may_wait {
                            self.usage.begin_wait(decoded.reply_seq);
                        }
                        // Rare: the set is empty but for a refused blob.
                        let unmappable = match self.unmappable.is_empty() {
                            true => None,
                            false => blobs_named(&decoded.command)
                                .find(|id| self.unmappable.contains(id)),
                        };
                        let execute_at = read_at.map(|_| Instant::now());
                        let result = match unmappable {
                            Some(id) => {
                                crate::warn_limited!(
                                    "ctx {}: a command names blob {id}, which its worker could \
                                     not map (too many page runs): CUDA_ERROR_OUT_OF_MEMORY",
                                    self.ctx_id
                                );
                                Err(rgpu_proto::cuda_result::CUDA_ERROR_OUT_OF_MEMORY)
                            }
                            None if self.still_synchronized(&decoded.command) => Ok(Vec::new()),
                            None => {
                                self.stream_ending(&decoded.command);
                                self.execute(&mut decoded.command, decoded.reply_seq)
                            }
                        };
                        // A launch the guest waits for answers with the
                        // driver's own result.
                        let result = match decoded.command {
                            Command::LaunchKernel { .. } if decoded.reply_seq != 0 => {
                                match self.context.created().and_then(|c| c.take_launch_failure()) {
                                    Some(code) => result.and(Err(code)),
                                    None => result,
                                }
                            }
                            _ => result,
                        };
                        // An earlier launch that failed on the launch thread
                        // is reported as an unanswered command's error is.
                        if let Some(code) = self.context.launch_failure() {
                            Counters::add(&self.counters.command_errors, 1);
                            self.remember(code);
                        }
                        self.synchronized_at_errors =
                            (matches!(decoded.command, Command::CtxSynchronize)
                                && result.is_ok()
                                && self.sticky.is_none()
                                && self.captures == 0)
                                .then(|| Counters::get(&self.counters.command_errors));
                        let executed_at = execute_at.map(|_| Instant::now());
                        if may_wait {
                            self.usage.end_wait();
                        }
                        let captures = match (&decoded.command, &result) {
                            (
                                Command::StreamBeginCapture { .. }
                                | Command::StreamBeginCaptureToGraph { .. },
                                Ok(_),
                            ) => Some(self.captures + 1),
                            (Command::StreamEndCapture { .. }, _) => {
                                Some(self.captures.saturating_sub(1))
                            }
                            _ => None,
                        };
                        if let Some(captures) = captures {
                            self.captures = captures;
                            // A capture's rules (its mode) are the capturing
                            // thread's: its launches stay on the session's.
                            if let Some(ctx) = self.context.created_unfenced() {
                                ctx.launch_on_calling_thread(captures > 0);
                            }
                        }
                        // Watched during a capture too, looked at after it.
                        if result.is_ok() {
                            self.completions
                                .ran(&decoded.command, self.channel.as_ref());
                        }
                        // Before the answer: a guest that synchronized finds
                        // what completed meanwhile in the table at once.
                        if may_wait && self.completions.watching() {
                            let end = self
                                .channel
                                .as_ref()
                                .map_or(0, |c| c.consumed().saturating_add(len));
                            let all_done = result.is_ok()
                                && self.captures == 0
                                && matches!(decoded.command, Command::CtxSynchronize);
                            match (&self.channel, all_done) {
                                // The whole context is idle: no need to ask.
                                (Some(channel), true) => self.completions.all_done(channel, end),
                                _ => self.look_at_completions(end),
                            }
                        }
                        if matches!(
                            decoded.command,
                            Command::LaunchKernel { .. }
                                | Command::LaunchKernelEx { .. }
                                | Command::GraphLaunch { .. }
                        ) {
                            self.kernels_since_collect = true;
                        }
                        // Only a kernel prints: a session that launched none
                        // since it last looked pays nothing (the synchronous
                        // round trip is benchmarked).
                        if self.kernels_since_collect
                            && (decoded.reply_seq != 0 || may_synchronize(&decoded.command))
                        {
                            crate::console::collect(&mut self.console);
                            // The driver prints at synchronisation: until one
                            // ran, output of those kernels may still come.
                            if may_synchronize(&decoded.command) {
                                self.kernels_since_collect = false;
                            }
                        }
                        let failed = is_failure(&decoded.command, &result);
                        log::trace!(
                            "ctx {} seq {}: {:?} -> {}",
                            self.ctx_id,
                            decoded.reply_seq,
                            decoded.command,
                            match &result {
                                Ok(_) => CUDA_SUCCESS,
                                Err(code) => *code,
                            }
                        );
                        let succeeded = result.is_ok();
                        self.finish_command(decoded.reply_seq, result, failed);
                        // The scheduler's view after the answer: the guest
                        // may be spinning on it.
                        if succeeded {
                            let tracked = admission.or_else(|| {
                                matches!(decoded.command, Command::CtxSynchronize)
                                    .then_some(Admission::Free)
                            });
                            self.track(&decoded.command, tracked);
                        }
                        self.advance(len);
                        // The scheduler's clock read serves when there was one.
                        let due = self.completions.watching()
                            && self.completions.due(match admission {
                                Some(_) => self.admitted_at,
                                None => Instant::now(),
                            });
                        if due {
                            let position = self.channel.as_ref().map_or(0, Channel::consumed);
                            self.look_at_completions(position);
                        }
                        if let (
                            Some(profiles),
                            Some(read_at),
                            Some(execute_at),
                            Some(executed_at),
                        ) = (self.profiles.as_mut(), read_at, execute_at, executed_at)
                        {
                            let profile = match decoded.command {
                                Command::LaunchKernel { .. } => Some(&mut profiles.launches),
                                Command::CtxSynchronize if decoded.reply_seq != 0 => {
                                    Some(&mut profiles.synchronizations)
                                }
                                _ => None,
                            };
                            if let Some(profile) = profile {
                                profile.add(read_at, execute_at, executed_at, Instant::now());
                            }
                        }
                    } else {
                        // A Padding body may carry the data of the command
                        // after it: that space stays the host's until the
                        // command has run.
                        self.advance_unpublished(len);
                    }
                }
            }
        }
        // A trailing Padding is published by a look at `produced`
        // (Channel::produced), one with a command behind it with that
        // command: a guest whose doorbell completes must find its space
        // given back, even when the round ended right after it.
        if let (true, false, Some(channel)) = (
            self.look_at_produced,
            self.pending.is_empty(),
            &self.channel,
        ) {
            channel.has_work();
        }
        self.complete_reached();
        if worked {
            Drained::Worked
        } else {
            Drained::Idle
        }
    }

    fn advance_unpublished(&mut self, len: u64) {
        self.look_at_produced = true;
        if let Some(channel) = self.channel.as_mut() {
            channel.advance_unpublished(len);
        }
    }

    fn advance(&mut self, len: u64) {
        self.look_at_produced = false;
        if let Some(channel) = self.channel.as_mut() {
            channel.advance(len);
        }
    }

    /// Answers a command if it asked for a reply, then accounts its result
    /// (the guest may be spinning on the answer).
    fn finish_command(&mut self, reply_seq: u64, result: CuResult<Vec<u8>>, failed: bool) {
        let mut copied = 0;
        match (reply_seq, &self.channel) {
            (0, _) => {
                if let (true, Err(code)) = (failed, &result) {
                    self.remember(*code);
                }
            }
            (_, None) => {}
            (_, Some(channel)) => {
                // An earlier unanswered command's error goes with the next
                // success; a failure answers with its own.
                let (code, payload) = match &result {
                    Err(code) => (*code, &[][..]),
                    Ok(payload) => match self.sticky.take() {
                        Some(code) => (code, &[][..]),
                        None => (CUDA_SUCCESS, payload.as_slice()),
                    },
                };
                copied =
                    channel.write_reply_with_console(reply_seq, code, payload, &mut self.console);
            }
        }
        Counters::add(&self.counters.commands_executed, 1);
        if failed {
            Counters::add(&self.counters.command_errors, 1);
        }
        if copied > 0 {
            Counters::add(&self.counters.host_cpu_copy_bytes, copied as u64);
        }
    }

    /// Whether `command` is a `CtxSynchronize` the last one answers: it
    /// found the context idle, nothing ran since, and no command of the
    /// process's contexts failed since (the driver may keep such an error
    /// for the process's next synchronize).
    fn still_synchronized(&self, command: &Command) -> bool {
        matches!(command, Command::CtxSynchronize)
            && self.synchronized_at_errors == Some(Counters::get(&self.counters.command_errors))
    }

    /// Keeps the first asynchronous error for the next reply.
    fn remember(&mut self, code: u32) {
        self.sticky.get_or_insert(code);
    }

    /// Spins a bounded time for new ring entries or messages, looking at
    /// the events and streams the guest may query meanwhile (a guest that
    /// spins on a query sees the answer as soon as the GPU is done).
    fn spin_for_work(&mut self) -> Wake {
        let Some(channel) = &self.channel else {
            return Wake::Idle;
        };
        let mut now = Instant::now();
        let deadline = now + self.spin;
        let mut last_look: Option<Instant> = None;
        // The first only a look's time in: a guest that calls in a loop
        // writes `produced` just then.
        let mut last_produced_look = now;
        while now < deadline {
            // The ring is polled in batches between the clock, completion
            // and mailbox looks, which would slow each poll; the polls look
            // for the next command's stamp alone, `produced` is loaded at
            // the looks (for writers that stamp nothing).
            for _ in 0..POLLS_PER_LOOK {
                if channel.has_work_by(self.look_at_produced) {
                    return Wake::Work;
                }
                std::hint::spin_loop();
            }
            if now.saturating_duration_since(last_produced_look) >= SPIN_LOOK {
                if channel.has_work() {
                    return Wake::Work;
                }
                last_produced_look = now;
            }
            if self.completions.watching()
                && self.captures == 0
                && last_look.is_none_or(|t| now.saturating_duration_since(t) >= SPIN_LOOK)
            {
                if let Some(ctx) = self.context.created() {
                    self.completions
                        .look(ctx, &self.handles, channel, channel.consumed());
                }
                last_look = Some(now);
            }
            match self.receiver.try_recv() {
                Ok(message) => return Wake::Message(message),
                Err(TryRecvError::Disconnected) => return Wake::Message(Message::Shutdown),
                Err(TryRecvError::Empty) => {}
            }
            now = Instant::now();
        }
        Wake::Idle
    }

    /// Completes the doorbells the host has caught up with.
    fn complete_reached(&mut self) {
        let consumed = match &self.channel {
            Some(channel) => channel.consumed(),
            None => return self.complete_all(),
        };
        let mut i = 0;
        while i < self.pending.len() {
            if self
                .pending
                .get(i)
                .is_some_and(|(until, _)| *until <= consumed)
            {
                let (_, completion) = self.pending.swap_remove(i);
                completion.complete();
            } else {
                i += 1;
            }
        }
    }

    fn complete_all(&mut self) {
        for (_, completion) in self.pending.drain(..) {
            completion.complete();
        }
    }

    /// Frees everything of the session; the device context goes last.
    fn finish(mut self) {
        if let Some(profiles) = &self.profiles {
            for summary in [&profiles.launches, &profiles.synchronizations]
                .into_iter()
                .filter_map(CommandProfile::summary)
            {
                log::info!("ctx {}: profile: {summary}", self.ctx_id);
            }
        }
        self.complete_all();
        // Nothing may still be reading or writing guest memory we release.
        if let Some(ctx) = self.context.created() {
            if let Err(code) = ctx.synchronize() {
                log::debug!("ctx {}: synchronize at shutdown: {code}", self.ctx_id);
            }
            self.fences.destroy(ctx);
        }
        self.report_busy();
        self.bell.hang(None);
        self.channel = None;
        self.usage.set_reply_target(None);
        self.blobs.clear();
        // What the session shared or held goes from the tenant's ledger
        // first (importers elsewhere keep its exports charged).
        let ledger = self.tenant.ledger();
        let member = self.usage.member;
        for (handle, keys) in &self.handles.physical_shares {
            let imported = self
                .handles
                .physical
                .get(handle)
                .is_some_and(|p| p.imported);
            for key in keys {
                if imported {
                    ledger.let_go(member, key, self.tenant.budget());
                } else {
                    ledger.unshare(member, key, self.tenant.budget());
                }
            }
        }
        for mapping in self.handles.ipc_mappings.values() {
            ledger.let_go(member, &mapping.key, self.tenant.budget());
        }
        for key in self.handles.ipc_shared.values() {
            ledger.unshare(member, key, self.tenant.budget());
        }
        Counters::sub(
            &self.counters.device_memory_bytes,
            self.handles.allocated_bytes(),
        );
        if let Some(budget) = self.tenant.budget() {
            budget.release(self.handles.allocated_bytes());
        }
        log::debug!(
            "ctx {} ({}): worker done, {} allocations freed with the context",
            self.ctx_id,
            self.debug_name,
            self.handles.allocations.len()
        );
        let Self {
            handles,
            context,
            counters,
            tenant,
            usage,
            executor,
            ..
        } = self;
        // Forgotten before the context frees them: another context of the
        // process may get the addresses back at once. What the session
        // exported through CUDA IPC goes with them (its opened mappings
        // close with its context).
        let ipc = tenant.ipc();
        ipc.withdraw_where(crate::IpcKind::Memory, |ptr| {
            handles.allocations.contains_key(&ptr)
        });
        let events = crate::ipc::event_key(usage.member, 0);
        ipc.withdraw_where(crate::IpcKind::Event, |key| key & !0xffff_ffff == events);
        let physical = crate::shareable::physical_key(usage.member, 0);
        tenant
            .shareable()
            .withdraw_where(|key| key & !0xffff_ffff == physical);
        tenant
            .device_ranges_mut()
            .remove_where(|owner| owner.session == usage.member);
        drop(handles);
        drop(context);
        if let (Some(budget), Some(_), true) = (tenant.budget(), usage.pid(), usage.has_context()) {
            budget.context_closed();
        }
        tenant.leave(&usage);
        // What the driver gave back with the context goes back too.
        let _ = tenant.account_driver_memory(
            crate::driver_memory::Refresh::Settle,
            &*executor,
            &counters,
        );
        Counters::sub(&counters.sessions_active, 1);
    }
}

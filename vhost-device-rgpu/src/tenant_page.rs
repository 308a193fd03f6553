//! A tenant's memory budget and its turn on the GPU, shared by every
//! process that serves it: the parent (which sets the limit, live, and
//! whose scheduler grants turns), its connection processes and their
//! workers (which take device memory against the budget and submit when
//! granted). Pages of a memfd that the parent creates per tenant and its
//! children inherit, holding atomics only, so every process sees the same
//! numbers without a round trip; waits are futexes on the shared page.
//!
//! The tenant's CUDA IPC registry lives here too ([`IpcRegistry`]): the
//! handles its workers exported, which only its own workers see, so a
//! worker opens a handle only if a process of the same tenant exported it.
//! Each entry is a slot of fixed size claimed by its worker's pid and
//! published under a sequence number (a reader that raced a change looks
//! again or skips the slot: it never matches a half-written handle).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rgpu_proto::futex;
use rgpu_proto::reply::SessionUsage;
use rgpu_session::ipc::{IpcHandle, IPC_HANDLE_BYTES, MAX_IPC_EXPORTS};
use rgpu_session::{Admission, ComputeGate, IpcKind, IpcRegistry, MemoryBudget};

use crate::shared_page::{self, SharedLayout, SharedPage};

/// No limit.
pub const UNLIMITED: u64 = u64::MAX;

/// A tenant that has not submitted for this long starts a new burst when
/// it does (the scheduler's HOLD: it no longer counts as present).
const BURST_GAP_NS: u64 = 3_000_000;
/// How stale the last submission's mark may get before a submission renews
/// it (far below [`BURST_GAP_NS`] and the scheduler's windows).
const SUBMIT_MARK_NS: u64 = 100_000;

/// Processes of a tenant listed for NVML at most (as many as one
/// `DeviceStatus` reply holds).
pub const MAX_LISTED_PROCESSES: usize = rgpu_proto::reply::MAX_STATUS_SESSIONS;

/// The tenant must wait for its turn.
pub const GRANT_WAIT: u32 = 0;
/// Its turn, while the scheduler arbitrates: every submission fenced.
pub const GRANT_FENCED: u32 = 1;
/// The GPU is the tenant's without arbitration.
pub const GRANT_FREE: u32 = 2;

/// The shared layout: all zeroes is "no use, must wait", so the parent
/// stores the limit and the first grant before any child starts.
#[repr(C)]
struct Layout {
    limit_bytes: AtomicU64,
    used_bytes: AtomicU64,
    /// One of the `GRANT_` values; a futex the tenant's sessions wait on.
    grant: AtomicU32,
    /// Sessions whose work may be on the GPU; a futex the scheduler waits
    /// on while the tenant drains.
    busy_sessions: AtomicU32,
    waiting_sessions: AtomicU32,
    /// 1 while another tenant on the same GPU holds a context (the
    /// scheduler's note): a burst of this one may have to be arbitrated.
    neighbours: AtomicU32,
    /// When a session last asked to submit ([`monotonic_ns`]).
    last_submit_ns: AtomicU64,
    /// Since when `busy_sessions` is above zero.
    busy_since_ns: AtomicU64,
    /// GPU time of the tenant's finished busy periods.
    busy_ns: AtomicU64,
    /// The tenant's worker processes that named their guest process, with
    /// what each holds: NVML's process lists in the guest.
    processes: [ProcessSlot; MAX_LISTED_PROCESSES],
    /// The CUDA IPC handles the tenant's processes exported.
    ipc: [IpcSlot; MAX_IPC_EXPORTS],
}

/// Words of an IPC handle.
const IPC_HANDLE_WORDS: usize = IPC_HANDLE_BYTES / 8;

/// One exported IPC handle. `owner` claims the slot (a compare-and-swap
/// from 0); the owner alone writes it, between two increments of
/// `sequence` (odd while it writes), and `kind` non-zero publishes it. A
/// withdrawal moves `sequence` from what its reader saw to odd (a
/// compare-and-swap: one withdrawer wins, and only if nothing changed
/// since), unpublishes, moves it on to even and frees the slot.
#[repr(C)]
struct IpcSlot {
    /// The worker process that exported it (host pid); 0: a free slot.
    owner: AtomicU32,
    /// That worker's connection process (its parent), which may end
    /// without its workers being reaped one by one.
    connection: AtomicU32,
    /// An [`IpcKind::code`]; 0: not published.
    kind: AtomicU32,
    _reserved: AtomicU32,
    sequence: AtomicU64,
    /// What the owner exported, in its own terms (an allocation's start, an
    /// event's key): what its free or destroy names.
    key: AtomicU64,
    handle: [AtomicU64; IPC_HANDLE_WORDS],
}

fn handle_words(handle: &IpcHandle) -> [u64; IPC_HANDLE_WORDS] {
    let mut words = [0u64; IPC_HANDLE_WORDS];
    for (word, bytes) in words.iter_mut().zip(handle.chunks_exact(8)) {
        let mut le = [0u8; 8];
        le.copy_from_slice(bytes);
        *word = u64::from_le_bytes(le);
    }
    words
}

/// What an [`IpcSlot`] published, as one reader saw it.
struct Published {
    /// The slot's sequence when read: a withdrawal changes nothing unless
    /// it is still this.
    sequence: u64,
    kind: u32,
    key: u64,
    words: [u64; IPC_HANDLE_WORDS],
}

impl IpcSlot {
    /// What the slot publishes now, or `None` when it publishes nothing or
    /// changed under the reader.
    fn read(&self) -> Option<Published> {
        for _ in 0..4 {
            let sequence = self.sequence.load(Ordering::Acquire);
            if sequence & 1 == 1 {
                // Being written (or withdrawn): not published.
                return None;
            }
            let kind = self.kind.load(Ordering::Relaxed);
            if kind == 0 {
                return None;
            }
            let key = self.key.load(Ordering::Relaxed);
            let mut words = [0u64; IPC_HANDLE_WORDS];
            for (word, shared) in words.iter_mut().zip(&self.handle) {
                *word = shared.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) == sequence {
                return Some(Published {
                    sequence,
                    kind,
                    key,
                    words,
                });
            }
        }
        // Changing all along: withdrawn or rewritten meanwhile, so what it
        // held is no longer there.
        None
    }

    /// Withdraws what `seen` read, unless the slot changed since (another
    /// withdrawal won, or the slot holds another export now).
    fn withdraw(&self, seen: &Published) -> bool {
        let odd = seen.sequence.wrapping_add(1);
        if self
            .sequence
            .compare_exchange(seen.sequence, odd, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.kind.store(0, Ordering::Relaxed);
        self.sequence.store(odd.wrapping_add(1), Ordering::Release);
        self.connection.store(0, Ordering::Relaxed);
        self.owner.store(0, Ordering::Release);
        true
    }

    /// Clears the slot of a process that ended, whatever state it left it
    /// in (half-written included).
    fn clear(&self) {
        let odd = match self
            .sequence
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| Some(s | 1))
        {
            Ok(before) | Err(before) => before | 1,
        };
        self.kind.store(0, Ordering::Relaxed);
        self.sequence.store(odd.wrapping_add(1), Ordering::Release);
        self.connection.store(0, Ordering::Relaxed);
        self.owner.store(0, Ordering::Release);
    }
}

/// One worker process's line in the tenant's process list.
#[repr(C)]
struct ProcessSlot {
    /// The worker's host pid; 0: a free slot.
    owner: AtomicU32,
    guest_pid: AtomicU32,
    device_memory: AtomicU64,
    /// Device contexts the process holds: it is listed while it has one.
    contexts: AtomicU32,
    _reserved: AtomicU32,
}

// SAFETY: `#[repr(C)]`, atomics only, valid all zero.
unsafe impl SharedLayout for Layout {}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the struct we pass; the monotonic clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

/// What the scheduler reads of a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeUse {
    /// GPU time so far, the current busy period included.
    pub busy_ns: u64,
    pub busy_sessions: u32,
    pub waiting_sessions: u32,
    pub last_submit_ns: u64,
}

/// A mapping of a tenant's page, and its descriptor, for the processes
/// this one starts.
pub struct TenantPage {
    budget: SharedPage<Layout>,
    fd: OwnedFd,
    /// What this process took from the budget and holds now.
    taken_here: AtomicU64,
    /// This process's slot in the process list, once named.
    slot: std::sync::OnceLock<usize>,
    /// One moment on both clocks (the same monotonic clock underneath):
    /// a caller's `Instant` converts to the page's nanoseconds without a
    /// second clock read.
    epoch: (std::time::Instant, u64),
}

impl std::fmt::Debug for TenantPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantPage")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .finish()
    }
}

impl TenantPage {
    /// A new page with `limit` bytes (or [`UNLIMITED`]). Its descriptor
    /// ([`TenantPage::fd`]) is close-on-exec: a child's spawner makes it
    /// inheritable.
    pub fn create(limit: u64) -> io::Result<TenantPage> {
        let fd = shared_page::create(c"rgpu-tenant", SharedPage::<Layout>::BYTES)?;
        let budget = SharedPage::map(&fd)?;
        let page = TenantPage::new(budget, fd);
        page.set_limit(limit);
        page.set_grant(GRANT_FREE);
        Ok(page)
    }

    /// Maps the page a parent passed as descriptor `fd` (which it keeps,
    /// close-on-exec from now on, for its own children).
    pub fn inherit(fd: RawFd) -> io::Result<TenantPage> {
        let fd = shared_page::adopt(fd, "a tenant page", SharedPage::<Layout>::BYTES)?;
        // SAFETY: plain call on our descriptor.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
            return Err(io::Error::last_os_error());
        }
        let budget = SharedPage::map(&fd)?;
        Ok(TenantPage::new(budget, fd))
    }

    fn new(budget: SharedPage<Layout>, fd: OwnedFd) -> TenantPage {
        TenantPage {
            budget,
            fd,
            taken_here: AtomicU64::new(0),
            slot: std::sync::OnceLock::new(),
            epoch: (std::time::Instant::now(), monotonic_ns()),
        }
    }

    /// `at` in the page's nanoseconds ([`monotonic_ns`]).
    fn page_ns(&self, at: std::time::Instant) -> u64 {
        let (instant, ns) = self.epoch;
        let since = at.saturating_duration_since(instant).as_nanos();
        ns.saturating_add(u64::try_from(since).unwrap_or(u64::MAX))
    }

    /// This process took (`more`) or gave back bytes: its line in the
    /// process list follows.
    fn taken_here(&self, more: bool, bytes: u64) {
        let update = |held: u64| {
            Some(if more {
                held.saturating_add(bytes)
            } else {
                held.saturating_sub(bytes)
            })
        };
        let held = match self
            .taken_here
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, update)
        {
            Ok(before) | Err(before) => update(before).unwrap_or(before),
        };
        if let Some(slot) = self.own_slot() {
            slot.device_memory.store(held, Ordering::Release);
        }
    }

    /// This process's line in the process list, once it has one.
    fn own_slot(&self) -> Option<&ProcessSlot> {
        self.slot
            .get()
            .and_then(|i| self.layout().processes.get(*i))
    }

    /// Worker process `owner` ended: its line goes, and so do the IPC
    /// handles it exported (its memory and events are gone with it).
    pub fn forget_process(&self, owner: u32) {
        if owner == 0 {
            return;
        }
        for slot in &self.layout().processes {
            if slot.owner.load(Ordering::Acquire) == owner {
                slot.guest_pid.store(0, Ordering::Relaxed);
                slot.device_memory.store(0, Ordering::Relaxed);
                slot.contexts.store(0, Ordering::Relaxed);
                slot.owner.store(0, Ordering::Release);
            }
        }
        for slot in &self.layout().ipc {
            if slot.owner.load(Ordering::Acquire) == owner {
                slot.clear();
            }
        }
    }

    /// Connection process `connection` ended (its workers die with it,
    /// whether or not it reaped them): the IPC handles they exported go.
    pub fn forget_connection(&self, connection: u32) {
        if connection == 0 {
            return;
        }
        for slot in &self.layout().ipc {
            if slot.owner.load(Ordering::Acquire) != 0
                && slot.connection.load(Ordering::Acquire) == connection
            {
                slot.clear();
            }
        }
    }

    /// IPC handles exported now, all processes of the tenant together.
    pub fn ipc_exports(&self) -> usize {
        self.layout()
            .ipc
            .iter()
            .filter(|slot| slot.read().is_some())
            .count()
    }

    /// The page's descriptor, to pass to a child.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn layout(&self) -> &Layout {
        self.budget.get()
    }

    pub fn set_limit(&self, bytes: u64) {
        self.layout().limit_bytes.store(bytes, Ordering::Release);
    }

    /// The limit in bytes ([`UNLIMITED`]: none).
    pub fn limit(&self) -> u64 {
        self.layout().limit_bytes.load(Ordering::Acquire)
    }

    pub fn used(&self) -> u64 {
        self.layout().used_bytes.load(Ordering::Acquire)
    }

    /// The scheduler's decision (a `GRANT_` value); wakes the tenant's
    /// waiting sessions when it lets them run.
    pub fn set_grant(&self, grant: u32) {
        let word = &self.layout().grant;
        let before = word.swap(grant, Ordering::AcqRel);
        if before == GRANT_WAIT && grant != GRANT_WAIT {
            futex::wake(word);
        }
    }

    /// The scheduler notes whether another tenant on this one's GPU holds
    /// a context.
    pub fn set_neighbours(&self, present: bool) {
        self.layout()
            .neighbours
            .store(u32::from(present), Ordering::Relaxed);
    }

    pub fn grant(&self) -> u32 {
        self.layout().grant.load(Ordering::Acquire)
    }

    pub fn compute_use(&self) -> ComputeUse {
        let b = self.layout();
        let busy_sessions = b.busy_sessions.load(Ordering::Acquire);
        let mut busy_ns = b.busy_ns.load(Ordering::Acquire);
        if busy_sessions > 0 {
            let since = b.busy_since_ns.load(Ordering::Acquire);
            busy_ns = busy_ns.saturating_add(monotonic_ns().saturating_sub(since));
        }
        ComputeUse {
            busy_ns,
            busy_sessions,
            waiting_sessions: b.waiting_sessions.load(Ordering::Acquire),
            last_submit_ns: b.last_submit_ns.load(Ordering::Relaxed),
        }
    }

    /// Waits (at most `timeout`) while the tenant's sessions are busy (the
    /// scheduler, while the tenant drains).
    pub fn wait_until_idle(&self, timeout: Duration) {
        let word = &self.layout().busy_sessions;
        let busy = word.load(Ordering::Acquire);
        if busy != 0 {
            futex::wait(word, busy, timeout);
        }
    }

    /// `sessions` busy sessions are no longer (ended, or of a killed
    /// worker).
    pub fn end_busy(&self, sessions: u32) {
        if sessions == 0 {
            return;
        }
        let b = self.layout();
        let Ok(before) = b
            .busy_sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(sessions))
            })
        else {
            return;
        };
        if before != 0 && before <= sessions {
            let since = b.busy_since_ns.load(Ordering::Acquire);
            b.busy_ns
                .fetch_add(monotonic_ns().saturating_sub(since), Ordering::AcqRel);
            // Only a tenant told to wait is being drained (and waited for).
            if b.grant.load(Ordering::Acquire) == GRANT_WAIT {
                futex::wake(&b.busy_sessions);
            }
        }
    }

    /// `sessions` waiting sessions are no longer.
    pub fn end_waiting(&self, sessions: u32) {
        let _ =
            self.layout()
                .waiting_sessions
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    Some(n.saturating_sub(sessions))
                });
    }
}

impl IpcRegistry for TenantPage {
    fn export(&self, kind: IpcKind, key: u64, handle: &IpcHandle) -> bool {
        let (me, code, words) = (std::process::id(), kind.code(), handle_words(handle));
        let slots = &self.layout().ipc;
        let known = slots.iter().any(|slot| {
            slot.owner.load(Ordering::Acquire) == me
                && slot
                    .read()
                    .is_some_and(|p| p.kind == code && p.words == words)
        });
        if known {
            return true;
        }
        let Some(slot) = slots.iter().find(|slot| {
            slot.owner
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        }) else {
            return false;
        };
        // Odd while written (a seqlock's writer: the increment is ordered
        // before the stores by the release fence). A freed slot's sequence
        // is even.
        slot.sequence.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        slot.connection
            .store(u32::try_from(parent).unwrap_or(0), Ordering::Relaxed);
        slot.key.store(key, Ordering::Relaxed);
        for (shared, word) in slot.handle.iter().zip(words) {
            shared.store(word, Ordering::Relaxed);
        }
        slot.kind.store(code, Ordering::Relaxed);
        slot.sequence.fetch_add(1, Ordering::Release);
        true
    }

    fn is_exported(&self, kind: IpcKind, handle: &IpcHandle) -> bool {
        let (code, words) = (kind.code(), handle_words(handle));
        self.layout().ipc.iter().any(|slot| {
            slot.read()
                .is_some_and(|p| p.kind == code && p.words == words)
        })
    }

    fn withdraw(&self, kind: IpcKind, gone: &dyn Fn(u64) -> bool) -> usize {
        let (me, code) = (std::process::id(), kind.code());
        self.layout()
            .ipc
            .iter()
            .filter(|slot| {
                slot.owner.load(Ordering::Acquire) == me
                    && slot
                        .read()
                        .filter(|p| p.kind == code && gone(p.key))
                        .is_some_and(|p| slot.withdraw(&p))
            })
            .count()
    }
}

fn admission_of(grant: u32) -> Option<Admission> {
    match grant {
        GRANT_FENCED => Some(Admission::Fenced),
        GRANT_FREE => Some(Admission::Free),
        _ => None,
    }
}

impl ComputeGate for TenantPage {
    fn admission(&self) -> Option<Admission> {
        admission_of(self.grant())
    }

    fn wait_for_grant(&self, timeout: Duration) -> Option<Admission> {
        let word = &self.layout().grant;
        let grant = word.load(Ordering::Acquire);
        if grant == GRANT_WAIT {
            futex::wait(word, GRANT_WAIT, timeout);
            return admission_of(word.load(Ordering::Acquire));
        }
        admission_of(grant)
    }

    fn submitting(&self, at: std::time::Instant) -> bool {
        let page = self.layout();
        let now = self.page_ns(at);
        // Marked moments ago: no gap. Not writing the shared word on every
        // command keeps its cache line out of each launch's path.
        if now.saturating_sub(page.last_submit_ns.load(Ordering::Relaxed)) < SUBMIT_MARK_NS {
            return false;
        }
        let before = page.last_submit_ns.swap(now, Ordering::Relaxed);
        now.saturating_sub(before) > BURST_GAP_NS && page.neighbours.load(Ordering::Relaxed) != 0
    }

    fn set_busy(&self, busy: bool) {
        let b = self.layout();
        if busy {
            if b.busy_sessions.fetch_add(1, Ordering::AcqRel) == 0 {
                b.busy_since_ns.store(monotonic_ns(), Ordering::Release);
            }
        } else {
            self.end_busy(1);
        }
    }

    fn set_waiting(&self, waiting: bool) {
        if waiting {
            self.layout()
                .waiting_sessions
                .fetch_add(1, Ordering::AcqRel);
        } else {
            self.end_waiting(1);
        }
    }
}

impl MemoryBudget for TenantPage {
    fn try_reserve(&self, bytes: u64) -> bool {
        let limit = self.limit();
        self.layout()
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok_and(|_| {
                self.taken_here(true, bytes);
                true
            })
    }

    fn charge(&self, bytes: u64) {
        let _ =
            self.layout()
                .used_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    Some(used.saturating_add(bytes))
                });
        self.taken_here(true, bytes);
    }

    fn release(&self, bytes: u64) {
        let _ =
            self.layout()
                .used_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    Some(used.saturating_sub(bytes))
                });
        self.taken_here(false, bytes);
    }

    fn limit(&self) -> Option<u64> {
        Some(TenantPage::limit(self)).filter(|l| *l != UNLIMITED)
    }

    fn used(&self) -> u64 {
        TenantPage::used(self)
    }

    fn context_opened(&self, guest_pid: u32) {
        let slots = &self.layout().processes;
        if self.slot.get().is_none() {
            let owner = std::process::id();
            let free = slots.iter().position(|slot| {
                slot.owner
                    .compare_exchange(0, owner, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
            match free {
                Some(i) => {
                    // Another session of this process may have claimed one
                    // meanwhile: one line per process, the other goes back.
                    if *self.slot.get_or_init(|| i) != i {
                        if let Some(slot) = slots.get(i) {
                            slot.owner.store(0, Ordering::Release);
                        }
                    }
                }
                None => {
                    log::debug!(
                        "tenant page: the process list is full; guest process {guest_pid} is not listed"
                    );
                }
            }
        }
        if let Some(slot) = self.own_slot() {
            slot.guest_pid.store(guest_pid, Ordering::Release);
            slot.device_memory
                .store(self.taken_here.load(Ordering::Acquire), Ordering::Release);
            slot.contexts.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn context_closed(&self) {
        if let Some(slot) = self.own_slot() {
            let _ = slot
                .contexts
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    fn processes(&self) -> Option<Vec<SessionUsage>> {
        Some(
            self.layout()
                .processes
                .iter()
                .filter(|slot| {
                    slot.owner.load(Ordering::Acquire) != 0
                        && slot.contexts.load(Ordering::Acquire) != 0
                })
                .map(|slot| SessionUsage {
                    ctx_id: 0,
                    pid: slot.guest_pid.load(Ordering::Acquire),
                    device_memory: slot.device_memory.load(Ordering::Acquire),
                })
                .filter(|p| p.pid != 0)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapping_shares_one_budget() {
        let parent = TenantPage::create(100).expect("a page");
        // SAFETY: dup of its descriptor, owned by the child mapping.
        let dup = unsafe { libc::dup(parent.fd()) };
        let child = TenantPage::inherit(dup).expect("the child's mapping");
        assert!(child.try_reserve(60));
        assert!(!child.try_reserve(41), "past the limit");
        assert!(parent.try_reserve(40));
        assert_eq!(MemoryBudget::used(&parent), 100);
        child.release(60);
        assert_eq!(MemoryBudget::used(&parent), 40);
        // Lowering the limit below use refuses new memory, takes none away.
        parent.set_limit(10);
        assert!(!child.try_reserve(1));
        assert_eq!(MemoryBudget::used(&child), 40);
        assert_eq!(MemoryBudget::limit(&child), Some(10));
        parent.set_limit(UNLIMITED);
        assert_eq!(MemoryBudget::limit(&child), None);
        assert!(child.try_reserve(u64::MAX - 40));
        assert!(!child.try_reserve(1), "no overflow");
    }

    fn ipc_handle(n: u64) -> IpcHandle {
        let mut handle = [0xa5u8; IPC_HANDLE_BYTES];
        handle[8..16].copy_from_slice(&n.to_le_bytes());
        handle
    }

    #[test]
    fn an_ipc_export_is_seen_by_every_mapping_until_withdrawn() {
        let parent = TenantPage::create(UNLIMITED).expect("a page");
        // SAFETY: dup of its descriptor, owned by the child mapping.
        let child = TenantPage::inherit(unsafe { libc::dup(parent.fd()) }).expect("mapping");
        let (h, other) = (ipc_handle(1), ipc_handle(2));
        assert!(!parent.is_exported(IpcKind::Memory, &h));
        assert!(child.export(IpcKind::Memory, 0x7000, &h));
        assert!(
            child.export(IpcKind::Memory, 0x7000, &h),
            "again: no second slot"
        );
        assert_eq!(parent.ipc_exports(), 1);
        assert!(parent.is_exported(IpcKind::Memory, &h));
        assert!(!parent.is_exported(IpcKind::Event, &h), "not as an event");
        assert!(!parent.is_exported(IpcKind::Memory, &other));
        let mut flipped = h;
        flipped[63] ^= 0x80;
        assert!(!parent.is_exported(IpcKind::Memory, &flipped));
        assert_eq!(parent.withdraw(IpcKind::Memory, &|key| key == 0x8000), 0);
        assert_eq!(parent.withdraw(IpcKind::Event, &|key| key == 0x7000), 0);
        assert_eq!(parent.withdraw(IpcKind::Memory, &|key| key == 0x7000), 1);
        assert!(!child.is_exported(IpcKind::Memory, &h));
        assert_eq!(parent.ipc_exports(), 0);
    }

    #[test]
    fn a_reaped_worker_or_connection_takes_its_ipc_exports_along() {
        let page = TenantPage::create(UNLIMITED).expect("a page");
        assert!(page.export(IpcKind::Memory, 1, &ipc_handle(1)));
        assert!(page.export(IpcKind::Event, 2, &ipc_handle(2)));
        page.forget_process(std::process::id() + 1);
        page.forget_connection(std::process::id());
        assert_eq!(page.ipc_exports(), 2, "another process's end");
        page.forget_process(std::process::id());
        assert_eq!(page.ipc_exports(), 0);
        assert!(page.export(IpcKind::Memory, 1, &ipc_handle(1)));
        // SAFETY: getppid has no preconditions.
        let parent = u32::try_from(unsafe { libc::getppid() }).expect("a pid");
        page.forget_connection(parent);
        assert!(!page.is_exported(IpcKind::Memory, &ipc_handle(1)));
        // A slot left half-written by a killed worker is freed too.
        let slot = &page.layout().ipc[0];
        slot.owner.store(4242, Ordering::Release);
        slot.sequence.fetch_add(1, Ordering::AcqRel);
        page.forget_process(4242);
        assert_eq!(slot.owner.load(Ordering::Acquire), 0);
        assert_eq!(slot.sequence.load(Ordering::Acquire) & 1, 0);
        assert!(page.export(IpcKind::Memory, 3, &ipc_handle(3)));
        assert!(page.is_exported(IpcKind::Memory, &ipc_handle(3)));
    }

    #[test]
    fn the_ipc_registry_is_bounded() {
        let page = TenantPage::create(UNLIMITED).expect("a page");
        for n in 0..MAX_IPC_EXPORTS as u64 {
            assert!(page.export(IpcKind::Memory, n, &ipc_handle(n)));
        }
        let past = MAX_IPC_EXPORTS as u64;
        assert!(
            !page.export(IpcKind::Memory, past, &ipc_handle(past)),
            "full"
        );
        assert!(page.export(IpcKind::Memory, 0, &ipc_handle(0)), "known");
        assert_eq!(page.withdraw(IpcKind::Memory, &|key| key == 5), 1);
        assert!(page.export(IpcKind::Memory, past, &ipc_handle(past)));
        assert!(!page.is_exported(IpcKind::Memory, &ipc_handle(5)));
        assert!(page.is_exported(IpcKind::Memory, &ipc_handle(past)));
    }

    /// Exports and withdrawals in one mapping while another looks: a
    /// handle is seen whole or not at all, and one never exported is
    /// never seen.
    #[test]
    fn concurrent_exports_never_show_a_torn_handle() {
        let page = std::sync::Arc::new(TenantPage::create(UNLIMITED).expect("a page"));
        let writer = {
            let page = std::sync::Arc::clone(&page);
            std::thread::spawn(move || {
                for round in 0..2000u64 {
                    let n = round % 16;
                    assert!(page.export(IpcKind::Memory, n, &ipc_handle(n)));
                    if round % 3 == 0 {
                        page.withdraw(IpcKind::Memory, &|key| key == n);
                    }
                }
            })
        };
        let mut seen = 0;
        while !writer.is_finished() {
            for slot in &page.layout().ipc[..32] {
                if let Some(p) = slot.read() {
                    let n = p.key;
                    assert_eq!(p.words, handle_words(&ipc_handle(n)), "torn");
                    seen += 1;
                }
            }
            assert!(!page.is_exported(IpcKind::Memory, &ipc_handle(99)));
        }
        writer.join().expect("writer");
        assert!(seen > 0 || page.ipc_exports() > 0);
    }

    #[test]
    fn a_grant_wakes_a_waiting_session_of_another_mapping() {
        let parent = TenantPage::create(UNLIMITED).expect("a page");
        // SAFETY: dup of its descriptor, owned by the child mapping.
        let child = TenantPage::inherit(unsafe { libc::dup(parent.fd()) }).expect("mapping");
        assert_eq!(
            child.admission(),
            Some(Admission::Free),
            "a new tenant runs"
        );
        parent.set_grant(GRANT_WAIT);
        assert_eq!(child.admission(), None);
        assert_eq!(child.wait_for_grant(Duration::from_millis(1)), None);
        let waiter = std::thread::spawn(move || {
            child.set_waiting(true);
            let admitted = child.wait_for_grant(Duration::from_secs(10));
            child.set_waiting(false);
            admitted
        });
        while parent.compute_use().waiting_sessions == 0 {
            std::thread::yield_now();
        }
        parent.set_grant(GRANT_FENCED);
        assert_eq!(waiter.join().expect("waiter"), Some(Admission::Fenced));
        assert_eq!(parent.compute_use().waiting_sessions, 0);
    }

    #[test]
    fn a_burst_after_idle_starts_fenced_only_beside_other_tenants() {
        let page = TenantPage::create(UNLIMITED).expect("a page");
        assert!(
            !page.submitting(std::time::Instant::now()),
            "alone on its GPU: never"
        );
        page.set_neighbours(true);
        assert!(
            !page.submitting(std::time::Instant::now()),
            "it submitted a moment ago"
        );
        page.layout().last_submit_ns.store(0, Ordering::Relaxed);
        assert!(
            page.submitting(std::time::Instant::now()),
            "idle, beside others: a new burst"
        );
        assert!(
            !page.submitting(std::time::Instant::now()),
            "the burst goes on"
        );
    }

    #[test]
    fn busy_time_spans_from_the_first_busy_session_to_the_last() {
        let page = TenantPage::create(UNLIMITED).expect("a page");
        assert_eq!(page.compute_use().busy_ns, 0);
        page.set_busy(true);
        page.set_busy(true);
        std::thread::sleep(Duration::from_millis(20));
        page.set_busy(false);
        let live = page.compute_use();
        assert_eq!(live.busy_sessions, 1);
        assert!(live.busy_ns >= 20_000_000, "{live:?}");
        // A killed worker's busy sessions end with it (more than there are
        // is no underflow).
        page.end_busy(5);
        let done = page.compute_use();
        assert_eq!(done.busy_sessions, 0);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            page.compute_use().busy_ns,
            done.busy_ns,
            "idle time is not busy"
        );
        page.wait_until_idle(Duration::from_secs(10));
    }
}

//! A tenant: the sessions of one guest process (its worker process), so
//! that NVML's `DeviceStatus` can list what this guest runs on the GPU and
//! nothing of the other tenants.
//!
//! A session knows its guest process id from its context's debug name; the
//! tenant-wide process list lives in the daemon's tenant page (through
//! [`MemoryBudget::processes`]), this one's session list answers where there
//! is no such page.
//!
//! A tenant also holds what its sessions share: the device ranges they may
//! name ([`DeviceRanges`]: with unified addressing, every context of a
//! process may use every allocation of that process), the limits each
//! session runs under, and its side of the CUDA IPC registry
//! ([`crate::ipc`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use rgpu_proto::reply::{SessionUsage, MAX_STATUS_SESSIONS};

use crate::budget::MemoryBudget;
use crate::channel::ReplyTarget;
use crate::compute::ComputeGate;
use crate::device_ranges::DeviceRanges;
use crate::driver_memory::{DriverMemory, Refresh};
use crate::ipc::{IpcExports, IpcRegistry};
use crate::limits::SessionLimits;
use crate::shareable::{ShareableExports, ShareableRegistry};
use crate::shared_ledger::{LocalShareLedger, ShareLedger};

/// What one session of a tenant uses, updated by its worker.
#[derive(Debug)]
pub(crate) struct Usage {
    /// Unique among the tenant's sessions, ever: owns device ranges.
    pub(crate) member: u64,
    ctx_id: u32,
    /// The guest process id its debug name carries.
    pid: Option<u32>,
    device_memory: AtomicU64,
    has_context: AtomicBool,
    /// Odd while the session waits for the GPU, a new value for each wait
    /// (only the session writes it): the watchdog ([`WaitWatch`]) times a
    /// mark it keeps seeing, so waiting costs no clock read.
    wait_mark: AtomicU64,
    /// The reply the guest waits for meanwhile (0: none).
    waiting_reply: AtomicU64,
    /// Where that reply goes (the bound channel's reply area).
    reply_target: Mutex<Option<ReplyTarget>>,
}

impl Usage {
    pub(crate) fn add_device_memory(&self, bytes: u64) {
        self.device_memory.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn sub_device_memory(&self, bytes: u64) {
        // Saturating, as the daemon's gauges: a slip must not wrap.
        let _ = self
            .device_memory
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
    }

    /// The guest process id its debug name carries.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub(crate) fn has_context(&self) -> bool {
        self.has_context.load(Ordering::Relaxed)
    }

    pub(crate) fn set_has_context(&self, has: bool) {
        self.has_context.store(has, Ordering::Relaxed);
    }

    /// The session starts a command that may wait for the GPU; the guest
    /// waits for reply `reply_seq` (0: none).
    pub(crate) fn begin_wait(&self, reply_seq: u64) {
        self.waiting_reply.store(reply_seq, Ordering::Relaxed);
        let mark = self.wait_mark.load(Ordering::Relaxed);
        self.wait_mark
            .store((mark | 1).wrapping_add(2), Ordering::Release);
    }

    pub(crate) fn end_wait(&self) {
        let mark = self.wait_mark.load(Ordering::Relaxed);
        if mark & 1 == 1 {
            self.wait_mark
                .store(mark.wrapping_add(1), Ordering::Release);
        }
    }

    pub(crate) fn set_reply_target(&self, target: Option<ReplyTarget>) {
        *self.reply_target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }
}

/// The sessions of one guest. [`crate::Session::spawn`] gives each session a
/// tenant of its own; the device model groups the sessions of one guest with
/// [`crate::Session::spawn_in_tenant`].
#[derive(Debug, Default)]
pub struct Tenant {
    sessions: Mutex<Vec<Arc<Usage>>>,
    next_member: AtomicU64,
    /// Read by every copy and memset of every session; written by
    /// allocations, frees, global lookups and unloads.
    device_ranges: RwLock<DeviceRanges>,
    limits: SessionLimits,
    /// The device memory its sessions may take, shared with the tenant's
    /// other processes; `None`: unlimited.
    budget: Option<Arc<dyn MemoryBudget>>,
    /// The scheduler's grants for the tenant; `None`: unscheduled.
    compute: Option<Arc<dyn ComputeGate>>,
    /// What the driver holds for this process beyond its allocations,
    /// charged to `budget`.
    driver_memory: DriverMemory,
    /// The CUDA IPC handles the tenant's processes exported (a registry of
    /// this process alone unless one is given), and this process's share.
    ipc: IpcExports,
    /// The shareable handles the tenant's processes exported (a registry of
    /// this process alone unless one is given), and this process's share.
    shareable: ShareableExports,
    /// The memory the tenant's processes share, charged once (the daemon's
    /// broker; `None`: `local_ledger`, of this process alone).
    ledger: Option<Arc<dyn ShareLedger>>,
    local_ledger: LocalShareLedger,
    /// How its sessions run (the daemon's command line).
    settings: crate::SessionSettings,
}

/// A session the watchdog found waiting too long.
pub struct Overdue {
    pub ctx_id: u32,
    /// The reply its guest waits for (0: none).
    pub reply_seq: u64,
    pub reply_target: Option<ReplyTarget>,
}

impl Overdue {
    /// Answers the waiting guest with `code` (a launch timeout).
    pub fn answer(&self, code: u32) {
        if let (Some(target), true) = (&self.reply_target, self.reply_seq != 0) {
            target.write_error(self.reply_seq, code);
        }
    }
}

/// What the watchdog saw of each session's wait at its last look: the wait
/// mark and when it first saw it.
#[derive(Debug, Default)]
pub struct WaitWatch {
    since: std::collections::HashMap<u32, (u64, Instant)>,
}

impl Tenant {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A tenant whose sessions run under `limits` instead of the defaults.
    pub fn with_limits(limits: SessionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            ..Self::default()
        })
    }

    /// A tenant whose sessions take device memory from `budget`.
    pub fn with_budget(budget: Arc<dyn MemoryBudget>) -> Arc<Self> {
        Arc::new(Self {
            budget: Some(budget),
            ..Self::default()
        })
    }

    /// A tenant whose sessions take device memory from `budget` (if any)
    /// and GPU time as `compute` grants it (if any), record and check
    /// CUDA IPC handles in `ipc` and shareable handles in `shareable` (if
    /// any; else registries of this process alone), keep what its
    /// processes share in `ledger` (if any; else a ledger of this process
    /// alone), and run as `settings` say.
    pub fn with_shares(
        budget: Option<Arc<dyn MemoryBudget>>,
        compute: Option<Arc<dyn ComputeGate>>,
        ipc: Option<Arc<dyn IpcRegistry>>,
        shareable: Option<Arc<dyn ShareableRegistry>>,
        ledger: Option<Arc<dyn ShareLedger>>,
        settings: crate::SessionSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            budget,
            compute,
            ipc: ipc.map(IpcExports::new).unwrap_or_default(),
            shareable: shareable.map(ShareableExports::new).unwrap_or_default(),
            ledger,
            settings,
            ..Self::default()
        })
    }

    /// The ledger of what the tenant's processes share.
    pub(crate) fn ledger(&self) -> &dyn ShareLedger {
        match &self.ledger {
            Some(ledger) => ledger.as_ref(),
            None => &self.local_ledger,
        }
    }

    pub(crate) fn ipc(&self) -> &IpcExports {
        &self.ipc
    }

    pub(crate) fn shareable(&self) -> &ShareableExports {
        &self.shareable
    }

    /// A tenant whose sessions run as `settings` say.
    pub fn with_settings(settings: crate::SessionSettings) -> Arc<Self> {
        Arc::new(Self {
            settings,
            ..Self::default()
        })
    }

    pub(crate) fn settings(&self) -> &crate::SessionSettings {
        &self.settings
    }

    pub(crate) fn compute_gate(&self) -> Option<&Arc<dyn ComputeGate>> {
        self.compute.as_ref()
    }

    pub fn budget(&self) -> Option<&dyn MemoryBudget> {
        self.budget.as_deref()
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Device ranges (allocations and module globals) the tenant's
    /// sessions may name right now.
    pub fn device_range_count(&self) -> usize {
        self.device_ranges().len()
    }

    pub(crate) fn device_ranges(&self) -> RwLockReadGuard<'_, DeviceRanges> {
        // A panic while holding the lock cannot leave the map half-changed
        // (BTreeMap operations complete or unwind before changing it).
        self.device_ranges.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn device_ranges_mut(&self) -> RwLockWriteGuard<'_, DeviceRanges> {
        self.device_ranges
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Usage>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions alive in this tenant, with or without a device context.
    pub fn session_count(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn join(&self, ctx_id: u32, pid: Option<u32>) -> Arc<Usage> {
        let usage = Arc::new(Usage {
            member: self.next_member.fetch_add(1, Ordering::Relaxed),
            ctx_id,
            pid,
            device_memory: AtomicU64::new(0),
            has_context: AtomicBool::new(false),
            wait_mark: AtomicU64::new(0),
            waiting_reply: AtomicU64::new(0),
            reply_target: Mutex::new(None),
        });
        self.lock().push(usage.clone());
        usage
    }

    pub(crate) fn leave(&self, usage: &Arc<Usage>) {
        self.lock().retain(|u| !Arc::ptr_eq(u, usage));
    }

    /// A session that has waited for the GPU longer than `limit` (a kernel
    /// that overran the watchdog): its context, the reply its guest waits
    /// for, and where that reply goes. `watch` remembers, between calls,
    /// since when each session has been in the wait it is in.
    pub fn overdue(&self, limit: Duration, watch: &mut WaitWatch) -> Option<Overdue> {
        let now = Instant::now();
        let sessions = self.lock();
        watch
            .since
            .retain(|ctx_id, _| sessions.iter().any(|u| u.ctx_id == *ctx_id));
        sessions.iter().find_map(|u| {
            let mark = u.wait_mark.load(Ordering::Acquire);
            if mark & 1 == 0 {
                watch.since.remove(&u.ctx_id);
                return None;
            }
            let since = match watch.since.get(&u.ctx_id) {
                Some(&(seen, since)) if seen == mark => since,
                _ => {
                    watch.since.insert(u.ctx_id, (mark, now));
                    now
                }
            };
            (now.saturating_duration_since(since) > limit).then(|| Overdue {
                ctx_id: u.ctx_id,
                reply_seq: u.waiting_reply.load(Ordering::Relaxed),
                reply_target: u
                    .reply_target
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            })
        })
    }

    /// Follows the driver's figure for this process ([`DriverMemory`]);
    /// a tenant without a budget charges nothing.
    pub(crate) fn account_driver_memory(
        &self,
        how: Refresh,
        executor: &dyn rgpu_executor::Executor,
        counters: &crate::Counters,
    ) -> rgpu_executor::CuResult<()> {
        let Some(budget) = self.budget() else {
            return Ok(());
        };
        self.driver_memory
            .refresh(how, executor, budget, counters, || {
                self.lock().iter().fold(0u64, |sum, u| {
                    sum.saturating_add(u.device_memory.load(Ordering::Relaxed))
                })
            })
    }

    /// Takes `bytes` for an allocation from the budget (if any). The
    /// driver's overhead is charged as last seen: before refusing, it is
    /// looked at again (what it held then may be gone, an allocation's
    /// rounding with its allocation).
    pub(crate) fn reserve_memory(
        &self,
        bytes: u64,
        executor: &dyn rgpu_executor::Executor,
        counters: &crate::Counters,
    ) -> bool {
        let Some(budget) = self.budget() else {
            return true;
        };
        budget.try_reserve(bytes)
            || (self.driver_overhead() > 0
                && self
                    .account_driver_memory(Refresh::Settle, executor, counters)
                    .is_ok()
                && budget.try_reserve(bytes))
    }

    /// Device memory the driver holds for this process beyond its
    /// allocations, as charged now.
    pub fn driver_overhead(&self) -> u64 {
        self.driver_memory.charged()
    }

    /// The sessions that hold a device context, in the order they started.
    pub(crate) fn active_sessions(&self) -> Vec<SessionUsage> {
        self.lock()
            .iter()
            .filter(|u| u.has_context.load(Ordering::Relaxed))
            .take(MAX_STATUS_SESSIONS)
            .map(|u| SessionUsage {
                ctx_id: u.ctx_id,
                pid: u.pid.unwrap_or(0),
                device_memory: u.device_memory.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_times_one_wait_from_when_it_first_sees_it() {
        let tenant = Tenant::new();
        let usage = tenant.join(5, None);
        let mut watch = WaitWatch::default();
        let limit = Duration::from_millis(30);
        // Not waiting: never overdue.
        assert!(tenant.overdue(limit, &mut watch).is_none());
        std::thread::sleep(limit * 2);
        assert!(tenant.overdue(limit, &mut watch).is_none());
        // One wait, first seen now: overdue once it outlasts the limit.
        usage.begin_wait(9);
        assert!(tenant.overdue(limit, &mut watch).is_none());
        std::thread::sleep(limit * 2);
        let overdue = tenant.overdue(limit, &mut watch).expect("overdue");
        assert_eq!((overdue.ctx_id, overdue.reply_seq), (5, 9));
        // Another wait is timed afresh, though the one before ran long.
        usage.end_wait();
        usage.begin_wait(10);
        assert!(tenant.overdue(limit, &mut watch).is_none());
        // A wait that ended is not overdue, however long ago it began.
        std::thread::sleep(limit * 2);
        usage.end_wait();
        assert!(tenant.overdue(limit, &mut watch).is_none());
        // A session that left is forgotten.
        usage.begin_wait(11);
        assert!(tenant.overdue(limit, &mut watch).is_none());
        tenant.leave(&usage);
        assert!(tenant.overdue(limit, &mut watch).is_none());
        assert!(watch.since.is_empty());
    }

    #[test]
    fn lists_sessions_with_a_context_until_they_leave() {
        let tenant = Tenant::new();
        let one = tenant.join(1, None);
        let two = tenant.join(2, Some(77));
        assert_eq!(tenant.session_count(), 2);
        assert!(tenant.active_sessions().is_empty());
        two.set_has_context(true);
        two.add_device_memory(6000);
        two.sub_device_memory(1904);
        one.sub_device_memory(1);
        assert_eq!(
            tenant.active_sessions(),
            vec![SessionUsage {
                ctx_id: 2,
                pid: 77,
                device_memory: 4096
            }]
        );
        tenant.leave(&two);
        tenant.leave(&two);
        assert!(tenant.active_sessions().is_empty());
        assert_eq!(tenant.session_count(), 1);
        tenant.leave(&one);
        assert_eq!(tenant.session_count(), 0);
    }
}

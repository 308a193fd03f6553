//! The connection's counters as the daemon's parent reads them: what the
//! connection process counts itself, plus what each live worker counts into
//! a page of its own, plus the totals of workers that ended. A worker that
//! is killed never takes back its gauges (sessions, device memory); its
//! page simply stops being summed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rgpu_session::{CounterKind, Counters, MemoryBudget};

use crate::shared_counters::SharedCounters;
use crate::tenant_page::TenantPage;

/// How often the sum is refreshed while workers run (and at once whenever
/// one starts or ends).
const REFRESH: Duration = Duration::from_millis(10);

#[derive(Default)]
struct State {
    live: HashMap<u64, SharedCounters>,
    retired: Counters,
}

pub struct Accounting {
    /// Where the parent reads.
    published: Arc<Counters>,
    /// The tenant's page: the memory a killed worker held goes back, and
    /// its sessions stop counting as busy or waiting for the GPU.
    tenant: Option<Arc<TenantPage>>,
    /// What this process counts (connections).
    own: Arc<Counters>,
    state: Mutex<State>,
}

impl Accounting {
    /// Publishes into `published`; starts the refresher thread.
    pub fn start(
        published: Arc<Counters>,
        tenant: Option<Arc<TenantPage>>,
    ) -> std::io::Result<Arc<Accounting>> {
        let accounting = Arc::new(Accounting {
            published,
            tenant,
            own: Arc::new(Counters::default()),
            state: Mutex::default(),
        });
        let weak = Arc::downgrade(&accounting);
        std::thread::Builder::new()
            .name("rgpu-accounting".into())
            .spawn(move || {
                while let Some(accounting) = weak.upgrade() {
                    accounting.publish();
                    drop(accounting);
                    std::thread::sleep(REFRESH);
                }
            })?;
        Ok(accounting)
    }

    /// An accounting that only sums (tests: no thread, no parent).
    pub fn private() -> Arc<Accounting> {
        Arc::new(Accounting {
            published: Arc::new(Counters::default()),
            tenant: None,
            own: Arc::new(Counters::default()),
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What this process counts into.
    pub fn own(&self) -> &Arc<Counters> {
        &self.own
    }

    /// The sum, as published.
    pub fn published(&self) -> &Arc<Counters> {
        &self.published
    }

    /// Worker `id` counts into `page` from now on.
    pub fn add_worker(&self, id: u64, page: SharedCounters) {
        Counters::add(&self.own.workers_active, 1);
        Counters::add(&self.own.workers_total, 1);
        self.lock().live.insert(id, page);
        self.publish();
    }

    /// Worker `id` (process `pid`) ended: its totals stay, its gauges go,
    /// and so does its line in the tenant's process list. A worker that was
    /// never added (a standby nobody took) counted nothing.
    pub fn end_worker(&self, id: u64, pid: u32) {
        if let Some(tenant) = &self.tenant {
            tenant.forget_process(pid);
        }
        {
            let mut state = self.lock();
            let Some(page) = state.live.remove(&id) else {
                return;
            };
            state.retired.add_from(page.page(), &[CounterKind::Total]);
            // Device memory a worker still counted when it ended was never
            // given back (it was killed): its end frees it, and none of
            // its sessions runs or waits any more.
            if let Some(tenant) = &self.tenant {
                let counted = page.page();
                tenant.release(Counters::get(&counted.device_memory_bytes));
                let sessions = |gauge| u32::try_from(Counters::get(gauge)).unwrap_or(u32::MAX);
                tenant.end_busy(sessions(&counted.gpu_busy_sessions));
                tenant.end_waiting(sessions(&counted.gpu_waiting_sessions));
            }
        }
        Counters::sub(&self.own.workers_active, 1);
        self.publish();
    }

    /// Recomputes the published sum.
    pub fn publish(&self) {
        let state = self.lock();
        let mut parts = vec![&**self.own, &*state.retired];
        parts.extend(state.live.values().map(SharedCounters::page));
        self.published.store_sum(&parts);
    }
}

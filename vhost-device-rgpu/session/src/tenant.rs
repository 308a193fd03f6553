//! A tenant: the sessions of one guest (a VM, or one local process), so that
//! NVML's `DeviceStatus` can list what this guest runs on the GPU and
//! nothing of the other tenants.
//!
//! The host knows no guest process ids: it lists sessions (context id and
//! device memory held), and the guest library maps them onto its processes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rgpu_proto::reply::{SessionUsage, MAX_STATUS_SESSIONS};

/// What one session of a tenant uses, updated by its worker.
#[derive(Debug)]
pub(crate) struct Usage {
    ctx_id: u32,
    device_memory: AtomicU64,
    has_context: AtomicBool,
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

    pub(crate) fn set_has_context(&self, has: bool) {
        self.has_context.store(has, Ordering::Relaxed);
    }
}

/// The sessions of one guest. [`crate::Session::spawn`] gives each session a
/// tenant of its own; the device model groups the sessions of one guest with
/// [`crate::Session::spawn_in_tenant`].
#[derive(Debug, Default)]
pub struct Tenant {
    sessions: Mutex<Vec<Arc<Usage>>>,
}

impl Tenant {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Usage>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions alive in this tenant, with or without a device context.
    pub fn session_count(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn join(&self, ctx_id: u32) -> Arc<Usage> {
        let usage = Arc::new(Usage {
            ctx_id,
            device_memory: AtomicU64::new(0),
            has_context: AtomicBool::new(false),
        });
        self.lock().push(usage.clone());
        usage
    }

    pub(crate) fn leave(&self, usage: &Arc<Usage>) {
        self.lock().retain(|u| !Arc::ptr_eq(u, usage));
    }

    /// The sessions that hold a device context, in the order they started.
    pub(crate) fn active_sessions(&self) -> Vec<SessionUsage> {
        self.lock()
            .iter()
            .filter(|u| u.has_context.load(Ordering::Relaxed))
            .take(MAX_STATUS_SESSIONS)
            .map(|u| SessionUsage {
                ctx_id: u.ctx_id,
                device_memory: u.device_memory.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_sessions_with_a_context_until_they_leave() {
        let tenant = Tenant::new();
        let one = tenant.join(1);
        let two = tenant.join(2);
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

//! CUDA IPC within a tenant (issue 10): the memory and event handles the
//! tenant's processes exported, so that another process of the same tenant
//! may open them, and nothing else may.
//!
//! The handles are the host driver's own (`cuIpcGetMemHandle` in the
//! exporting process's worker, `cuIpcOpenMemHandle` in the opening one's);
//! they travel through the guests, which may change them at will. So the
//! daemon keeps, per tenant, a registry of the handles its processes
//! exported ([`IpcRegistry`]; the daemon's lives in the tenant page, shared
//! by every worker of the tenant and of no other), and a session opens a
//! handle only if it is there, byte for byte: a handle of another tenant,
//! one that was never exported (forged, guessed, altered) or one whose
//! memory or event is gone fails with `CUDA_ERROR_INVALID_HANDLE` before
//! the driver sees it. NVIDIA documents that code for `cuIpcOpenMemHandle`
//! and `cuIpcOpenEventHandle` (CUDA 4.2 to 13.0), and it names what is
//! wrong: the handle, not the call's shape (`CUDA_ERROR_INVALID_VALUE`).
//!
//! An export is withdrawn when its allocation is freed or its event
//! destroyed, when its session ends, and by whoever reaps its worker
//! process (the registry's owner is the worker's pid).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_OUT_OF_MEMORY};

pub use rgpu_proto::command::{IpcHandle, IPC_HANDLE_BYTES};

/// Handles one tenant's registry holds at most (memory and events of all
/// its processes together); past it `cuIpcGetMemHandle` and
/// `cuIpcGetEventHandle` fail with `CUDA_ERROR_OUT_OF_MEMORY` (the driver
/// documents that code for both).
pub const MAX_IPC_EXPORTS: usize = 4096;

/// What an IPC handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpcKind {
    Memory,
    Event,
}

impl IpcKind {
    /// Its number in a shared registry (never 0: a free slot).
    pub fn code(self) -> u32 {
        match self {
            IpcKind::Memory => 1,
            IpcKind::Event => 2,
        }
    }
}

/// The handles a tenant's processes exported. Each entry belongs to the
/// process that recorded it (for the daemon's registry, a worker process)
/// and names the object exported by a key of that process: an
/// allocation's start address, or [`event_key`].
pub trait IpcRegistry: Send + Sync + std::fmt::Debug {
    /// This process exported `handle`, of its object `key`: records it.
    /// False, and nothing recorded, when the registry is full. Recording
    /// what this process recorded already changes nothing.
    fn export(&self, kind: IpcKind, key: u64, handle: &IpcHandle) -> bool;
    /// Whether a process of the tenant exported `handle` (byte for byte, as
    /// `kind`) and has not withdrawn it.
    fn is_exported(&self, kind: IpcKind, handle: &IpcHandle) -> bool;
    /// Withdraws this process's exports of `kind` whose key `gone`
    /// accepts; how many went.
    fn withdraw(&self, kind: IpcKind, gone: &dyn Fn(u64) -> bool) -> usize;
}

/// The key of guest event `event` of the session numbered `member` in its
/// process: unique in the process while the event lives.
pub fn event_key(member: u64, event: u32) -> u64 {
    member << 32 | u64::from(event)
}

/// A registry of one process only, bounded as the daemon's: a tenant
/// without a shared one (a session's own tests, a daemon's in-process
/// tests) lets its sessions open what they themselves exported.
#[derive(Debug, Default)]
pub struct LocalIpcRegistry {
    entries: Mutex<Vec<(IpcKind, u64, IpcHandle)>>,
}

impl LocalIpcRegistry {
    fn lock(&self) -> MutexGuard<'_, Vec<(IpcKind, u64, IpcHandle)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl IpcRegistry for LocalIpcRegistry {
    fn export(&self, kind: IpcKind, key: u64, handle: &IpcHandle) -> bool {
        let mut entries = self.lock();
        if entries.iter().any(|(k, _, h)| *k == kind && h == handle) {
            return true;
        }
        if entries.len() >= MAX_IPC_EXPORTS {
            return false;
        }
        entries.push((kind, key, *handle));
        true
    }

    fn is_exported(&self, kind: IpcKind, handle: &IpcHandle) -> bool {
        self.lock()
            .iter()
            .any(|(k, _, h)| *k == kind && h == handle)
    }

    fn withdraw(&self, kind: IpcKind, gone: &dyn Fn(u64) -> bool) -> usize {
        let mut entries = self.lock();
        let before = entries.len();
        entries.retain(|(k, key, _)| !(*k == kind && gone(*key)));
        before - entries.len()
    }
}

/// A process's side of its tenant's registry: the registry, and what this
/// process exported and has not withdrawn, so that a free or a destroy
/// (frequent) looks in a small set here and goes to the registry (a scan)
/// only for an object that was exported.
#[derive(Debug)]
pub(crate) struct IpcExports {
    registry: Arc<dyn IpcRegistry>,
    exported: Mutex<HashSet<(IpcKind, u64)>>,
}

impl Default for IpcExports {
    fn default() -> Self {
        Self::new(Arc::new(LocalIpcRegistry::default()))
    }
}

impl IpcExports {
    pub(crate) fn new(registry: Arc<dyn IpcRegistry>) -> Self {
        Self {
            registry,
            exported: Mutex::new(HashSet::new()),
        }
    }

    fn exported(&self) -> MutexGuard<'_, HashSet<(IpcKind, u64)>> {
        self.exported.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the export of object `key`; a full registry refuses it
    /// with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub(crate) fn export(
        &self,
        ctx_id: u32,
        kind: IpcKind,
        key: u64,
        handle: &IpcHandle,
    ) -> Result<(), u32> {
        // Under the set's lock: a withdrawal of the same key (another
        // session freeing it) sees the export whole or not at all.
        let mut exported = self.exported();
        if !self.registry.export(kind, key, handle) {
            crate::warn_limited!(
                "ctx {ctx_id}: the tenant's IPC registry is full ({MAX_IPC_EXPORTS} handles); \
                 the export is refused"
            );
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        exported.insert((kind, key));
        log::debug!("ctx {ctx_id}: IPC {kind:?} handle of {key:#x} exported");
        Ok(())
    }

    /// Whether `handle` may be opened: a process of the tenant exported it.
    /// Any other fails with `CUDA_ERROR_INVALID_HANDLE` here, before the
    /// driver sees it.
    pub(crate) fn check_open(
        &self,
        ctx_id: u32,
        kind: IpcKind,
        handle: &IpcHandle,
    ) -> Result<(), u32> {
        if self.registry.is_exported(kind, handle) {
            log::debug!("ctx {ctx_id}: IPC {kind:?} handle accepted by the tenant's registry");
            return Ok(());
        }
        crate::warn_limited!(
            "ctx {ctx_id}: IPC {kind:?} handle refused: no process of this tenant exported it"
        );
        Err(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Object `key` is going (freed, destroyed): its export, if any, goes
    /// first, so that nobody opens it meanwhile and an export of the next
    /// object at the same key stays. Whether it had been exported.
    pub(crate) fn withdraw(&self, kind: IpcKind, key: u64) -> bool {
        let mut exported = self.exported();
        let was = exported.remove(&(kind, key));
        if was {
            self.registry.withdraw(kind, &|k| k == key);
        }
        was
    }

    /// Every export of `kind` whose key `gone` accepts goes (a session's
    /// objects at its end).
    pub(crate) fn withdraw_where(&self, kind: IpcKind, gone: impl Fn(u64) -> bool) {
        let mut exported = self.exported();
        let keys: HashSet<u64> = exported
            .iter()
            .filter(|(k, key)| *k == kind && gone(*key))
            .map(|(_, key)| *key)
            .collect();
        if keys.is_empty() {
            return;
        }
        exported.retain(|(k, key)| !(*k == kind && keys.contains(key)));
        self.registry.withdraw(kind, &|key| keys.contains(&key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(byte: u8) -> IpcHandle {
        [byte; IPC_HANDLE_BYTES]
    }

    #[test]
    fn only_what_was_exported_opens_until_it_is_withdrawn() {
        let exports = IpcExports::default();
        let h = handle(7);
        assert_eq!(
            exports.check_open(1, IpcKind::Memory, &h),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        exports.export(1, IpcKind::Memory, 0x1000, &h).unwrap();
        assert_eq!(exports.check_open(1, IpcKind::Memory, &h), Ok(()));
        assert_eq!(
            exports.check_open(1, IpcKind::Event, &h),
            Err(CUDA_ERROR_INVALID_HANDLE),
            "a memory handle is no event handle"
        );
        let mut altered = h;
        altered[63] ^= 1;
        assert_eq!(
            exports.check_open(1, IpcKind::Memory, &altered),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        // Another key is untouched; its own key withdraws it.
        exports.withdraw(IpcKind::Memory, 0x2000);
        assert_eq!(exports.check_open(1, IpcKind::Memory, &h), Ok(()));
        exports.withdraw(IpcKind::Memory, 0x1000);
        assert_eq!(
            exports.check_open(1, IpcKind::Memory, &h),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
    }

    #[test]
    fn a_session_end_withdraws_its_keys_only() {
        let exports = IpcExports::default();
        exports
            .export(1, IpcKind::Event, event_key(3, 9), &handle(1))
            .unwrap();
        exports
            .export(1, IpcKind::Event, event_key(4, 9), &handle(2))
            .unwrap();
        exports.export(1, IpcKind::Memory, 9, &handle(3)).unwrap();
        exports.withdraw_where(IpcKind::Event, |key| key & !0xffff_ffff == event_key(3, 0));
        assert!(exports.check_open(1, IpcKind::Event, &handle(1)).is_err());
        assert!(exports.check_open(1, IpcKind::Event, &handle(2)).is_ok());
        assert!(exports.check_open(1, IpcKind::Memory, &handle(3)).is_ok());
    }

    #[test]
    fn the_registry_is_bounded_and_an_export_again_is_free() {
        let registry = LocalIpcRegistry::default();
        for i in 0..MAX_IPC_EXPORTS {
            let mut h = handle(0);
            h[..8].copy_from_slice(&(i as u64).to_le_bytes());
            assert!(registry.export(IpcKind::Memory, i as u64, &h));
        }
        assert!(
            registry.export(IpcKind::Memory, 0, &handle(0)),
            "known already"
        );
        assert!(!registry.export(IpcKind::Memory, 1, &handle(0xff)), "full");
        assert_eq!(registry.withdraw(IpcKind::Memory, &|key| key < 10), 10);
        assert!(registry.export(IpcKind::Memory, 1, &handle(0xff)));
    }
}

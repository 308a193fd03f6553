//! Shareable handles of physical allocations within a tenant (issue 10):
//! `cuMemExportToShareableHandle` and `cuMemImportFromShareableHandle` with
//! POSIX file descriptors, what PyTorch's expandable segments share
//! tensors with.
//!
//! The driver's descriptor lives in the exporting process's worker; a guest
//! process gets a random token for it instead (guest-lib hands it out in a
//! sealed memfd, a descriptor the application may pass on as it would the
//! driver's). The tenant's registry keeps the driver's descriptor under
//! that token ([`ShareableRegistry`]; the daemon's is a broker process
//! thread per tenant that every worker of the tenant reaches, and no other),
//! and an import succeeds only with a token a process of the same tenant
//! exported and has not withdrawn: another tenant's, a forged or a guessed
//! one fails with `CUDA_ERROR_INVALID_VALUE` (the code NVIDIA documents for
//! a bad handle there) before the driver sees anything.
//!
//! An export is withdrawn when the exporting process releases its handle,
//! when its session ends, and when its worker process ends (the daemon's
//! broker watches the exporters). Natively the descriptor would keep the
//! memory alive past the exporter's release; here whoever imported it
//! before keeps it, and later imports fail; the tenant's ledger
//! ([`crate::shared_ledger`]) keeps it charged until the last importer
//! lets go.

use std::collections::{HashMap, HashSet};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};

/// Bytes of a token.
pub const SHAREABLE_TOKEN_BYTES: usize = 32;
pub type ShareableToken = [u8; SHAREABLE_TOKEN_BYTES];

/// Exports one tenant's registry holds at most; past it an export fails
/// with `CUDA_ERROR_OUT_OF_MEMORY`.
pub const MAX_SHAREABLE_EXPORTS: usize = 1024;

/// The descriptors a tenant's processes exported, by token.
pub trait ShareableRegistry: Send + Sync + std::fmt::Debug {
    /// Keeps (a copy of) `fd`, this process's export of its object `key`
    /// of `size` bytes, under `token`. False, and nothing kept, when the
    /// registry is full or cannot be reached.
    fn deposit(&self, token: &ShareableToken, key: u64, size: u64, fd: BorrowedFd<'_>) -> bool;
    /// A descriptor of what a process of the tenant keeps under `token`,
    /// and its size.
    fn fetch(&self, token: &ShareableToken) -> Option<(OwnedFd, u64)>;
    /// This process's exports of object `key` go.
    fn withdraw(&self, key: u64);
}

/// The key of physical allocation `handle` (a guest handle) of the session
/// numbered `member` in its process.
pub fn physical_key(member: u64, handle: u32) -> u64 {
    member << 32 | u64::from(handle)
}

/// A registry of one process only, bounded as the daemon's: sessions of a
/// tenant without a shared one import what they themselves exported.
#[derive(Debug, Default)]
pub struct LocalShareableRegistry {
    entries: Mutex<HashMap<ShareableToken, Deposit>>,
}

#[derive(Debug)]
struct Deposit {
    key: u64,
    size: u64,
    fd: OwnedFd,
}

impl LocalShareableRegistry {
    fn lock(&self) -> MutexGuard<'_, HashMap<ShareableToken, Deposit>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ShareableRegistry for LocalShareableRegistry {
    fn deposit(&self, token: &ShareableToken, key: u64, size: u64, fd: BorrowedFd<'_>) -> bool {
        let mut entries = self.lock();
        if entries.len() >= MAX_SHAREABLE_EXPORTS {
            return false;
        }
        match fd.try_clone_to_owned() {
            Ok(fd) => {
                entries.insert(*token, Deposit { key, size, fd });
                true
            }
            Err(e) => {
                log::warn!("cannot keep an exported descriptor: {e}");
                false
            }
        }
    }

    fn fetch(&self, token: &ShareableToken) -> Option<(OwnedFd, u64)> {
        let entries = self.lock();
        let deposit = entries.get(token)?;
        Some((deposit.fd.try_clone().ok()?, deposit.size))
    }

    fn withdraw(&self, key: u64) {
        self.lock().retain(|_, deposit| deposit.key != key);
    }
}

/// A process's side of its tenant's registry: the registry, and the objects
/// this process exported, so that a release (frequent) reaches the
/// registry only for an object that was exported.
#[derive(Debug)]
pub(crate) struct ShareableExports {
    registry: Arc<dyn ShareableRegistry>,
    exported: Mutex<HashSet<u64>>,
}

impl Default for ShareableExports {
    fn default() -> Self {
        Self::new(Arc::new(LocalShareableRegistry::default()))
    }
}

impl ShareableExports {
    pub(crate) fn new(registry: Arc<dyn ShareableRegistry>) -> Self {
        Self {
            registry,
            exported: Mutex::new(HashSet::new()),
        }
    }

    fn exported(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.exported.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `fd`, the export of object `key` of `size` bytes, under a new
    /// random token, which it answers.
    pub(crate) fn export(
        &self,
        ctx_id: u32,
        key: u64,
        size: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<ShareableToken, u32> {
        let token = random_token().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let mut exported = self.exported();
        if !self.registry.deposit(&token, key, size, fd) {
            crate::warn_limited!(
                "ctx {ctx_id}: the tenant's registry of shareable handles refused an export \
                 (full at {MAX_SHAREABLE_EXPORTS}, or unreachable)"
            );
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        exported.insert(key);
        log::debug!("ctx {ctx_id}: shareable handle of {key:#x} exported");
        Ok(token)
    }

    /// The driver's descriptor a process of the tenant exported under
    /// `token`, and its size; any other token fails with
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn import(
        &self,
        ctx_id: u32,
        token: &ShareableToken,
    ) -> Result<(OwnedFd, u64), u32> {
        self.registry.fetch(token).ok_or_else(|| {
            crate::warn_limited!(
                "ctx {ctx_id}: shareable handle refused: no process of this tenant exported it"
            );
            CUDA_ERROR_INVALID_VALUE
        })
    }

    /// Object `key` is going: its exports go first.
    pub(crate) fn withdraw(&self, key: u64) {
        let mut exported = self.exported();
        if exported.remove(&key) {
            self.registry.withdraw(key);
        }
    }

    /// Every export whose key `gone` accepts goes (a session's at its end).
    pub(crate) fn withdraw_where(&self, gone: impl Fn(u64) -> bool) {
        let mut exported = self.exported();
        let keys: Vec<u64> = exported.iter().copied().filter(|k| gone(*k)).collect();
        for key in keys {
            exported.remove(&key);
            self.registry.withdraw(key);
        }
    }
}

/// A token no one can guess: 256 bits from the kernel's generator.
fn random_token() -> Option<ShareableToken> {
    let mut token = [0u8; SHAREABLE_TOKEN_BYTES];
    let mut filled = 0;
    while filled < token.len() {
        let rest = token.get_mut(filled..)?;
        // SAFETY: writes at most `rest.len()` bytes into `rest`.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(got) {
            Ok(n) if n > 0 => filled += n,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => {
                log::warn!(
                    "getrandom failed: {}; no shareable handle",
                    std::io::Error::last_os_error()
                );
                return None;
            }
        }
    }
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    fn memfd_with(text: &[u8]) -> OwnedFd {
        // SAFETY: a NUL-terminated name; flags the kernel knows.
        let raw = unsafe { libc::memfd_create(c"shareable-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just created, ours to own.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap())
            .write_all(text)
            .unwrap();
        fd
    }

    #[test]
    fn only_an_exported_token_imports_until_its_object_goes() {
        let exports = ShareableExports::default();
        let memory = memfd_with(b"device memory");
        let token = exports
            .export(1, physical_key(1, 5), 13, memory.as_fd())
            .unwrap();
        let other = exports
            .export(1, physical_key(1, 6), 13, memory.as_fd())
            .unwrap();
        assert_ne!(token, other, "each export has a token of its own");
        let (imported, size) = exports.import(1, &token).unwrap();
        assert_eq!(size, 13);
        let mut file = std::fs::File::from(imported);
        file.rewind().unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "device memory", "the import is the exported object");
        let mut forged = token;
        forged[0] ^= 1;
        assert_eq!(
            exports.import(1, &forged).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
        exports.withdraw(physical_key(1, 5));
        assert_eq!(
            exports.import(1, &token).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
        assert!(exports.import(1, &other).is_ok(), "another object's stays");
        exports.withdraw_where(|key| key >> 32 == 1);
        assert_eq!(
            exports.import(1, &other).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
    }
}

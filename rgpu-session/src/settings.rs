//! How a process's sessions run, from the daemon's command line
//! (`--host-spin-us`, `--host-look-us`, `--module-cache-mb`,
//! `--module-cache-dir`, `--profile-launches`, or their
//! `RGPU_*` environment variables through clap), passed down to the
//! sessions: this crate reads no environment.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::module_cache::{ModuleCache, DEFAULT_CAPACITY_MB};

/// `--host-spin-us` when nobody says.
pub const DEFAULT_SPIN_US: u64 = 50;
/// `--host-look-us` when nobody says.
pub const DEFAULT_LOOK_US: u64 = 50;

#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// How long a session's thread polls its ring for more work before it
    /// sleeps.
    pub spin: Duration,
    /// How often, while commands keep coming, a session looks at the
    /// events and streams the guest may query (each look is a driver
    /// query per item, between launches).
    pub look_every: Duration,
    /// Module images kept for loads by hash, shared by the sessions that
    /// share these settings.
    pub module_cache: Arc<ModuleCache>,
    /// Each session times the stages of its launches and synchronizations
    /// and logs them as it ends ([`crate::command_profile`]).
    pub profile_launches: bool,
}

impl SessionSettings {
    pub fn new(
        spin_us: u64,
        look_us: u64,
        module_cache_mb: u64,
        module_cache_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            spin: Duration::from_micros(spin_us),
            look_every: Duration::from_micros(look_us),
            module_cache: Arc::new(ModuleCache::configured(module_cache_mb, module_cache_dir)),
            profile_launches: false,
        }
    }
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self::new(DEFAULT_SPIN_US, DEFAULT_LOOK_US, DEFAULT_CAPACITY_MB, None)
    }
}

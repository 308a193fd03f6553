//! Device memory the driver takes for a process beyond its allocations:
//! each context's own overhead (about 500 MiB on the H200), module and
//! library globals, a malloc heap, graphs. The executor reports what the
//! process holds in all (NVML's per-process figure); what its counted
//! allocations do not explain is charged to the tenant's budget too, so a
//! limit holds whatever way device memory is taken.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rgpu_executor::{CuResult, Executor};
use rgpu_proto::cuda_result::CUDA_ERROR_OUT_OF_MEMORY;

use crate::budget::MemoryBudget;
use crate::counters::Counters;

/// [`Refresh::Lazy`] looks at most this often.
const LAZY_INTERVAL: Duration = Duration::from_millis(20);

/// When and how strictly to follow the driver's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// After a call that may have taken memory and can be undone (a
    /// context, a module load, a heap size): past the limit nothing more
    /// is charged, and the caller undoes the call.
    Strict,
    /// Memory may have gone back (an unload, a session's end), or was
    /// taken by a call that cannot be undone: charged or released as is,
    /// even past the limit (later allocations then fail).
    Settle,
    /// Lazily loaded code may have taken memory (a function or global
    /// looked up): as `Settle`, at most once per [`LAZY_INTERVAL`].
    Lazy,
}

#[derive(Debug, Default)]
struct Charged {
    bytes: u64,
    last: Option<Instant>,
}

/// What this process's driver overhead has charged so far.
#[derive(Debug, Default)]
pub(crate) struct DriverMemory {
    charged: Mutex<Charged>,
}

impl DriverMemory {
    fn lock(&self) -> MutexGuard<'_, Charged> {
        self.charged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes charged now.
    pub(crate) fn charged(&self) -> u64 {
        self.lock().bytes
    }

    /// Charges `budget` (and the process's gauge in `counters`) for what
    /// the driver holds beyond `allocations`, the bytes the sessions of
    /// this process counted themselves. `Err(OUT_OF_MEMORY)` only for
    /// [`Refresh::Strict`], with nothing charged.
    pub(crate) fn refresh(
        &self,
        how: Refresh,
        executor: &dyn Executor,
        budget: &dyn MemoryBudget,
        counters: &Counters,
        allocations: impl FnOnce() -> u64,
    ) -> CuResult<()> {
        let mut charged = self.lock();
        let now = Instant::now();
        if how == Refresh::Lazy
            && charged
                .last
                .is_some_and(|last| now.duration_since(last) < LAZY_INTERVAL)
        {
            return Ok(());
        }
        let Some(reported) = executor.process_device_memory() else {
            return Ok(());
        };
        charged.last = Some(now);
        let overhead = reported.saturating_sub(allocations());
        if overhead > charged.bytes {
            let more = overhead - charged.bytes;
            if !budget.try_reserve(more) {
                if how == Refresh::Strict {
                    log::debug!(
                        "driver memory: {reported} bytes held, {more} more than charged would \
                         pass the limit"
                    );
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                budget.charge(more);
            }
            Counters::add(&counters.device_memory_bytes, more);
        } else {
            let less = charged.bytes - overhead;
            budget.release(less);
            Counters::sub(&counters.device_memory_bytes, less);
        }
        if overhead != charged.bytes {
            log::debug!(
                "driver memory: the process holds {reported} bytes, {overhead} beyond its \
                 allocations (charged before: {})",
                charged.bytes
            );
        }
        charged.bytes = overhead;
        Ok(())
    }
}

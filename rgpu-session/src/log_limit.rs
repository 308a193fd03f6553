//! Rate-limited logging for what a guest can trigger: a guest that floods
//! the daemon with bad commands must not flood its log too (unlimited, one
//! warning per rejected command wrote 98 MB in a second).
//!
//! [`warn_limited!`](crate::warn_limited), [`error_limited!`](crate::error_limited)
//! and [`info_limited!`](crate::info_limited) take `log`'s arguments. Each
//! call site logs at most [`LINES_PER_SECOND`] lines per second (over the
//! whole process), then one line saying that it suppresses the rest of that
//! second; the first line it logs after that says how many it suppressed.
//! At trace level nothing is suppressed: whoever asked for a line per
//! command wants every line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[doc(hidden)]
pub use log as __log;

/// Lines one call site may log per second.
pub const LINES_PER_SECOND: u32 = 10;

const WINDOW: Duration = Duration::from_secs(1);

/// The budget of one call site (a `static` in each macro expansion).
#[derive(Debug)]
pub struct LogLimit {
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

/// What a call site may do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Log it, after a summary of the `suppressed` lines before it when
    /// there were any.
    Log { suppressed: u64 },
    /// Drop it and say that lines like it are dropped for now: the first
    /// one over the budget.
    SuppressFirst,
    /// Drop it (counted for the next summary).
    Suppress,
}

impl LogLimit {
    pub const fn new() -> Self {
        Self {
            window: Mutex::new(Window {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Decides about one line at `now`.
    pub fn admit_at(&self, now: Instant) -> Admit {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let expired = window
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= WINDOW);
        let mut suppressed = 0;
        if expired {
            suppressed = window.suppressed;
            *window = Window {
                started: Some(now),
                logged: 0,
                suppressed: 0,
            };
        }
        if window.logged < LINES_PER_SECOND {
            window.logged += 1;
            return Admit::Log { suppressed };
        }
        window.suppressed += 1;
        if window.suppressed == 1 {
            Admit::SuppressFirst
        } else {
            Admit::Suppress
        }
    }

    pub fn admit(&self) -> Admit {
        self.admit_at(Instant::now())
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// `log::log!` at `level`, limited per call site (see the module).
#[macro_export]
macro_rules! log_limited {
    ($level:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::log_limit::LogLimit = $crate::log_limit::LogLimit::new();
        let level = $level;
        if $crate::log_limit::__log::log_enabled!(level) {
            let admit = if $crate::log_limit::__log::log_enabled!(
                $crate::log_limit::__log::Level::Trace
            ) {
                $crate::log_limit::Admit::Log { suppressed: 0 }
            } else {
                LIMIT.admit()
            };
            match admit {
                $crate::log_limit::Admit::Log { suppressed } => {
                    if suppressed > 0 {
                        $crate::log_limit::__log::log!(
                            level,
                            "{suppressed} more lines like the next one were suppressed"
                        );
                    }
                    $crate::log_limit::__log::log!(level, $($arg)+);
                }
                $crate::log_limit::Admit::SuppressFirst => {
                    $crate::log_limit::__log::log!(
                        level,
                        "more lines like the one above are suppressed for up to a second"
                    );
                }
                $crate::log_limit::Admit::Suppress => {}
            }
        }
    }};
}

/// `log::warn!`, limited per call site (see [`crate::log_limit`]).
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {
        $crate::log_limited!($crate::log_limit::__log::Level::Warn, $($arg)+)
    };
}

/// `log::error!`, limited per call site (see [`crate::log_limit`]).
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)+) => {
        $crate::log_limited!($crate::log_limit::__log::Level::Error, $($arg)+)
    };
}

/// `log::info!`, limited per call site (see [`crate::log_limit`]).
#[macro_export]
macro_rules! info_limited {
    ($($arg:tt)+) => {
        $crate::log_limited!($crate::log_limit::__log::Level::Info, $($arg)+)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_and_the_next_window_reports_the_rest() {
        let limit = LogLimit::new();
        let start = Instant::now();
        for _ in 0..LINES_PER_SECOND {
            assert_eq!(limit.admit_at(start), Admit::Log { suppressed: 0 });
        }
        assert_eq!(limit.admit_at(start), Admit::SuppressFirst);
        for i in 0..1000 {
            let now = start + Duration::from_micros(i);
            assert_eq!(limit.admit_at(now), Admit::Suppress);
        }
        // Still inside the first second.
        assert_eq!(
            limit.admit_at(start + Duration::from_millis(999)),
            Admit::Suppress
        );
        let later = start + WINDOW;
        assert_eq!(limit.admit_at(later), Admit::Log { suppressed: 1002 });
        assert_eq!(limit.admit_at(later), Admit::Log { suppressed: 0 });
        // A quiet site logs every line.
        let much_later = later + 10 * WINDOW;
        assert_eq!(limit.admit_at(much_later), Admit::Log { suppressed: 0 });
    }

    #[test]
    fn the_macros_log_without_panicking() {
        for i in 0..100 {
            crate::warn_limited!("warn {i}");
            crate::error_limited!("error {}", i);
            crate::info_limited!("info");
        }
    }
}

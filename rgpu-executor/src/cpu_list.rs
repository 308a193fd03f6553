//! CPU lists (`0,2-5`), as `taskset -c` writes them: the CPUs an operator
//! gives the cuda executor's launch threads (`--launch-cpus`).
//!
//! Why: the driver's launch rate on the H200 host depends on the CPU that
//! calls it (225k-294k launches/s between the vCPUs of one machine), so a
//! launch thread that the scheduler moves between CPUs launches at a rate
//! that moves with it (docs/ARCHITECTURE.md 7a).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use thiserror::Error;

/// CPUs a list may name at most, whatever the machine: a `cpu_set_t`'s
/// size.
const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

/// Why a CPU list was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CpuListError {
    #[error("the CPU list is empty")]
    Empty,
    #[error("`{0}` is not a CPU number or a range of them (like 0,2-5)")]
    Syntax(String),
    #[error("the range `{0}` ends before it starts")]
    Backwards(String),
    #[error("CPU {cpu} is not on this machine (it has CPUs 0-{last})")]
    Absent { cpu: usize, last: usize },
}

/// A non-empty set of CPUs, each on this machine, in ascending order.
#[derive(Clone, PartialEq, Eq)]
pub struct CpuList(Arc<[usize]>);

impl CpuList {
    /// Parses `text` for a machine with `present` CPUs (numbered from 0).
    pub fn parse(text: &str, present: usize) -> Result<CpuList, CpuListError> {
        let present = present.min(MAX_CPUS);
        if text.trim().is_empty() {
            return Err(CpuListError::Empty);
        }
        let mut cpus = Vec::new();
        for part in text.split(',').map(str::trim) {
            let number = |s: &str| {
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| CpuListError::Syntax(part.to_owned()))
            };
            let (first, last) = match part.split_once('-') {
                Some((first, last)) => (number(first)?, number(last)?),
                None => {
                    let cpu = number(part)?;
                    (cpu, cpu)
                }
            };
            if last < first {
                return Err(CpuListError::Backwards(part.to_owned()));
            }
            if last >= present {
                return Err(CpuListError::Absent {
                    cpu: last,
                    last: present.saturating_sub(1),
                });
            }
            cpus.extend(first..=last);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuList(cpus.into()))
    }

    /// The CPUs, ascending.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// Whether a thread may be confined to these CPUs here (a cpuset may
    /// leave some out): one is started, pinned and ended, so that the
    /// daemon refuses a list at start-up, not in each context's thread.
    pub fn check_usable(&self) -> std::io::Result<()> {
        let list = self.clone();
        std::thread::Builder::new()
            .name("rgpu-cpu-check".into())
            .spawn(move || list.pin_current_thread())?
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the checking thread panicked")))
    }

    /// Confines the calling thread to these CPUs.
    pub fn pin_current_thread(&self) -> std::io::Result<()> {
        // SAFETY: an all-zero cpu_set_t is the empty set (plain data).
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in self.cpus() {
            // SAFETY: `cpu` is below CPU_SETSIZE (checked when parsed), the
            // set's size in bits, so the macro writes within `set`.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t
        // of the size passed, read during the call only.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// This machine's CPUs (configured, online or not): what a list may name.
pub fn present_cpus() -> usize {
    // SAFETY: sysconf reads a value and has no preconditions.
    let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(configured).unwrap_or(1).max(1)
}

impl FromStr for CpuList {
    type Err = CpuListError;

    /// A list of this machine's CPUs.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        CpuList::parse(text, present_cpus())
    }
}

impl fmt::Display for CpuList {
    /// Runs of consecutive CPUs as ranges (`0,2-5`), as taskset writes them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.cpus();
        let mut first = true;
        while let Some((&start, _)) = rest.split_first() {
            let run = rest
                .iter()
                .enumerate()
                .take_while(|&(i, &cpu)| cpu == start + i)
                .count();
            let end = start + run - 1;
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if run == 1 {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            rest = rest.get(run..).unwrap_or_default();
        }
        Ok(())
    }
}

impl fmt::Debug for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuList({self})")
    }
}

#[cfg(test)]
/// The CPUs the calling thread may run on.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; `set` is valid for writes of its size.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    (0..MAX_CPUS)
        // SAFETY: reads a bit of the set, below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_parse_sorted_without_repeats() {
        let list = CpuList::parse("5, 0,2-3,3", 8).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(list.cpus(), &[0, 2, 3, 5]);
        assert_eq!(list.to_string(), "0,2-3,5");
        let all = CpuList::parse("0-7", 8).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all.cpus().len(), 8);
        assert_eq!(all.to_string(), "0-7");
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        assert_eq!(CpuList::parse(" ", 8), Err(CpuListError::Empty));
        assert_eq!(
            CpuList::parse("1,,2", 8),
            Err(CpuListError::Syntax(String::new()))
        );
        assert_eq!(
            CpuList::parse("1,x", 8),
            Err(CpuListError::Syntax("x".into()))
        );
        assert_eq!(
            CpuList::parse("-1", 8),
            Err(CpuListError::Syntax("-1".into()))
        );
        assert_eq!(
            CpuList::parse("4-2", 8),
            Err(CpuListError::Backwards("4-2".into()))
        );
        assert_eq!(
            CpuList::parse("0,8", 8),
            Err(CpuListError::Absent { cpu: 8, last: 7 })
        );
        let too_many = format!("{}", MAX_CPUS);
        assert!(matches!(
            CpuList::parse(&too_many, usize::MAX),
            Err(CpuListError::Absent { .. })
        ));
    }

    #[test]
    fn a_usable_list_checks_and_an_absent_cpu_is_refused_by_the_kernel() {
        let last = allowed_cpus().last().copied().unwrap_or_default();
        let usable =
            CpuList::parse(&last.to_string(), present_cpus()).unwrap_or_else(|e| panic!("{e}"));
        assert!(usable.check_usable().is_ok());
        // Past the machine's CPUs (which parse() refuses first): EINVAL.
        let absent = CpuList(vec![MAX_CPUS - 1].into());
        if present_cpus() < MAX_CPUS {
            let refused = absent.check_usable().map_err(|e| e.raw_os_error());
            assert_eq!(refused, Err(Some(libc::EINVAL)));
        }
    }

    #[test]
    fn a_pinned_thread_runs_only_on_its_cpus() {
        let before = allowed_cpus();
        let Some(&last) = before.last() else {
            panic!("this thread may run on no CPU");
        };
        let list =
            CpuList::parse(&last.to_string(), present_cpus()).unwrap_or_else(|e| panic!("{e}"));
        let pinned = std::thread::spawn(move || list.pin_current_thread().map(|()| allowed_cpus()))
            .join()
            .unwrap_or_else(|_| panic!("the pinned thread panicked"));
        assert_eq!(pinned.unwrap_or_else(|e| panic!("{e}")), vec![last]);
        // Only the pinned thread's own set changed.
        assert_eq!(allowed_cpus(), before);
    }
}

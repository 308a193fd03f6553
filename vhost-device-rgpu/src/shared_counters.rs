//! One page of counters shared between the parent process and the process
//! serving one connection: the parent creates it (a memfd) and maps it, the
//! child maps the inherited descriptor and counts into it, and the parent's
//! stats socket reads it, also after the child died.
//!
//! The page holds an [`rgpu_session::CounterPage`], whose layout is
//! `#[repr(C)]` atomics only, so both processes may access it at once.

use std::ffi::CStr;
use std::io;
use std::os::fd::{OwnedFd, RawFd};

use rgpu_session::CounterPage;

use crate::shared_page::{self, SharedLayout, SharedPage};

// SAFETY: `CounterPage` is `#[repr(C)]` atomics only (valid all zero), far
// smaller than a page.
unsafe impl SharedLayout for CounterPage {}

/// The parent's mapping of one child's counters; unmapped on drop.
pub struct SharedCounters {
    page: SharedPage<CounterPage>,
}

impl SharedCounters {
    /// Creates a zeroed page (all counters 0) and maps it. The descriptor is
    /// close-on-exec; hand it to the child explicitly, then drop it.
    pub fn create(name: &CStr) -> io::Result<(Self, OwnedFd)> {
        let fd = shared_page::create(name, SharedPage::<CounterPage>::BYTES)?;
        let page = SharedPage::map(&fd)?;
        Ok((Self { page }, fd))
    }

    pub fn page(&self) -> &CounterPage {
        self.page.get()
    }
}

/// Maps the page the parent handed over as `fd` for the rest of the
/// process's life, and closes `fd`.
pub fn map_inherited(fd: RawFd) -> io::Result<&'static CounterPage> {
    let fd = shared_page::adopt(fd, "a counters page", SharedPage::<CounterPage>::BYTES)?;
    Ok(SharedPage::map(&fd)?.leak())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_session::Counters;
    use std::os::fd::AsRawFd;

    #[test]
    fn both_mappings_see_the_same_counters() {
        let (parent, fd) = SharedCounters::create(c"rgpu-test-counters").unwrap();
        // SAFETY: dup of a descriptor we own.
        let dup = unsafe { libc::dup(fd.as_raw_fd()) };
        assert!(dup >= 0);
        let child = Counters::shared(map_inherited(dup).unwrap());
        Counters::add(&child.staged_bytes, 42);
        assert_eq!(Counters::get(&parent.page().staged_bytes), 42);
        assert_eq!(Counters::get(&parent.page().sessions_active), 0);
        drop(fd);
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(map_inherited(file.as_raw_fd()).is_err());
    }
}

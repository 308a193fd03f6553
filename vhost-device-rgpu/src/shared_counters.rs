//! One page of counters shared between the parent process and the process
//! serving one connection: the parent creates it (a memfd) and maps it, the
//! child maps the inherited descriptor and counts into it, and the parent's
//! stats socket reads it, also after the child died.
//!
//! The page holds an [`rgpu_session::CounterPage`], whose layout is
//! `#[repr(C)]` atomics only, so both processes may access it at once.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use rgpu_session::CounterPage;

/// The size of the shared mapping (the page holds the counters).
const PAGE_BYTES: usize = 4096;
const _: () = assert!(std::mem::size_of::<CounterPage>() <= PAGE_BYTES);

/// The parent's mapping of one child's counters; unmapped on drop.
pub struct SharedCounters {
    page: NonNull<CounterPage>,
}

// SAFETY: the mapping is only ever accessed as a `CounterPage`, whose fields
// are atomics; the pointer stays valid until drop.
unsafe impl Send for SharedCounters {}
// SAFETY: as above; shared references only read and update atomics.
unsafe impl Sync for SharedCounters {}

impl SharedCounters {
    /// Creates a zeroed page (all counters 0) and maps it. The descriptor is
    /// close-on-exec; hand it to the child explicitly, then drop it.
    pub fn create(name: &CStr) -> io::Result<(Self, OwnedFd)> {
        // SAFETY: `name` is a valid C string; memfd_create has no other
        // inputs.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a fresh descriptor that nothing else
        // owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor; a fresh memfd reads as
        // zeroes, which is a valid CounterPage.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE_BYTES as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let page = map(fd.as_raw_fd())?;
        Ok((Self { page }, fd))
    }

    pub fn page(&self) -> &CounterPage {
        // SAFETY: `page` points at a live shared mapping of a CounterPage
        // (see `map`), unmapped only in drop.
        unsafe { self.page.as_ref() }
    }
}

impl Drop for SharedCounters {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `create`; no reference
        // from `page()` outlives `self`.
        unsafe { libc::munmap(self.page.as_ptr().cast(), PAGE_BYTES) };
    }
}

/// Maps the page the parent handed over as `fd` for the rest of the
/// process's life, and closes `fd`.
pub fn map_inherited(fd: RawFd) -> io::Result<&'static CounterPage> {
    // SAFETY: fstat writes into a plain struct; a bad descriptor only fails.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG
        || usize::try_from(stat.st_size).map_or(true, |size| size < PAGE_BYTES)
    {
        return Err(io::Error::other(format!(
            "descriptor {fd} is not a counters page"
        )));
    }
    // SAFETY: fd is an open regular file (checked above) that the parent
    // handed to us alone; we own it from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let page = map(fd.as_raw_fd())?;
    // SAFETY: the mapping is never unmapped, so the page lives as long as
    // the process; its fields are atomics, shared safely with the parent.
    Ok(unsafe { page.as_ref() })
}

/// Maps the first page of `fd` shared, read-write.
fn map(fd: RawFd) -> io::Result<NonNull<CounterPage>> {
    // SAFETY: a fresh shared mapping of `fd`, chosen by the kernel, so it
    // overlaps nothing; mmap returns page-aligned memory, which satisfies
    // CounterPage's alignment (8).
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(address.cast::<CounterPage>()).ok_or_else(|| io::Error::other("mmap gave NULL"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_session::Counters;

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

//! Pages of a memfd, mapped shared and read-write: how the daemon's
//! processes share numbers (atomics only) without a round trip. A parent
//! creates the pages ([`create`], as many as the layout needs) and maps
//! them; a child maps the descriptor it inherited ([`adopt`]).
//! [`crate::shared_counters`] (one page) and [`crate::tenant_page`] (with
//! its IPC registry, several) are its two layouts.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// The size of a shared page; a layout takes whole pages.
pub const PAGE_BYTES: usize = 4096;

/// A layout that may live in a shared page.
///
/// # Safety
///
/// The type is `#[repr(C)]`, holds atomics only (another process writes it
/// at any time), is valid when all zero (a fresh memfd reads as zeroes) and
/// has an alignment of at most a page.
pub unsafe trait SharedLayout: Sync {}

/// A shared mapping of the first [`SharedPage::BYTES`] of a descriptor,
/// seen as a `T`; unmapped on drop.
pub struct SharedPage<T: SharedLayout> {
    page: NonNull<T>,
}

// SAFETY: the mapping holds a `T`, whose fields are atomics
// (`SharedLayout`); the pointer stays valid until drop.
unsafe impl<T: SharedLayout> Send for SharedPage<T> {}
// SAFETY: as above; shared references only read and update atomics.
unsafe impl<T: SharedLayout> Sync for SharedPage<T> {}

impl<T: SharedLayout> SharedPage<T> {
    /// What a `T` takes: its size in whole pages. [`create`] and [`adopt`]
    /// are given it.
    pub const BYTES: usize = std::mem::size_of::<T>().div_ceil(PAGE_BYTES) * PAGE_BYTES;

    /// Maps the first [`Self::BYTES`] of `fd`, a memfd from [`create`] or
    /// [`adopt`] of at least that size.
    pub fn map(fd: &OwnedFd) -> io::Result<Self> {
        const { assert!(std::mem::align_of::<T>() <= PAGE_BYTES && Self::BYTES > 0) };
        // SAFETY: a fresh shared mapping chosen by the kernel, so it overlaps
        // nothing; it is page-aligned, which satisfies `T`'s alignment.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(address.cast::<T>())
            .map(|page| Self { page })
            .ok_or_else(|| io::Error::other("mmap gave NULL"))
    }

    pub fn get(&self) -> &T {
        // SAFETY: `page` points at a live shared mapping of a `T` (valid
        // when all zero, atomics only), unmapped only in drop.
        unsafe { self.page.as_ref() }
    }

    /// Keeps the mapping for the rest of the process's life.
    pub fn leak(self) -> &'static T {
        let page = self.page;
        std::mem::forget(self);
        // SAFETY: the mapping is never unmapped now.
        unsafe { page.as_ref() }
    }
}

impl<T: SharedLayout> Drop for SharedPage<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference
        // from `get()` outlives `self`.
        unsafe { libc::munmap(self.page.as_ptr().cast(), Self::BYTES) };
    }
}

/// New zero-filled memory of `bytes` (a layout's [`SharedPage::BYTES`])
/// named `name`. The descriptor is close-on-exec: hand it to a child
/// explicitly.
pub fn create(name: &CStr, bytes: usize) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; memfd_create has no other inputs.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor that nothing else
    // owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let length = libc::off_t::try_from(bytes).map_err(|_| io::Error::other("too large"))?;
    // SAFETY: ftruncate on our own descriptor; the new bytes read as zero.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), length) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Takes the descriptor `fd` that a parent handed over, once it is seen to
/// be a regular file of `bytes` (a layout's [`SharedPage::BYTES`]) or
/// more; the error names it `what`.
pub fn adopt(fd: RawFd, what: &str, bytes: usize) -> io::Result<OwnedFd> {
    // SAFETY: fstat writes into a plain struct; a bad descriptor only fails.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG
        || usize::try_from(stat.st_size).map_or(true, |size| size < bytes)
    {
        return Err(io::Error::other(format!("descriptor {fd} is not {what}")));
    }
    // SAFETY: fd is an open regular file (checked above) that the parent
    // handed to this process alone; it is ours from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

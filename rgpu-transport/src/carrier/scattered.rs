//! Scattered blobs in local mode (`RGPU_LOCAL_SCATTER_BLOBS=1`, for tests
//! and benchmarks): a guest that has run for a while hands out its memory
//! as scattered pages, and a VM's blobs then name many short page runs.
//! Local mode allocates one contiguous range of its guest memory per blob;
//! with this knob it describes the blob to the device as runs of 1 to 8
//! pages in shuffled order, and maps the same runs, in the same order, into
//! one range of the process's address space, so the process sees the blob
//! contiguous while the daemon sees what a VM would show it.

use std::os::fd::RawFd;

use rgpu_proto::virtio_gpu::MemEntry;

use crate::guest_memory::PAGE_SIZE;

/// Blobs smaller than this stay contiguous (a VM hands out small ones
/// contiguous too).
pub const SCATTER_MIN_BYTES: u64 = 64 << 10;
/// The longest run of pages.
const MAX_RUN_PAGES: u64 = 8;

/// Whether `RGPU_LOCAL_SCATTER_BLOBS` asks for scattered blobs.
pub fn enabled_from_env() -> bool {
    std::env::var("RGPU_LOCAL_SCATTER_BLOBS").is_ok_and(|v| v.trim() == "1")
}

/// A run of the blob: `pages` pages of guest memory starting `source_page`
/// pages into the blob's contiguous allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub source_page: u64,
    pub pages: u64,
}

/// xorshift64*: a deterministic stream (the layout is reproducible per
/// seed), not a secret.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The runs of a blob of `pages` pages in the order the blob names them:
/// runs of 1 to `MAX_RUN_PAGES` pages of the allocation, shuffled. Every
/// page appears exactly once.
pub fn layout(pages: u64, seed: u64) -> Vec<Run> {
    let mut state = seed | 1;
    let mut runs = Vec::new();
    let mut page = 0;
    while page < pages {
        let len = (next(&mut state) % MAX_RUN_PAGES + 1).min(pages - page);
        runs.push(Run {
            source_page: page,
            pages: len,
        });
        page += len;
    }
    for i in (1..runs.len()).rev() {
        let j = (next(&mut state) % (i as u64 + 1)) as usize;
        runs.swap(i, j);
    }
    runs
}

/// The device's view: one entry per run, at guest address `gpa` + the run's
/// place in the allocation.
pub fn entries(runs: &[Run], gpa: u64) -> Vec<MemEntry> {
    runs.iter()
        .map(|run| MemEntry {
            addr: gpa + run.source_page * PAGE_SIZE,
            length: (run.pages * PAGE_SIZE) as u32,
        })
        .collect()
}

/// The process's view: a fresh range of `runs`' total size in which run
/// `i` maps the guest memory file `fd` at `gpa` + its place, one after
/// another. Unmap it with [`unmap`].
pub fn map(runs: &[Run], fd: RawFd, gpa: u64) -> std::io::Result<*mut u8> {
    let size = runs.iter().map(|r| r.pages * PAGE_SIZE).sum::<u64>() as usize;
    // SAFETY: reserves a fresh range the kernel chooses; nothing else
    // refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let base = base.cast::<u8>();
    let mut offset = 0usize;
    for run in runs {
        let len = (run.pages * PAGE_SIZE) as usize;
        let file_offset = gpa + run.source_page * PAGE_SIZE;
        // SAFETY: replaces pages of the range reserved above (MAP_FIXED
        // inside our own reservation) with a shared mapping of the guest
        // memory file, which outlives the blob.
        let mapped = unsafe {
            libc::mmap(
                base.add(offset).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                file_offset as libc::off_t,
            )
        };
        if mapped == libc::MAP_FAILED {
            let error = std::io::Error::last_os_error();
            unmap(base, size as u64);
            return Err(error);
        }
        offset += len;
    }
    Ok(base)
}

/// Unmaps a range from [`map`].
pub fn unmap(base: *mut u8, size: u64) {
    // SAFETY: `base` and `size` describe a range [`map`] created, which no
    // one uses any more.
    unsafe { libc::munmap(base.cast(), size as usize) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_once_in_short_shuffled_runs() {
        let runs = layout(1000, 7);
        let mut seen = vec![false; 1000];
        for run in &runs {
            assert!((1..=MAX_RUN_PAGES).contains(&run.pages));
            for page in run.source_page..run.source_page + run.pages {
                assert!(!std::mem::replace(&mut seen[page as usize], true));
            }
        }
        assert!(seen.iter().all(|s| *s));
        let in_order = runs
            .windows(2)
            .filter(|w| w[0].source_page < w[1].source_page)
            .count();
        assert!(in_order < runs.len() * 3 / 4, "the runs are shuffled");
        assert_eq!(layout(1000, 7), runs, "one seed, one layout");
    }

    #[test]
    fn the_process_sees_the_runs_in_the_blobs_order() {
        let pages = 64u64;
        let size = pages * PAGE_SIZE;
        // SAFETY: a fresh memfd with a literal name.
        let fd = unsafe { libc::memfd_create(c"rgpu-scatter-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: sizes our own memfd.
        let result = unsafe { libc::ftruncate(fd, (size + PAGE_SIZE) as libc::off_t) };
        assert_eq!(result, 0);
        // Page p of the file (after one page of offset) holds p.
        for p in 0..pages {
            let byte = [p as u8];
            // SAFETY: writes one byte into our own memfd.
            let written = unsafe {
                libc::pwrite(
                    fd,
                    byte.as_ptr().cast(),
                    1,
                    ((p + 1) * PAGE_SIZE) as libc::off_t,
                )
            };
            assert_eq!(written, 1);
        }
        let runs = layout(pages, 3);
        let base = map(&runs, fd, PAGE_SIZE).expect("map");
        let entries = entries(&runs, PAGE_SIZE);
        let mut offset = 0u64;
        for (run, entry) in runs.iter().zip(&entries) {
            for k in 0..run.pages {
                // SAFETY: inside the mapping made above.
                let value = unsafe { *base.add(((offset + k) * PAGE_SIZE) as usize) };
                assert_eq!(u64::from(value), run.source_page + k);
            }
            assert_eq!(entry.addr, PAGE_SIZE + run.source_page * PAGE_SIZE);
            offset += run.pages;
        }
        unmap(base, size);
        // SAFETY: closes our own descriptor.
        unsafe { libc::close(fd) };
    }
}

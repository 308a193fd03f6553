//! Where an address lies (library and nearest exported symbol), and the
//! calling stack: the unknown-slot log says which library calls a slot and
//! what its pointer arguments point into, which is what tells a private
//! slot's meaning apart on the GPU host.

use std::ffi::{c_void, CStr};
use std::fmt::Write as _;

/// What the loader knows about an address inside a loaded object.
fn lookup(address: usize) -> Option<libc::Dl_info> {
    if address < 0x10000 {
        return None;
    }
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only looks the address up in the loader's tables; it
    // never dereferences it. `info` is a valid out-parameter.
    let found = unsafe { libc::dladdr(address as *const c_void, &mut info) };
    (found != 0 && !info.dli_fname.is_null()).then_some(info)
}

/// ` (libfoo.so+0x1234 symbol+0x10)` for an address inside a loaded
/// object; empty for anything else (small integers, heap, stack).
pub fn describe(address: usize) -> String {
    let Some(info) = lookup(address) else {
        return String::new();
    };
    // SAFETY: non-NULL; dladdr returns the loader's NUL-terminated name.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let file = path.rsplit('/').next().unwrap_or_default();
    let mut text = format!(
        " ({file}+{:#x}",
        address.wrapping_sub(info.dli_fbase as usize)
    );
    if !info.dli_sname.is_null() {
        // SAFETY: non-NULL; a NUL-terminated symbol name from the loader.
        let symbol = unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy();
        let _ = write!(
            text,
            " {symbol}+{:#x}",
            address.wrapping_sub(info.dli_saddr as usize)
        );
    }
    text.push(')');
    text
}

/// The return addresses of the calling stack, innermost first, described;
/// the frames inside this library come first and are left out.
#[cfg(target_env = "gnu")]
pub fn caller_stack() -> Vec<String> {
    const DEPTH: usize = 24;
    let mut frames = [std::ptr::null_mut::<c_void>(); DEPTH];
    // SAFETY: the buffer holds DEPTH pointers and backtrace writes at most
    // that many.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), DEPTH as libc::c_int) };
    let n = usize::try_from(n).unwrap_or(0).min(DEPTH);
    let base = |address: usize| lookup(address).map(|i| i.dli_fbase as usize);
    let own = base(caller_stack as *const () as usize);
    frames
        .iter()
        .take(n)
        .skip_while(|&&f| own.is_some() && base(f as usize) == own)
        .map(|&f| format!("{f:?}{}", describe(f as usize)))
        .collect()
}

#[cfg(not(target_env = "gnu"))]
pub fn caller_stack() -> Vec<String> {
    Vec::new()
}

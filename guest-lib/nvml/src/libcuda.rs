//! rgpu's libcuda in the same process, through the one extra function it
//! exports for NVML:
//!
//! ```c
//! int rgpu_device_status(unsigned device, unsigned char *out,
//!                        size_t out_len, size_t *written);
//! ```
//!
//! (documented in guest-lib's `device_status` module). In local mode every
//! process is its own connection and NVML's own connection is a tenant
//! without device contexts, so the host lists this process's contexts only
//! when asked through one of libcuda's channels. It returns a CUDA result:
//! 0 with the `DeviceStatus` payload in `out[0..*written]`; 3 (not
//! initialised) or 201 (no session) when libcuda has no session to ask
//! through, and NVML then asks on its own connection.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use rgpu_proto::cuda_result::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS,
};
use rgpu_proto::reply::{MAX_DRIVER_VERSION_BYTES, MAX_STATUS_SESSIONS};

type DeviceStatusFn = unsafe extern "C" fn(c_uint, *mut u8, usize, *mut usize) -> c_int;

const SYMBOL: &CStr = c"rgpu_device_status";
const LIBCUDA: &CStr = c"libcuda.so.1";

/// The longest `DeviceStatus` encoding: four numbers, the version string
/// with its length, the session count and 16 bytes per session.
pub(crate) const MAX_STATUS_BYTES: usize =
    8 + 8 + 4 + 4 + 4 + MAX_DRIVER_VERSION_BYTES + 4 + 16 * MAX_STATUS_SESSIONS;

/// Set once found; rgpu's libcuda then stays loaded (see [`lookup`]).
static FOUND: OnceLock<DeviceStatusFn> = OnceLock::new();

/// `rgpu_device_status`, if rgpu's libcuda is loaded in this process.
/// Looked up at `nvmlInit` and again while not found: an application may
/// load libcuda after NVML.
pub(crate) fn lookup() -> Option<DeviceStatusFn> {
    if let Some(function) = FOUND.get() {
        return Some(*function);
    }
    // SAFETY: a lookup in the global scope by a NUL-terminated name.
    let mut symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr()) };
    if symbol.is_null() {
        // A libcuda a runtime dlopen()ed with RTLD_LOCAL is not in the
        // global scope; RTLD_NOLOAD finds it without loading one. The
        // handle is kept: its reference keeps the function loaded.
        // SAFETY: NUL-terminated name; RTLD_NOLOAD never runs a library's
        // initialisers.
        let handle = unsafe { libc::dlopen(LIBCUDA.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !handle.is_null() {
            // SAFETY: a handle dlopen just returned; NUL-terminated name.
            symbol = unsafe { libc::dlsym(handle, SYMBOL.as_ptr()) };
            if symbol.is_null() {
                // NVIDIA's libcuda: not ours, nothing to keep.
                // SAFETY: the handle of the dlopen above, closed once.
                unsafe { libc::dlclose(handle) };
            }
        }
    }
    if symbol.is_null() {
        return None;
    }
    // SAFETY: rgpu's libcuda defines `rgpu_device_status` with exactly the
    // C signature of `DeviceStatusFn` (guest-lib's `device_status` module).
    let function = unsafe { std::mem::transmute::<*mut c_void, DeviceStatusFn>(symbol) };
    log::debug!("rgpu NVML: asking the host through rgpu libcuda's channels");
    Some(*FOUND.get_or_init(|| function))
}

/// The host's answer to `DeviceStatus { device }` through libcuda's
/// channel: `(CUDA result, payload)`, or `None` when there is no rgpu
/// libcuda with a session in this process.
pub(crate) fn device_status(device: u32) -> Option<(u32, Vec<u8>)> {
    let function = lookup()?;
    let mut payload = vec![0u8; MAX_STATUS_BYTES];
    let mut written = 0usize;
    // SAFETY: `payload` holds `payload.len()` writable bytes and `written`
    // is a valid `size_t`, as the function's contract requires.
    let result = unsafe { function(device, payload.as_mut_ptr(), payload.len(), &mut written) };
    let result = u32::try_from(result).unwrap_or(CUDA_ERROR_UNKNOWN);
    match result {
        CUDA_ERROR_NOT_INITIALIZED | CUDA_ERROR_INVALID_CONTEXT => None,
        CUDA_SUCCESS if written > payload.len() => {
            log::error!("rgpu NVML: libcuda reported {written} status bytes in a buffer of {MAX_STATUS_BYTES}");
            Some((CUDA_ERROR_UNKNOWN, Vec::new()))
        }
        CUDA_SUCCESS => {
            payload.truncate(written);
            Some((result, payload))
        }
        code => Some((code, Vec::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_proto::reply::{DeviceStatus, SessionUsage};

    #[test]
    fn the_longest_status_fits_the_buffer() {
        let status = DeviceStatus {
            free: u64::MAX,
            total: u64::MAX,
            gpu_utilization: 1,
            memory_utilization: 2,
            driver_version: "9".repeat(MAX_DRIVER_VERSION_BYTES),
            sessions: vec![
                SessionUsage {
                    ctx_id: 1,
                    pid: 0,
                    device_memory: 2
                };
                MAX_STATUS_SESSIONS
            ],
        };
        assert_eq!(status.to_bytes().len(), MAX_STATUS_BYTES);
    }
}

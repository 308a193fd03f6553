//! `rgpu_device_status`: the host's `DeviceStatus` asked through a channel
//! of this process's CUDA contexts, for rgpu's NVML in the same process.
//!
//! In local mode each process is one connection (one tenant) and NVML's own
//! connection is another, whose sessions never hold a device context: asked
//! there, the host lists none of the process's contexts. Asked through a
//! context's channel, it lists the sessions of libcuda's connection, which
//! are this process's contexts. Not a `cu*` name, so it is neither in the
//! CUDA export list nor in `cuGetProcAddress`.
//!
//! C signature (rgpu's NVML looks it up with `dlsym`; do not change it):
//!
//! ```c
//! int rgpu_device_status(unsigned device, unsigned char *out,
//!                        size_t out_len, size_t *written);
//! ```
//!
//! Returns a CUDA result code:
//! - `CUDA_SUCCESS` (0): `out[0..*written]` holds the reply payload, a
//!   `rgpu_proto::reply::DeviceStatus` encoding;
//! - `CUDA_ERROR_NOT_INITIALIZED` (3): `cuInit` has not succeeded;
//! - `CUDA_ERROR_INVALID_CONTEXT` (201): no session: no context of this
//!   process has a host session (none current, no active primary context,
//!   no other live context);
//! - `CUDA_ERROR_INVALID_VALUE` (1): `out` or `written` is NULL, or the
//!   payload is longer than `out_len` (then `*written` is its length and
//!   `out` is untouched);
//! - any other code: the host's answer (`CUDA_ERROR_INVALID_DEVICE`,
//!   `CUDA_ERROR_NOT_SUPPORTED`) or a transport failure.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use rgpu_proto::Command;
use rgpu_transport::Reply;

use crate::state::{self, Context, CONTEXTS};

/// The contexts to ask through, best first: the calling thread's current
/// one, the active primary contexts, then every other live context. All of
/// them are channels of the same connection, so any one lists them all.
/// Only contexts of the first carrier count: NVML opens that one
/// (`RGPU_DEVICES`' first entry), and its device numbers are that daemon's.
fn candidates() -> Result<Vec<Arc<Context>>, u32> {
    let driver = state::driver()?;
    let mut list: Vec<Arc<Context>> = state::current_or_none()
        .ok()
        .flatten()
        .into_iter()
        .collect();
    for device in &driver.devices {
        let primary = device.primary.lock().unwrap_or_else(|e| e.into_inner());
        if primary.refcount > 0 {
            list.extend(primary.context.clone());
        }
    }
    list.extend(CONTEXTS.values().into_iter().filter(|c| c.is_alive()));
    list.retain(|c| c.space == 0);
    Ok(list)
}

/// The host's reply to `DeviceStatus { device }` on the first context with
/// a host session.
fn ask(device: u32) -> Result<Reply, u32> {
    let command = Command::DeviceStatus { device };
    for context in candidates()? {
        if let Some(reply) = context.call_if_open(&command)? {
            return Ok(reply);
        }
    }
    Err(CUDA_ERROR_INVALID_CONTEXT)
}

fn device_status(
    device: c_uint,
    out: *mut u8,
    out_len: usize,
    written: *mut usize,
) -> Result<(), u32> {
    if out.is_null() || written.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let reply = ask(device)?;
    if reply.result != CUDA_SUCCESS {
        return Err(reply.result);
    }
    let payload = reply.payload;
    // SAFETY: non-NULL; the caller's `size_t` out-parameter.
    unsafe { written.write_unaligned(payload.len()) };
    if payload.len() > out_len {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `out` is non-NULL and, by the caller's contract, holds
    // `out_len` >= payload.len() writable bytes; `payload` is our own vector.
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), out, payload.len()) };
    Ok(())
}

/// See the module documentation for the contract.
#[no_mangle]
pub extern "C" fn rgpu_device_status(
    device: c_uint,
    out: *mut u8,
    out_len: usize,
    written: *mut usize,
) -> c_int {
    let result = crate::entry::run("rgpu_device_status", || {
        device_status(device, out, out_len, written)
    });
    log::trace!("rgpu_device_status(device={device}, out_len={out_len}) -> {result}");
    c_int::try_from(result).unwrap_or(c_int::MAX)
}

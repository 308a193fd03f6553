//! rgpu's drop-in `libcuda.so.1` (ARCHITECTURE.md §6): every CUDA driver-API
//! call becomes a command of the rgpu command stream on a
//! [`rgpu_transport::Channel`].
//!
//! One declarative list ([`exports`]) names every hand-written entry point;
//! the build script generates from it and from NVIDIA's export list the
//! stubs of everything else ([`unsupported`]), the symbol table
//! ([`symbols`]) and the `cuGetProcAddress` table
//! ([`api::proc_address`]).
//!
//! Besides the CUDA names it exports `rgpu_guest_lib_marker` and
//! [`device_status::rgpu_device_status`] (for rgpu's NVML in the same
//! process).

pub mod abi;
pub mod api;
mod context_storage;
mod device_ranges;
pub mod device_status;
mod entry;
pub mod exports;
mod host_functions;
pub mod image;
pub mod params;
mod pinned;
mod state;
pub mod symbols;
mod transport_error;
pub mod unsupported;

/// Present only in rgpu's libcuda: the daemon refuses to load a libcuda that
/// exports it (it would be talking to itself). Returns the protocol version.
#[no_mangle]
pub extern "C" fn rgpu_guest_lib_marker() -> u32 {
    rgpu_proto::PROTOCOL_VERSION
}

//! rgpu's drop-in `libnvidia-ml.so.1`: NVML for applications in a guest
//! (PyTorch, CuPy and nvidia-smi-like tools ask it before or beside CUDA).
//!
//! Static values (name, UUID, PCI location, compute capability, CUDA
//! version) come from the rgpu capset; live ones (memory, utilisation, this
//! tenant's processes, the NVIDIA driver version) from the host through the
//! `DeviceStatus` command on a channel of NVML's own, opened by the first
//! `nvmlInit` and closed by the last `nvmlShutdown`. The host answers it
//! without creating a device context. When rgpu's libcuda is loaded in the
//! same process and has a session, `DeviceStatus` goes through its channel
//! instead (`libcuda`), so that the processes listed are this process's
//! contexts (in local mode NVML's connection is a tenant of its own).
//!
//! One declarative list ([`exports`]) names every hand-written entry point;
//! the build script generates stubs for the rest of NVIDIA's export list
//! ([`unsupported`]).

pub mod abi;
pub mod device;
mod entry;
pub mod error;
pub mod exports;
mod libcuda;
mod out;
mod state;
pub mod system;
pub mod unsupported;

/// Present only in rgpu's NVML: the daemon refuses to load an NVML that
/// exports it (it would be asking itself). Returns the protocol version.
#[no_mangle]
pub extern "C" fn rgpu_nvml_marker() -> u32 {
    rgpu_proto::PROTOCOL_VERSION
}

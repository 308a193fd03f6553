//! vhost-device-rgpu: the host daemon of rgpu (ARCHITECTURE.md §5).
//!
//! A vhost-user backend of a compute-only virtio-gpu device that offers the
//! rgpu CUDA context type. One [`virtio_gpu::GpuBackend`] (and device model)
//! serves one vhost-user connection; [`daemon`] accepts connections and tears
//! each one down when its frontend goes away; [`socket`] creates or inherits
//! the listening socket; [`signals`] cleans up on SIGINT/SIGTERM; [`stats`]
//! answers the optional stats socket.

pub mod daemon;
pub mod signals;
pub mod socket;
pub mod stats;
pub mod virtio_gpu;

//! The virtio-gpu device in compute-only mode with the rgpu capset
//! (ARCHITECTURE.md §2): [`backend`] speaks vhost-user, [`device`] answers
//! the control queue, [`request`] reads and decodes requests, [`response`]
//! writes answers (at once or when a fence completes).

pub mod backend;
pub mod device;
pub mod request;
pub mod response;

pub use backend::GpuBackend;
pub use device::{DaemonShared, GpuDevice};

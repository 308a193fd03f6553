//! One worker process per guest process (ARCHITECTURE.md §5).
//!
//! NVIDIA's driver lets every context of a host process reach every
//! registration of that process, and makes some faults fatal for the whole
//! process. So the connection process (vhost-user, the virtio-gpu device
//! model, the guest memory map, fences) runs no CUDA itself: it starts a
//! worker process for each guest process ([`handle`], [`launcher`]) and
//! hands it the descriptors of the guest memory files its blobs lie in and
//! the page runs of those blobs ([`message`], over a [`link`]). The worker
//! ([`serve`]) runs the process's sessions, maps and registers only its own
//! blobs ([`blob_mapping`]), and answers requests that complete later
//! (fences, detaches, destroys). A worker that dies ends only its guest
//! process's contexts.

pub mod accounting;
pub mod blob_mapping;
pub mod containment;
pub mod countdown;
pub mod handle;
pub mod launcher;
pub mod link;
pub mod message;
pub mod seccomp;
pub mod serve;

pub use accounting::Accounting;
pub use countdown::Countdown;
pub use handle::WorkerHandle;
pub use launcher::WorkerLauncher;

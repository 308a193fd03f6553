//! Host sessions (ARCHITECTURE.md §5): a session is one guest CUDA context
//! (one virtio-gpu `CTX_CREATE` with the rgpu capset). It owns a device
//! context of the executor (created by the first command that needs it),
//! its handle tables, the blobs attached to it and a worker thread that
//! drains the channel's command ring in order. Sessions of one guest may
//! share a [`Tenant`], whose sessions NVML's `DeviceStatus` lists.
//!
//! The virtio-gpu device model (in vhost-device-rgpu) only decodes requests
//! and hands them over; it never blocks on the GPU.

pub mod blob;
pub mod budget;
pub mod channel;
pub mod command_profile;
mod completions;
pub mod compute;
pub mod console;
pub mod counters;
pub mod device_ranges;
mod driver_memory;
mod execute;
mod handles;
pub mod ipc;
pub mod limits;
pub mod log_limit;
mod mailbox_bell;
pub mod module_cache;
pub mod session;
pub mod settings;
pub mod shareable;
pub mod shared_ledger;
pub mod tenant;
mod worker;

pub use blob::{Blob, BlobError, DmaRegistration};
pub use budget::{clamp_to_budget, MemoryBudget};
pub use channel::{ChannelError, ReplyTarget};
pub use compute::{Admission, ComputeGate};
pub use counters::{CounterKind, CounterPage, Counters};
pub use ipc::{IpcKind, IpcRegistry};
pub use limits::SessionLimits;
pub use module_cache::ModuleCache;
pub use session::{Completion, Session, SessionError};
pub use settings::SessionSettings;
pub use shareable::ShareableRegistry;
pub use shared_ledger::ShareLedger;
pub use tenant::{Overdue, Tenant, WaitWatch};

/// The guest memory type of the daemon (vhost-user shared memory regions).
pub type GuestMemory = vm_memory::GuestMemoryMmap<()>;
/// Guest memory that may be replaced when the frontend sends a new table.
pub type AtomicGuestMemory = vm_memory::GuestMemoryAtomic<GuestMemory>;

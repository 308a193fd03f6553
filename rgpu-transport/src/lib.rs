//! The guest side of rgpu below the CUDA API: carriers move rgpu-proto
//! batches to the host; a [`channel::Channel`] is one CUDA context's command
//! ring, reply area and bounce area on top of a carrier.

pub mod call_profile;
pub mod carrier;
pub mod channel;
pub mod console;
pub mod context_channel;
pub mod copy_crew;
pub mod guest_memory;
pub mod process_tag;
pub mod remote_channel;

pub use carrier::{BlobMapping, Carrier, CarrierError, FenceToken};
pub use channel::{Channel, Completion, Reply};
pub use context_channel::ContextChannel;

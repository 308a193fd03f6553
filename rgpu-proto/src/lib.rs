//! The rgpu command stream (ARCHITECTURE.md §4).
//!
//! Everything that crosses the guest/host boundary is described here and
//! nowhere else: the capset payload that tells the guest about the host's
//! GPUs, the shared-memory channel layout (command ring and reply area), the
//! commands themselves and their replies.
//!
//! All values are little-endian and explicitly sized. Decoding never trusts a
//! length, an offset or a count: it returns a [`DecodeError`] and never panics.

pub mod batch;
pub mod capset;
pub mod channel;
pub mod command;
pub mod cuda_result;
pub mod elf;
pub mod fatbin;
pub mod futex;
pub mod process_group;
pub mod remote;
pub mod reply;
pub mod stage_samples;
pub mod virtio_gpu;
pub mod wire;

pub use command::{
    BlobRange, Command, CommandHeader, ControlCommand, ControlOpcode, LaunchAttr, Opcode,
};
pub use wire::DecodeError;

/// Version of the command stream. The guest refuses a host whose capset
/// carries another major version. Version 2 added console output to the
/// reply record (`channel::REPLY_OFFSET_CONSOLE_LEN`); version 3 dropped the
/// reserved words from command bodies (one table defines every command);
/// version 4 gave `LaunchKernelEx` the launch attributes it carries;
/// version 5 gave the command header its ring stamp
/// ([`CommandHeader::stamp`], `channel::ring_stamp`).
/// Commands added to the table without changing another (the `Ipc*`
/// commands; the graph-building `GraphCreate`, `GraphClone`,
/// `GraphAdd*Node` (memory-allocation and free nodes, pitched memcpy nodes
/// too), `Graph{Add,Remove}Dependencies` and `GraphDestroyNode`; the
/// node-parameter `Graph*NodeSetParams`, `GraphExecUpdate`, `GraphUpload`
/// and `GraphGetRootNodeCount`; the tensor-map commands,
/// `StreamBeginCaptureToGraph`, `PlaceNextBlob`, the stream memory
/// operations and the shareable-handle `Mem{Export,Import}Shareable`) keep
/// the version: a daemon that does not know one answers it
/// `CUDA_ERROR_INVALID_VALUE` as an undecodable command, and the call fails.
pub const PROTOCOL_VERSION: u32 = 5;

/// The virtio-gpu capability-set id of the rgpu CUDA context type.
///
/// Linux builds its capset mask with a 32-bit shift, so the id must be below
/// 32; ids 1-8 belong to other context types. 23 was seen working with a stock
/// 6.12 guest (REFERENCE-NOTES.md).
pub const CAPSET_ID_RGPU: u32 = 23;

/// Handle of the legacy default stream (`CU_STREAM_LEGACY` and NULL).
pub const STREAM_LEGACY: u32 = 0;
/// Handle of the per-thread default stream (`CU_STREAM_PER_THREAD`).
pub const STREAM_PER_THREAD: u32 = u32::MAX;

/// Largest kernel parameter block CUDA accepts (CUDA 12.1+: 32764 bytes).
pub const MAX_KERNEL_PARAMS_BYTES: usize = 32764;
/// Largest symbol name accepted in a lookup.
pub const MAX_NAME_BYTES: usize = 4096;
/// Largest number of kernel parameters described in a function reply.
pub const MAX_KERNEL_PARAMS: usize = 4096;

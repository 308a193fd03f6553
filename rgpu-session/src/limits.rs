//! Daemon-side bounds on what one guest context may make the daemon hold.
//!
//! Every count and size a guest picks needs a limit on the host, or one
//! guest can exhaust the daemon's memory (and the GPU's, for the others).
//! The defaults sit far above what real programs use; beyond a limit the
//! command fails with the CUDA error named on each constant, and the
//! session goes on working. README.md ("Limits") lists them.

use rgpu_proto::cuda_result::CUDA_ERROR_OUT_OF_MEMORY;

/// Streams one session may have created and not destroyed; beyond it
/// `cuStreamCreate` fails with [`LIMIT_ERROR`].
pub const MAX_STREAMS_PER_SESSION: usize = 4096;

/// Events one session may have created and not destroyed; beyond it
/// `cuEventCreate` fails with [`LIMIT_ERROR`].
pub const MAX_EVENTS_PER_SESSION: usize = 65536;

/// Modules one session may have loaded and not unloaded; beyond it
/// `cuModuleLoad*` fails with [`LIMIT_ERROR`].
pub const MAX_MODULES_PER_SESSION: usize = 4096;

/// Function handles one session may hold (looking a handle up again
/// re-points it and costs nothing); beyond it `cuModuleGetFunction` fails
/// with [`LIMIT_ERROR`].
pub const MAX_FUNCTIONS_PER_SESSION: usize = 65536;

/// Live device allocations of one session; beyond it `cuMemAlloc` fails
/// with [`LIMIT_ERROR`]. Each is a row in the session's table and in its
/// process's device-range map.
pub const MAX_ALLOCATIONS_PER_SESSION: usize = 1_000_000;

/// Module globals one session may have looked up (each distinct global is
/// a row in its process's device-range map; looking one up again costs
/// nothing); beyond it `cuModuleGetGlobal` fails with [`LIMIT_ERROR`].
pub const MAX_GLOBALS_PER_SESSION: usize = 1_000_000;

/// Graphs and executable graphs one session may hold, each kind (a
/// captured graph keeps its kernels' parameters in the driver); beyond it
/// `cuStreamEndCapture` or `cuGraphInstantiate` fails with [`LIMIT_ERROR`].
pub const MAX_GRAPHS_PER_SESSION: usize = 16384;

/// Nodes of graphs built node by node that one session may hold, all its
/// graphs together; a child graph node counts as one plus the nodes of the
/// copy it holds, a clone as many as its original (a kernel node keeps up
/// to 32 KiB of parameters in the driver). Beyond it `cuGraphAdd*Node` or
/// `cuGraphClone` fails with [`LIMIT_ERROR`]. Dependencies per node are
/// bounded where commands are decoded
/// (`rgpu_proto::command::MAX_NODE_DEPENDENCIES`).
pub const MAX_GRAPH_NODES_PER_SESSION: usize = 16384;

/// Largest module image the daemon copies out of guest memory (it must
/// hold the whole image to hand it to the driver and to cache it); a
/// larger one fails with [`LIMIT_ERROR`] before anything is allocated.
pub const MAX_MODULE_IMAGE_BYTES: u64 = 256 << 20;

/// Longest kernel or global name: bounded where commands are decoded
/// (rgpu-proto), so a longer one makes the command undecodable
/// (`CUDA_ERROR_INVALID_VALUE`); restated here so all limits are in one
/// place.
pub const MAX_NAME_BYTES: usize = rgpu_proto::MAX_NAME_BYTES;

/// What a command beyond one of the limits above fails with: the driver's
/// answer when it runs out of what the request needs.
pub const LIMIT_ERROR: u32 = CUDA_ERROR_OUT_OF_MEMORY;

/// The limits a session runs under: the constants above by default;
/// [`crate::Tenant::with_limits`] sets others (tests use tiny ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub streams: usize,
    pub events: usize,
    pub modules: usize,
    pub functions: usize,
    pub allocations: usize,
    pub globals: usize,
    pub graphs: usize,
    pub graph_nodes: usize,
    pub module_image_bytes: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            streams: MAX_STREAMS_PER_SESSION,
            events: MAX_EVENTS_PER_SESSION,
            modules: MAX_MODULES_PER_SESSION,
            functions: MAX_FUNCTIONS_PER_SESSION,
            allocations: MAX_ALLOCATIONS_PER_SESSION,
            globals: MAX_GLOBALS_PER_SESSION,
            graphs: MAX_GRAPHS_PER_SESSION,
            graph_nodes: MAX_GRAPH_NODES_PER_SESSION,
            module_image_bytes: MAX_MODULE_IMAGE_BYTES,
        }
    }
}

/// Fails with [`LIMIT_ERROR`] when a table already holds `limit` entries.
pub(crate) fn check_room(len: usize, limit: usize) -> Result<(), u32> {
    if len >= limit {
        return Err(LIMIT_ERROR);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_runs_out_at_the_limit() {
        assert_eq!(check_room(0, 1), Ok(()));
        assert_eq!(check_room(1, 1), Err(LIMIT_ERROR));
        assert_eq!(check_room(0, 0), Err(LIMIT_ERROR));
        assert_eq!(SessionLimits::default().streams, MAX_STREAMS_PER_SESSION);
    }
}

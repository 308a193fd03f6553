//! A session's handle tables: the guest's u32 handles mapped onto the
//! executor's u64 ones, and the device allocations the session made.

use std::collections::HashMap;

use rgpu_executor::{CuResult, StreamRef};
use rgpu_proto::command::Launch;
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE};
use rgpu_proto::reply::FunctionInfo;
use rgpu_proto::{STREAM_LEGACY, STREAM_PER_THREAD};

use crate::shared_ledger::ShareKey;

/// A physical allocation of the virtual-memory API (`cuMemCreate`).
#[derive(Debug, Clone, Copy)]
pub struct Physical {
    pub handle: u64,
    pub size: u64,
    /// Mappings of it alive now.
    pub mappings: u32,
    /// The guest released its handle; the memory goes with the last
    /// mapping.
    pub released: bool,
    /// Imported from another process's export: its exporter's charge
    /// (the tenant's ledger carries it once the exporter let go).
    pub imported: bool,
}

/// Memory of another process opened through CUDA IPC (held in the
/// tenant's ledger as a [`Physical`] import is).
#[derive(Debug, Clone, Copy)]
pub struct IpcMapping {
    pub size: u64,
    /// Its handle, as the ledger knows it.
    pub key: ShareKey,
    /// Opens not closed yet (the driver answers a handle this context has
    /// open with the same pointer, and counts).
    pub opens: u32,
}

/// What the session knows of a graph's nodes.
#[derive(Debug, Clone, Default)]
pub struct GraphNodes {
    /// The guest handles of the nodes added to it (or copied into it by a
    /// clone), in order.
    pub nodes: Vec<u32>,
    /// Nodes it holds, counting the copies in its child graph nodes.
    pub weight: usize,
    /// Made by stream capture (or cloned from such a graph): the driver
    /// made its nodes, which the session neither counts nor names.
    pub captured: bool,
    /// The device pointers of its memory-allocation nodes.
    pub allocations: Vec<u64>,
    /// It holds memory-allocation or memory-free nodes (which a child
    /// graph may not, and clones and updates do not carry here).
    pub memory_nodes: bool,
    /// Named while its capture goes on (`StreamCaptureGraph`): a capture
    /// that fails takes it along.
    pub named_while_capturing: bool,
}

/// The memory of a graph's memory-allocation node: charged to the tenant
/// from the node's creation until no graph or executable graph of the
/// session holds the node (the driver backs it while the graph runs).
#[derive(Debug, Clone, Copy)]
pub struct GraphAllocation {
    pub size: u64,
    /// The graph and the executable graphs made from it that are alive.
    pub holders: u32,
}

/// A function the guest looked up.
#[derive(Debug, Clone)]
pub struct FunctionEntry {
    pub handle: u64,
    /// Guest handle of the module it belongs to.
    pub module: u32,
    pub info: FunctionInfo,
}

#[derive(Debug, Default)]
pub struct Handles {
    pub streams: HashMap<u32, u64>,
    pub events: HashMap<u32, u64>,
    pub modules: HashMap<u32, u64>,
    pub functions: HashMap<u32, FunctionEntry>,
    /// Virtual memory: physical allocations by guest handle, reservations
    /// and mappings by address (with size, and the mapping's guest handle).
    pub physical: HashMap<u32, Physical>,
    pub reservations: HashMap<u64, u64>,
    pub mappings: HashMap<u64, (u64, u32)>,
    /// Captured graphs and their executable forms.
    pub graphs: HashMap<u32, u64>,
    pub graph_execs: HashMap<u32, u64>,
    /// Per graph (guest handle): its nodes.
    pub graph_contents: HashMap<u32, GraphNodes>,
    /// Guest node handle -> (guest graph handle, executor node).
    pub graph_nodes: HashMap<u32, (u32, u64)>,
    /// Executable graph (guest handle) -> the graph it was instantiated
    /// from (guest handle): whose nodes its node commands may name.
    pub graph_exec_sources: HashMap<u32, u32>,
    /// Device pointer -> memory of a graph's memory-allocation node.
    pub graph_allocations: HashMap<u64, GraphAllocation>,
    /// Executable graph (guest handle) -> the graph allocations it holds.
    pub graph_exec_allocations: HashMap<u32, Vec<u64>>,
    /// Device pointer -> size of every live allocation.
    pub allocations: HashMap<u64, u64>,
    /// Device pointer -> (guest module handle, size) of every global looked
    /// up, until its module is unloaded.
    pub globals: HashMap<u64, (u32, u64)>,
    /// Device pointer -> memory of another process of the tenant opened
    /// through CUDA IPC, until closed (not charged: the exporter's
    /// allocation is).
    pub ipc_mappings: HashMap<u64, IpcMapping>,
    /// What the ledger knows of the session's physical allocations: the
    /// tokens an exported one was shared under, the one an import holds.
    pub physical_shares: HashMap<u32, Vec<ShareKey>>,
    /// The session's allocations exported through CUDA IPC (by start),
    /// under their handles.
    pub ipc_shared: HashMap<u64, ShareKey>,
}

fn lookup(table: &HashMap<u32, u64>, handle: u32) -> CuResult<u64> {
    table.get(&handle).copied().ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// A handle the guest wants to create: non-zero and not in use. A clash is
/// a guest bug; refusing it keeps the old object reachable (and freed at
/// the end) instead of leaking it.
pub fn check_new<V>(table: &HashMap<u32, V>, handle: u32) -> CuResult<()> {
    if handle == 0 || table.contains_key(&handle) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

impl Handles {
    /// Any stream a command may name, including the two default streams.
    pub fn stream(&self, handle: u32) -> CuResult<StreamRef> {
        match handle {
            STREAM_LEGACY => Ok(StreamRef::Legacy),
            STREAM_PER_THREAD => Ok(StreamRef::PerThread),
            h => lookup(&self.streams, h).map(StreamRef::Created),
        }
    }

    pub fn event(&self, handle: u32) -> CuResult<u64> {
        lookup(&self.events, handle)
    }

    pub fn graph(&self, handle: u32) -> CuResult<u64> {
        lookup(&self.graphs, handle)
    }

    pub fn graph_exec(&self, handle: u32) -> CuResult<u64> {
        lookup(&self.graph_execs, handle)
    }

    pub fn module(&self, handle: u32) -> CuResult<u64> {
        lookup(&self.modules, handle)
    }

    pub fn function(&self, handle: u32) -> CuResult<&FunctionEntry> {
        self.functions.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// The executor's function and stream for a launch, once its parameter
    /// buffer has the size the function's reply described.
    pub fn launch_target(&self, launch: &Launch) -> CuResult<(u64, StreamRef)> {
        let entry = self.function(launch.function)?;
        if launch.params.len() != entry.info.buffer_size() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok((entry.handle, self.stream(launch.stream)?))
    }

    /// Nodes of built graphs the session holds, child copies counted.
    pub fn graph_node_weight(&self) -> usize {
        self.graph_contents
            .values()
            .fold(0usize, |sum, g| sum.saturating_add(g.weight))
    }

    /// The executor's nodes for `dependencies`, each a node of `graph`.
    pub fn dependencies(&self, graph: u32, dependencies: &[u32]) -> CuResult<Vec<u64>> {
        dependencies
            .iter()
            .map(|d| match self.graph_nodes.get(d) {
                Some((of, node)) if *of == graph => Ok(*node),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            })
            .collect()
    }

    /// The executor's node for guest node `node`, which must be a node of
    /// `graph` if one is named.
    pub fn graph_node(&self, node: u32, graph: Option<u32>) -> CuResult<u64> {
        match self.graph_nodes.get(&node) {
            Some((of, created)) if graph.is_none_or(|g| g == *of) => Ok(*created),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// The guest handle of the executor's node `created`, 0 for none.
    pub fn guest_node(&self, created: Option<u64>) -> u32 {
        created
            .and_then(|c| {
                self.graph_nodes
                    .iter()
                    .find(|(_, (_, n))| *n == c)
                    .map(|(guest, _)| *guest)
            })
            .unwrap_or(0)
    }

    /// Forgets a graph and its nodes (those the driver made and that were
    /// named when listed too).
    pub fn remove_graph(&mut self, graph: u32) {
        self.graphs.remove(&graph);
        if let Some(contents) = self.graph_contents.remove(&graph) {
            for node in contents.nodes {
                self.graph_nodes.remove(&node);
            }
            if contents.captured {
                self.graph_nodes.retain(|_, (of, _)| *of != graph);
            }
        }
    }

    /// The guest handle of the executor's graph `created`, if it has one.
    pub fn guest_graph(&self, created: u64) -> Option<u32> {
        self.graphs
            .iter()
            .find(|(_, g)| **g == created)
            .map(|(guest, _)| *guest)
    }

    /// Forgets a module and every function and global looked up in it.
    pub fn remove_module(&mut self, handle: u32) {
        self.modules.remove(&handle);
        self.functions.retain(|_, f| f.module != handle);
        self.globals.retain(|_, (module, _)| *module != handle);
    }

    /// `(device pointer, size)` of the globals looked up in a module.
    pub fn globals_of(&self, module: u32) -> Vec<(u64, u64)> {
        self.globals
            .iter()
            .filter(|(_, (m, _))| *m == module)
            .map(|(ptr, (_, size))| (*ptr, *size))
            .collect()
    }

    /// Bytes of device memory charged to the session: still allocated
    /// (virtual-memory allocations included until their last mapping is
    /// gone, graph allocations while held; imports are their exporters').
    pub fn allocated_bytes(&self) -> u64 {
        self.allocations
            .values()
            .chain(
                self.physical
                    .values()
                    .filter(|p| !p.imported)
                    .map(|p| &p.size),
            )
            .chain(self.graph_allocations.values().map(|a| &a.size))
            .fold(0u64, |sum, size| sum.saturating_add(*size))
    }
}

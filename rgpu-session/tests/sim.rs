//! Sessions against the `sim` executor: reference kernels loaded from PTX
//! text, data through zero-copy and staged copies, the gauges at the end.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::sync::Arc;

use guest::*;
use rgpu_executor::sim::SimExecutor;
use rgpu_proto::command::Launch;
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use rgpu_proto::reply::FunctionInfo;
use rgpu_proto::Command;
use rgpu_session::Counters;

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry rgpu_vector_add(
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_0,
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_1,
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_2,
	.param .u32 rgpu_vector_add_param_3
)
{
	ret;
}
.visible .entry rgpu_fill_index(
	.param .u64 .ptr .global .align 4 rgpu_fill_index_param_0,
	.param .u32 rgpu_fill_index_param_1,
	.param .u32 rgpu_fill_index_param_2
)
{
	ret;
}
"#;

const MODULE: u32 = 1;
const VECTOR_ADD: u32 = 2;
const FILL_INDEX: u32 = 3;

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn float_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Loads the reference module and looks up both kernels.
fn load(guest: &mut Guest, session: &rgpu_session::Session) -> (FunctionInfo, FunctionInfo) {
    let result = guest.load_module(session, MODULE, 0, PTX.as_bytes());
    assert_eq!(result, CUDA_SUCCESS);
    let mut get = |function, name: &str| {
        let (result, payload) = guest.call(
            session,
            Command::ModuleGetFunction {
                module: MODULE,
                function,
                name: name.as_bytes().to_vec(),
            },
        );
        assert_eq!(result, CUDA_SUCCESS, "{name}");
        FunctionInfo::decode(&payload).unwrap()
    };
    (
        get(VECTOR_ADD, "rgpu_vector_add"),
        get(FILL_INDEX, "rgpu_fill_index"),
    )
}

fn launch(function: u32, threads: u32, params: Vec<u8>) -> Command {
    Command::LaunchKernel {
        launch: Launch {
            function,
            grid: [threads.div_ceil(128), 1, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 0,
            stream: 0,
            params,
        },
    }
}

#[test]
fn vector_add_with_zero_copy_and_staged_inputs() {
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters.clone());
    let (add, _) = load(&mut guest, &session);
    assert_eq!(add.params.len(), 4);
    assert_eq!(add.buffer_size(), 28);

    let n = 1000u32;
    let bytes = u64::from(n) * 4;
    let (a, b, c) = (
        guest.alloc(&session, bytes),
        guest.alloc(&session, bytes),
        guest.alloc(&session, bytes),
    );
    assert_eq!(Counters::get(&counters.device_memory_bytes), 3 * bytes);
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let ys: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
    // `a` from an application blob (zero-copy), `b` staged in the ring in
    // chunks as the guest library does for pageable memory.
    guest.data.write(65536, &float_bytes(&xs)).unwrap();
    guest.send(
        &session,
        Command::MemcpyHtoD {
            stream: 0,
            dst: a,
            src: Guest::data_range(65536, bytes),
        },
    );
    for (k, chunk) in float_bytes(&ys).chunks(1024).enumerate() {
        let src = guest.stage(&session, chunk);
        guest.send(
            &session,
            Command::MemcpyHtoD {
                stream: 0,
                dst: b + k as u64 * 1024,
                src,
            },
        );
    }
    let mut params = Vec::new();
    for ptr in [a, b, c] {
        params.extend_from_slice(&ptr.to_le_bytes());
    }
    params.extend_from_slice(&n.to_le_bytes());
    guest.send(&session, launch(VECTOR_ADD, n, params));
    let back = guest.read_device(&session, c, 131072, bytes);
    let expected: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| x + y).collect();
    assert_eq!(floats(&back), expected);
    assert_eq!(Counters::get(&counters.zero_copy_bytes), 2 * bytes);
    assert_eq!(Counters::get(&counters.staged_bytes), bytes);
    assert_eq!(Counters::get(&counters.command_errors), 0);

    session.shutdown();
    assert_eq!(Counters::get(&counters.sessions_active), 0);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 0);
}

#[test]
fn many_launches_wrap_the_ring_and_errors_stay_sticky() {
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters.clone());
    let (_, fill) = load(&mut guest, &session);
    assert_eq!(fill.buffer_size(), 16);
    let n = 256u32;
    let out = guest.alloc(&session, u64::from(n) * 4);
    let fill_params = |base: u32| {
        let mut p = out.to_le_bytes().to_vec();
        p.extend_from_slice(&base.to_le_bytes());
        p.extend_from_slice(&n.to_le_bytes());
        p
    };
    // Each launch is 64 bytes of ring: 500 of them wrap it several times.
    for base in 0..500 {
        guest.send(&session, launch(FILL_INDEX, n, fill_params(base * 10)));
    }
    assert!(guest.produced > 3 * RING_SIZE);
    let back = guest.read_device(&session, out, 0, u64::from(n) * 4);
    assert_eq!(u32s(&back), (4990..4990 + n).collect::<Vec<u32>>());

    // A launch with a short parameter buffer, then an unknown stream: the
    // first failure is what the next request reports.
    guest.send(
        &session,
        launch(FILL_INDEX, n, fill_params(0)[..12].to_vec()),
    );
    guest.send(&session, Command::StreamSynchronize { stream: 42 });
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, Command::EventQuery { event: 8 });
    assert_eq!(result, CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(Counters::get(&counters.command_errors), 3);
    session.shutdown();
    assert_eq!(Counters::get(&counters.device_memory_bytes), 0);
}

#[test]
fn module_globals_may_be_copied_until_their_module_is_unloaded() {
    const GLOBALS_PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .global .align 4 .u32 rgpu_counter;\n\
        .visible .global .align 8 .b8 rgpu_table[64];\n";
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters.clone());
    let result = guest.load_module(&session, MODULE, 0, GLOBALS_PTX.as_bytes());
    assert_eq!(result, CUDA_SUCCESS);
    let mut global = |name: &str| {
        let (result, payload) = guest.call(
            &session,
            Command::ModuleGetGlobal {
                module: MODULE,
                name: name.as_bytes().to_vec(),
            },
        );
        assert_eq!(result, CUDA_SUCCESS, "{name}");
        let [ptr, size] = rgpu_proto::reply::decode_u64s::<2>(&payload).unwrap();
        (ptr, size)
    };
    let (table, table_size) = global("rgpu_table");
    assert_eq!(table_size, 64);
    // Looked up twice: the same range, still usable.
    assert_eq!(global("rgpu_table"), (table, 64));
    let (counter, counter_size) = global("rgpu_counter");
    assert_eq!(counter_size, 4);

    let bytes: Vec<u8> = (0..64).collect();
    guest.data.write(4096, &bytes).unwrap();
    let htod = |dst, length| Command::MemcpyHtoD {
        stream: 0,
        dst,
        src: Guest::data_range(4096, length),
    };
    let (result, _) = guest.call(&session, htod(table, 64));
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(
        &session,
        Command::MemcpyDtoD {
            stream: 0,
            dst: counter,
            src: table + 8,
            size: 4,
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    let back = guest.read_device(&session, counter, 8192, 4);
    assert_eq!(back, [8, 9, 10, 11]);
    // Past a global's end.
    let (result, _) = guest.call(&session, htod(table, 65));
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);

    let (result, _) = guest.call(&session, Command::ModuleUnload { module: MODULE });
    assert_eq!(result, CUDA_SUCCESS);
    for dst in [table, counter] {
        let (result, _) = guest.call(&session, htod(dst, 4));
        assert_eq!(result, CUDA_ERROR_INVALID_VALUE, "{dst:#x}");
    }
    assert_eq!(Counters::get(&counters.command_errors), 3);
    session.shutdown();
}

/// A detach (and so the guest's unref, which waits for it) is answered only
/// once the session's queued GPU work can no longer touch the blob: here a
/// kernel that runs 400 ms on the sim's clock.
#[test]
fn a_detach_is_answered_after_the_queued_work() {
    const SPIN_PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry rgpu_spin(.param .u64 rgpu_spin_param_0)\n{\n\tret;\n}\n";
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters);
    let result = guest.load_module(&session, MODULE, 0, SPIN_PTX.as_bytes());
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(
        &session,
        Command::ModuleGetFunction {
            module: MODULE,
            function: 9,
            name: b"rgpu_spin".to_vec(),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    let spin = std::time::Duration::from_millis(400);
    let nanos = u64::try_from(spin.as_nanos()).unwrap();
    guest.send(
        &session,
        Command::LaunchKernel {
            launch: Launch {
                function: 9,
                grid: [1, 1, 1],
                block: [1, 1, 1],
                shared_mem_bytes: 0,
                stream: 0,
                params: nanos.to_le_bytes().to_vec(),
            },
        },
    );
    guest.kick(&session);
    let started = std::time::Instant::now();
    let (done, rx) = signal();
    session.detach_blob_then(DATA_BLOB, done);
    rx.recv_timeout(WAIT).unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= spin - std::time::Duration::from_millis(50),
        "the detach was answered after {waited:?}, before the kernel's end"
    );
    session.shutdown();
}

#[test]
fn graph_node_parameters_and_updates_are_checked_on_the_host() {
    let mut guest = Guest::new();
    let session = guest.start(Arc::new(SimExecutor::new()), Arc::new(Counters::default()));
    load(&mut guest, &session);
    let mut call = |command: Command| guest.call(&session, command);
    let (result, payload) = call(Command::MemAlloc { size: 1024 });
    assert_eq!(result, CUDA_SUCCESS);
    let ptr = u64::from_le_bytes(payload[..8].try_into().unwrap());
    let fill = |base: u32, params_len: usize| {
        let mut params = ptr.to_le_bytes().to_vec();
        params.extend(base.to_le_bytes());
        params.extend(256u32.to_le_bytes());
        params.truncate(params_len);
        Launch {
            function: FILL_INDEX,
            grid: [2, 1, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 0,
            stream: 0,
            params,
        }
    };
    let memset = |dst: u64, width: u64| (dst, 7u32, 4u32, width, 1u64, width * 4);
    let ok = |(result, _): (u32, Vec<u8>)| result;
    // Graph 50: a memset node (60) and a kernel node (61); graph 51: an
    // empty node (70); exec 80 of graph 50.
    for graph in [50, 51] {
        assert_eq!(
            ok(call(Command::GraphCreate { graph, flags: 0 })),
            CUDA_SUCCESS
        );
    }
    let (dst, value, element_size, width, height, pitch) = memset(ptr, 256);
    let add_memset = Command::GraphAddMemsetNode {
        graph: 50,
        node: 60,
        dependencies: vec![],
        dst,
        value,
        element_size,
        width,
        height,
        pitch,
    };
    assert_eq!(ok(call(add_memset)), CUDA_SUCCESS);
    let add_kernel = Command::GraphAddKernelNode {
        graph: 50,
        node: 61,
        dependencies: vec![60],
        launch: fill(5, 16),
    };
    assert_eq!(ok(call(add_kernel)), CUDA_SUCCESS);
    let add_empty = Command::GraphAddEmptyNode {
        graph: 51,
        node: 70,
        dependencies: vec![],
    };
    assert_eq!(ok(call(add_empty)), CUDA_SUCCESS);
    let instantiate = Command::GraphInstantiate {
        graph: 50,
        exec: 80,
        flags: 0,
    };
    assert_eq!(ok(call(instantiate)), CUDA_SUCCESS);

    let kernel_set = |node, launch| Command::GraphKernelNodeSetParams { node, launch };
    let memset_set = |node, (dst, value, element_size, width, height, pitch)| {
        Command::GraphMemsetNodeSetParams {
            node,
            dst,
            value,
            element_size,
            width,
            height,
            pitch,
        }
    };
    let exec_memset_set = |exec, node, (dst, value, element_size, width, height, pitch)| {
        Command::GraphExecMemsetNodeSetParams {
            exec,
            node,
            dst,
            value,
            element_size,
            width,
            height,
            pitch,
        }
    };
    // As set: accepted.
    assert_eq!(ok(call(kernel_set(61, fill(9, 16)))), CUDA_SUCCESS);
    assert_eq!(ok(call(memset_set(60, memset(ptr, 128)))), CUDA_SUCCESS);
    let exec_kernel = Command::GraphExecKernelNodeSetParams {
        exec: 80,
        node: 61,
        launch: fill(11, 16),
    };
    assert_eq!(ok(call(exec_kernel)), CUDA_SUCCESS);
    assert_eq!(
        ok(call(exec_memset_set(80, 60, memset(ptr, 64)))),
        CUDA_SUCCESS
    );
    // No such node, a node of another kind, a parameter buffer of the
    // wrong size, memory of no allocation or past one's end.
    assert_eq!(
        ok(call(kernel_set(999, fill(9, 16)))),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        ok(call(kernel_set(60, fill(9, 16)))),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        ok(call(kernel_set(61, fill(9, 8)))),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        ok(call(memset_set(61, memset(ptr, 16)))),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        ok(call(memset_set(60, memset(ptr + (1 << 36), 16)))),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        ok(call(memset_set(60, memset(ptr, 257)))),
        CUDA_ERROR_INVALID_VALUE
    );
    // An executable graph's set on a node of another graph, or of no
    // executable graph; an upload of no executable graph.
    assert_eq!(
        ok(call(exec_memset_set(80, 70, memset(ptr, 16)))),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        ok(call(exec_memset_set(99, 60, memset(ptr, 16)))),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(
        ok(call(Command::GraphUpload {
            exec: 99,
            stream: 0
        })),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(
        ok(call(Command::GraphUpload {
            exec: 80,
            stream: 0
        })),
        CUDA_SUCCESS
    );
    // An update from a graph of another topology: answered, not applied.
    let (result, payload) = call(Command::GraphExecUpdate {
        exec: 80,
        graph: 51,
    });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(
        rgpu_proto::reply::decode_u64s::<3>(&payload).unwrap(),
        [910, 2, 0]
    );
    let (result, payload) = call(Command::GraphExecUpdate {
        exec: 80,
        graph: 50,
    });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(
        rgpu_proto::reply::decode_u64s::<3>(&payload).unwrap(),
        [0, 0, 0]
    );
    session.shutdown();
}

/// A tenant's memory budget with a limit.
#[derive(Debug)]
struct Limited {
    used: std::sync::atomic::AtomicU64,
    limit: u64,
}

impl rgpu_session::MemoryBudget for Limited {
    fn try_reserve(&self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.used
            .fetch_update(SeqCst, SeqCst, |used| {
                used.checked_add(bytes).filter(|n| *n <= self.limit)
            })
            .is_ok()
    }
    fn charge(&self, bytes: u64) {
        self.used
            .fetch_add(bytes, std::sync::atomic::Ordering::SeqCst);
    }
    fn release(&self, bytes: u64) {
        self.used
            .fetch_sub(bytes, std::sync::atomic::Ordering::SeqCst);
    }
    fn limit(&self) -> Option<u64> {
        Some(self.limit)
    }
    fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn graph_allocations_count_against_the_tenant_while_a_graph_holds_them() {
    use rgpu_proto::cuda_result::{CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY};
    use rgpu_session::MemoryBudget;
    const MIB: u64 = 1 << 20;
    let budget = Arc::new(Limited {
        used: Default::default(),
        limit: 4 * MIB,
    });
    let tenant = rgpu_session::Tenant::with_budget(budget.clone());
    let mut guest = Guest::new();
    let session = guest.start_in(
        Arc::new(SimExecutor::new()),
        Arc::new(Counters::default()),
        tenant,
    );
    let mut call = |command: Command| guest.call(&session, command);
    let alloc = |graph, node, size| Command::GraphAddMemAllocNode {
        graph,
        node,
        dependencies: vec![],
        size,
    };
    let free = |graph, node, dependencies, dptr| Command::GraphAddMemFreeNode {
        graph,
        node,
        dependencies,
        dptr,
    };
    assert_eq!(
        call(Command::GraphCreate {
            graph: 50,
            flags: 0
        })
        .0,
        CUDA_SUCCESS
    );
    let (result, payload) = call(alloc(50, 60, 3 * MIB));
    assert_eq!(result, CUDA_SUCCESS);
    let ptr = rgpu_proto::reply::decode_u64s::<1>(&payload).unwrap()[0];
    assert_eq!(budget.used(), 3 * MIB);
    // Past the limit: neither another node nor a cuMemAlloc.
    assert_eq!(call(alloc(50, 61, 2 * MIB)).0, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        call(Command::MemAlloc { size: 2 * MIB }).0,
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!(budget.used(), 3 * MIB);
    // Its memory is the process's: a memset node may name it; a free node
    // only of a graph allocation's start.
    let set = Command::GraphAddMemsetNode {
        graph: 50,
        node: 62,
        dependencies: vec![60],
        dst: ptr,
        value: 1,
        element_size: 4,
        width: 1024,
        height: 1,
        pitch: 4096,
    };
    assert_eq!(call(set).0, CUDA_SUCCESS);
    assert_eq!(
        call(free(50, 63, vec![62], ptr + 4)).0,
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(call(free(50, 63, vec![62], ptr)).0, CUDA_SUCCESS);
    // Not carried by a clone or a child (as the driver answers).
    assert_eq!(
        call(Command::GraphClone {
            graph: 51,
            original: 50,
            first_node: 70
        })
        .0,
        CUDA_ERROR_NOT_SUPPORTED
    );
    assert_eq!(
        call(Command::GraphCreate {
            graph: 52,
            flags: 0
        })
        .0,
        CUDA_SUCCESS
    );
    let child = Command::GraphAddChildGraphNode {
        graph: 52,
        node: 80,
        dependencies: vec![],
        child: 50,
    };
    assert_eq!(call(child).0, CUDA_ERROR_NOT_SUPPORTED);
    let instantiate = Command::GraphInstantiate {
        graph: 50,
        exec: 90,
        flags: 0,
    };
    assert_eq!(call(instantiate).0, CUDA_SUCCESS);
    // An update from a graph of another shape fails on its topology; one
    // from a twin with an allocation of its own succeeds, and the
    // executable graph then holds the twin's allocation too.
    let (result, payload) = call(Command::GraphExecUpdate {
        exec: 90,
        graph: 52,
    });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(
        rgpu_proto::reply::decode_u64s::<3>(&payload).unwrap(),
        [910, 2, 0]
    );
    assert_eq!(
        call(Command::GraphCreate {
            graph: 53,
            flags: 0
        })
        .0,
        CUDA_SUCCESS
    );
    let (result, payload) = call(alloc(53, 64, MIB));
    assert_eq!(result, CUDA_SUCCESS);
    let twin_ptr = rgpu_proto::reply::decode_u64s::<1>(&payload).unwrap()[0];
    let twin_set = Command::GraphAddMemsetNode {
        graph: 53,
        node: 65,
        dependencies: vec![64],
        dst: twin_ptr,
        value: 2,
        element_size: 4,
        width: 1024,
        height: 1,
        pitch: 4096,
    };
    assert_eq!(call(twin_set).0, CUDA_SUCCESS);
    assert_eq!(call(free(53, 66, vec![65], twin_ptr)).0, CUDA_SUCCESS);
    assert_eq!(budget.used(), 4 * MIB);
    let (result, payload) = call(Command::GraphExecUpdate {
        exec: 90,
        graph: 53,
    });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(
        rgpu_proto::reply::decode_u64s::<3>(&payload).unwrap(),
        [0, 0, 0]
    );
    // The twin's allocations are the executable graph's now: the twin is
    // not instantiated beside it.
    let beside = Command::GraphInstantiate {
        graph: 53,
        exec: 91,
        flags: 0,
    };
    assert_eq!(call(beside).0, CUDA_ERROR_NOT_SUPPORTED);
    assert_eq!(
        call(Command::GraphLaunch {
            exec: 90,
            stream: 0
        })
        .0,
        CUDA_SUCCESS
    );
    // The executable graph still holds both once the graphs are gone.
    assert_eq!(call(Command::GraphDestroy { graph: 50 }).0, CUDA_SUCCESS);
    assert_eq!(call(Command::GraphDestroy { graph: 53 }).0, CUDA_SUCCESS);
    assert_eq!(budget.used(), 4 * MIB);
    assert_eq!(call(Command::GraphExecDestroy { exec: 90 }).0, CUDA_SUCCESS);
    assert_eq!(budget.used(), 0);
    // Gone: no command names it, and the budget has room again.
    let memset = Command::Memset {
        stream: 0,
        dst: ptr,
        value: 0,
        element_size: 4,
        count: 16,
    };
    assert_eq!(call(memset).0, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(call(Command::MemAlloc { size: 2 * MIB }).0, CUDA_SUCCESS);
    session.shutdown();
    assert_eq!(budget.used(), 0);
}

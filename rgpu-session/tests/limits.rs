//! Per-session limits: the N+1th object fails with CUDA_ERROR_OUT_OF_MEMORY
//! and the session goes on; a module image over the limit is refused before
//! the daemon allocates anything for it.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use guest::*;
use rgpu_executor::sim::SimExecutor;
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use rgpu_proto::virtio_gpu::MemEntry;
use rgpu_proto::{BlobRange, Command};
use rgpu_session::limits::{MAX_MODULE_IMAGE_BYTES, MAX_STREAMS_PER_SESSION};
use rgpu_session::{
    AtomicGuestMemory, Blob, Counters, GuestMemory, Session, SessionLimits, Tenant,
};
use vm_memory::GuestAddress;

/// The system allocator, remembering the largest single allocation: what
/// shows whether the daemon allocated a guest-sized buffer.
struct LargestAllocation;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as in alloc.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as in alloc.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as in alloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// A module within TINY's 64 image bytes: one reference kernel.
const TINY_PTX: &str = ".version 8.0\n.entry rgpu_empty()\n{\nret;\n}\n";

const TINY: SessionLimits = SessionLimits {
    streams: 3,
    events: 2,
    modules: 1,
    functions: 2,
    allocations: 2,
    globals: 1,
    graphs: 1,
    graph_nodes: 4,
    module_image_bytes: 64,
};

fn start(limits: SessionLimits) -> (Guest, Session, Arc<Counters>) {
    start_on(Arc::new(SimExecutor::new()), limits)
}

fn start_on(
    executor: Arc<dyn rgpu_executor::Executor>,
    limits: SessionLimits,
) -> (Guest, Session, Arc<Counters>) {
    let guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = Session::spawn_in_tenant(
        1,
        "limits".into(),
        0,
        executor,
        counters.clone(),
        Tenant::with_limits(limits),
    )
    .expect("spawn a session");
    let session = guest.bind(session);
    (guest, session, counters)
}

fn stream_create(stream: u32) -> Command {
    Command::StreamCreate {
        stream,
        flags: 0,
        priority: 0,
    }
}

#[test]
fn the_object_past_each_cap_is_refused_and_the_session_goes_on() {
    let (mut guest, session, counters) = start(TINY);
    let mut call = |command: Command| guest.call(&session, command).0;

    for stream in 1..=3 {
        assert_eq!(call(stream_create(stream)), CUDA_SUCCESS);
    }
    assert_eq!(call(stream_create(4)), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(call(Command::StreamDestroy { stream: 2 }), CUDA_SUCCESS);
    assert_eq!(call(stream_create(4)), CUDA_SUCCESS);

    for event in 1..=2 {
        assert_eq!(call(Command::EventCreate { event, flags: 0 }), CUDA_SUCCESS);
    }
    assert_eq!(
        call(Command::EventCreate { event: 3, flags: 0 }),
        CUDA_ERROR_OUT_OF_MEMORY
    );

    let image = TINY_PTX.as_bytes();
    let load = |module| Command::ModuleLoad {
        module,
        image: Guest::data_range(4096, image.len() as u64),
    };
    guest.data.write(4096, image).expect("write the image");
    let mut call = |command: Command| guest.call(&session, command).0;
    assert_eq!(call(load(1)), CUDA_SUCCESS);
    assert_eq!(call(load(2)), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        call(Command::ModuleLoadCached {
            module: 2,
            hash: [7; 32]
        }),
        CUDA_ERROR_OUT_OF_MEMORY
    );

    let get = |function| Command::ModuleGetFunction {
        module: 1,
        function,
        name: b"rgpu_empty".to_vec(),
    };
    assert_eq!(call(get(10)), CUDA_SUCCESS);
    assert_eq!(call(get(11)), CUDA_SUCCESS);
    // Looking a held handle up again is no new function.
    assert_eq!(call(get(11)), CUDA_SUCCESS);
    assert_eq!(call(get(12)), CUDA_ERROR_OUT_OF_MEMORY);

    // Unloading makes room for a module and its functions again.
    assert_eq!(call(Command::ModuleUnload { module: 1 }), CUDA_SUCCESS);
    assert_eq!(call(load(2)), CUDA_SUCCESS);
    let get = |function| Command::ModuleGetFunction {
        module: 2,
        function,
        name: b"rgpu_empty".to_vec(),
    };
    assert_eq!(call(get(12)), CUDA_SUCCESS);

    let errors = Counters::get(&counters.command_errors);
    assert_eq!(errors, 5);
    let (a, b) = (guest.alloc(&session, 64), guest.alloc(&session, 64));
    let (result, _) = guest.call(&session, Command::MemAlloc { size: 64 });
    assert_eq!(result, CUDA_ERROR_OUT_OF_MEMORY);
    let (result, _) = guest.call(&session, Command::MemFree { device_ptr: a });
    assert_eq!(result, CUDA_SUCCESS);
    let c = guest.alloc(&session, 64);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 128);

    // Still working: a copy through the allocations.
    guest.data.write(0, b"still working").expect("write data");
    let (result, _) = guest.call(
        &session,
        Command::MemcpyHtoD {
            stream: 4,
            dst: b,
            src: Guest::data_range(0, 13),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(
        &session,
        Command::MemcpyDtoD {
            stream: 0,
            dst: c,
            src: b,
            size: 13,
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    let back = guest.read_device(&session, c, 1024, 13);
    assert_eq!(&back, b"still working");
    assert_eq!(Counters::get(&counters.command_errors), errors + 1);
    session.shutdown();
}

/// Captured graphs and executable graphs have a cap each (the sim
/// executor captures).
#[test]
fn graphs_past_the_cap_are_refused() {
    let (mut guest, session, _) = start_on(Arc::new(SimExecutor::new()), TINY);
    let mut call = |command: Command| guest.call(&session, command).0;
    assert_eq!(call(stream_create(1)), CUDA_SUCCESS);
    let capture = |graph| {
        [
            Command::StreamBeginCapture { stream: 1, mode: 1 },
            Command::StreamEndCapture { stream: 1, graph },
        ]
    };
    for command in capture(20) {
        assert_eq!(call(command), CUDA_SUCCESS);
    }
    let [begin, end] = capture(21);
    assert_eq!(call(begin), CUDA_SUCCESS);
    assert_eq!(call(end), CUDA_ERROR_OUT_OF_MEMORY);
    // The refused graph's capture ended all the same: the stream captures
    // again from scratch.
    let [begin, end] = capture(21);
    assert_eq!(call(begin), CUDA_SUCCESS);
    assert_eq!(call(end), CUDA_ERROR_OUT_OF_MEMORY);
    let instantiate = |exec| Command::GraphInstantiate {
        graph: 20,
        exec,
        flags: 0,
    };
    assert_eq!(call(instantiate(30)), CUDA_SUCCESS);
    assert_eq!(call(instantiate(31)), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(call(Command::GraphExecDestroy { exec: 30 }), CUDA_SUCCESS);
    assert_eq!(call(instantiate(31)), CUDA_SUCCESS);
    assert_eq!(call(Command::GraphDestroy { graph: 20 }), CUDA_SUCCESS);
}

#[test]
fn the_default_stream_cap_refuses_the_stream_after_it() {
    let (mut guest, session, counters) = start(SessionLimits::default());
    let cap = u32::try_from(MAX_STREAMS_PER_SESSION).expect("a u32 count");
    for stream in 1..=cap {
        guest.send(&session, stream_create(stream));
    }
    let (result, _) = guest.call(&session, stream_create(cap + 1));
    assert_eq!(result, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(Counters::get(&counters.command_errors), 1);
    let (result, _) = guest.call(&session, Command::StreamSynchronize { stream: cap });
    assert_eq!(result, CUDA_SUCCESS);
    session.shutdown();
}

#[test]
fn a_module_image_over_the_limit_is_refused_without_allocating_it() {
    let (mut guest, session, counters) = start(SessionLimits::default());
    // A blob larger than the limit, in guest memory of its own (mapped,
    // never touched).
    const BIG: u64 = MAX_MODULE_IMAGE_BYTES + (64 << 20);
    const BIG_BLOB: u32 = 3;
    let memory = AtomicGuestMemory::new(
        GuestMemory::from_ranges(&[(GuestAddress(0), BIG as usize)]).expect("map guest memory"),
    );
    let entries = [MemEntry {
        addr: 0,
        length: u32::try_from(BIG).expect("one entry"),
    }];
    let blob = Blob::new(BIG_BLOB, BIG, &entries, &memory).expect("a big blob");
    session.attach_blob(Arc::new(blob));

    let before = LARGEST.load(Ordering::Relaxed);
    for length in [MAX_MODULE_IMAGE_BYTES + 1, BIG] {
        let image = BlobRange {
            resource_id: BIG_BLOB,
            offset: 0,
            length,
        };
        let (result, _) = guest.call(&session, Command::ModuleLoad { module: 1, image });
        assert_eq!(result, CUDA_ERROR_OUT_OF_MEMORY, "{length}");
        let (result, _) = guest.call(
            &session,
            Command::ModuleLoadHashed {
                module: 1,
                hash: [0; 32],
                image,
            },
        );
        assert_eq!(result, CUDA_ERROR_OUT_OF_MEMORY, "{length}");
    }
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest < (16 << 20),
        "the daemon allocated {largest} bytes (before: {before})"
    );
    assert_eq!(Counters::get(&counters.host_cpu_copy_bytes), 0);

    // An image inside the limit still loads.
    let image = TINY_PTX.as_bytes();
    let result = guest.load_module(&session, 1, 0, image);
    assert_eq!(result, CUDA_SUCCESS);
    session.shutdown();
}

#[test]
fn graph_nodes_past_the_cap_and_foreign_dependencies_are_refused() {
    let (mut guest, session, _) = start_on(Arc::new(SimExecutor::new()), TINY);
    let mut call = |command: Command| guest.call(&session, command).0;
    let empty = |node, dependencies: Vec<u32>| Command::GraphAddEmptyNode {
        graph: 20,
        node,
        dependencies,
    };
    assert_eq!(
        call(Command::GraphCreate {
            graph: 20,
            flags: 0
        }),
        CUDA_SUCCESS
    );
    assert_eq!(
        call(Command::GraphCreate {
            graph: 21,
            flags: 0
        }),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!(call(empty(30, vec![])), CUDA_SUCCESS);
    // A node handle in use, an unknown dependency: refused.
    assert_eq!(call(empty(30, vec![])), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(call(empty(31, vec![99])), CUDA_ERROR_INVALID_VALUE);
    for node in 31..34 {
        assert_eq!(call(empty(node, vec![node - 1])), CUDA_SUCCESS);
    }
    // Four nodes: the cap.
    assert_eq!(call(empty(34, vec![33])), CUDA_ERROR_OUT_OF_MEMORY);
    // Destroyed, its nodes are gone (and no dependency of a new graph).
    assert_eq!(call(Command::GraphDestroy { graph: 20 }), CUDA_SUCCESS);
    assert_eq!(
        call(Command::GraphCreate {
            graph: 22,
            flags: 0
        }),
        CUDA_SUCCESS
    );
    let on_22 = |node, dependencies| Command::GraphAddEmptyNode {
        graph: 22,
        node,
        dependencies,
    };
    assert_eq!(call(on_22(40, vec![30])), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(call(on_22(30, vec![])), CUDA_SUCCESS);
}

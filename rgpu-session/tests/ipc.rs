//! CUDA IPC between guest processes of one tenant, at the session level:
//! three processes (each a `Tenant` of the session crate, as each guest
//! process is a worker of its own), A and B sharing a registry (one tenant
//! of the daemon), C with one of its own (another tenant). The sim
//! executor opens a handle of another context of its own at the
//! exporter's address, as one address space, so what an opened mapping
//! allows can be seen here.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::sync::Arc;

use guest::*;
use rgpu_executor::sim::{SimExecutor, SimObserver};
use rgpu_executor::Executor;
use rgpu_proto::command::{IpcHandle, IPC_HANDLE_BYTES};
use rgpu_proto::cuda_result::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;
use rgpu_session::budget::LocalBudget;
use rgpu_session::ipc::LocalIpcRegistry;
use rgpu_session::shareable::{LocalShareableRegistry, ShareableRegistry};
use rgpu_session::shared_ledger::LocalShareLedger;
use rgpu_session::{
    Counters, IpcRegistry, MemoryBudget, Session, SessionSettings, ShareLedger, Tenant,
};

/// A guest process: its own guest memory and one session.
struct Process {
    guest: Guest,
    session: Session,
}

impl Process {
    fn start(
        ctx_id: u32,
        executor: &Arc<dyn Executor>,
        budget: &Arc<LocalBudget>,
        registry: &Arc<LocalIpcRegistry>,
        shareable: &Arc<LocalShareableRegistry>,
        ledger: &Arc<LocalShareLedger>,
    ) -> Self {
        let tenant = Tenant::with_shares(
            Some(budget.clone() as Arc<dyn MemoryBudget>),
            None,
            Some(registry.clone() as Arc<dyn IpcRegistry>),
            Some(shareable.clone() as Arc<dyn ShareableRegistry>),
            Some(ledger.clone() as Arc<dyn ShareLedger>),
            SessionSettings::default(),
        );
        let guest = Guest::new();
        let session = Session::spawn_in_tenant(
            ctx_id,
            format!("ctx{ctx_id}"),
            0,
            executor.clone(),
            Arc::new(Counters::default()),
            tenant,
        )
        .expect("spawn a session");
        let session = guest.bind(session);
        Self { guest, session }
    }

    fn call(&mut self, command: Command) -> (u32, Vec<u8>) {
        self.guest.call(&self.session, command)
    }

    fn rc(&mut self, command: Command) -> u32 {
        self.call(command).0
    }

    fn alloc(&mut self, size: u64) -> u64 {
        self.guest.alloc(&self.session, size)
    }

    fn memset(&mut self, dst: u64, value: u32, count: u64) -> u32 {
        self.rc(Command::Memset {
            stream: 0,
            value,
            dst,
            element_size: 4,
            count,
        })
    }

    fn export_memory(&mut self, device_ptr: u64) -> IpcHandle {
        let (rc, payload) = self.call(Command::IpcGetMemHandle { device_ptr });
        assert_eq!(rc, CUDA_SUCCESS);
        payload.as_slice().try_into().expect("64 bytes")
    }

    fn export_event(&mut self, event: u32) -> IpcHandle {
        let (rc, payload) = self.call(Command::IpcGetEventHandle { event });
        assert_eq!(rc, CUDA_SUCCESS);
        payload.as_slice().try_into().expect("64 bytes")
    }

    /// `(result, pointer, size)` of opening `handle`.
    fn open(&mut self, handle: IpcHandle) -> (u32, u64, u64) {
        let (rc, payload) = self.call(Command::IpcOpenMemHandle { handle, flags: 1 });
        match decode_u64s::<2>(&payload) {
            Ok([ptr, size]) => (rc, ptr, size),
            Err(_) => (rc, 0, 0),
        }
    }

    fn read(&mut self, src: u64, len: u64) -> Vec<u32> {
        u32s(&self.guest.read_device(&self.session, src, 0, len))
    }
}

struct World {
    executor: Arc<dyn Executor>,
    observer: SimObserver,
    budget: Arc<LocalBudget>,
    a: Process,
    b: Process,
    c: Process,
}

fn world() -> World {
    world_limited(None)
}

fn world_limited(limit: Option<u64>) -> World {
    let sim = Arc::new(SimExecutor::new());
    let observer = sim.observer();
    // No per-process device memory: the three processes share the executor.
    let executor: Arc<dyn Executor> = Arc::new(PartialNvml(sim));
    let budget = Arc::new(LocalBudget::with_limit(limit));
    let tenant = Arc::new(LocalIpcRegistry::default());
    let shareable = Arc::new(LocalShareableRegistry::default());
    let ledger = Arc::new(LocalShareLedger::default());
    let other_tenant = Arc::new(LocalIpcRegistry::default());
    let other_shareable = Arc::new(LocalShareableRegistry::default());
    let other_ledger = Arc::new(LocalShareLedger::default());
    let other_budget = Arc::new(LocalBudget::default());
    World {
        a: Process::start(1, &executor, &budget, &tenant, &shareable, &ledger),
        b: Process::start(2, &executor, &budget, &tenant, &shareable, &ledger),
        c: Process::start(
            3,
            &executor,
            &other_budget,
            &other_tenant,
            &other_shareable,
            &other_ledger,
        ),
        executor,
        observer,
        budget,
    }
}

#[test]
fn an_opened_mapping_is_the_openers_memory_and_charged_while_open() {
    let World {
        executor,
        observer,
        budget,
        mut a,
        mut b,
        mut c,
    } = world();
    let ptr = a.alloc(4096);
    assert_eq!(a.memset(ptr, 0xabcd_0123, 1024), CUDA_SUCCESS);
    // Any pointer inside the allocation exports it.
    let handle = a.export_memory(ptr + 16);
    assert_eq!(budget.used(), 4096);

    // B, before opening: A's memory is none of its own.
    assert_eq!(b.memset(ptr, 0, 1), CUDA_ERROR_INVALID_VALUE);
    let (rc, mem, size) = b.open(handle);
    assert_eq!((rc, mem, size), (CUDA_SUCCESS, ptr, 4096));
    assert_eq!(budget.used(), 4096, "the same memory, charged once");
    assert_eq!(b.read(mem, 8), vec![0xabcd_0123; 2]);
    assert_eq!(b.memset(mem, 0x5151_5151, 1024), CUDA_SUCCESS);
    assert_eq!(a.read(ptr + 4092, 4), vec![0x5151_5151]);
    assert_eq!(
        b.memset(mem + 4096, 0, 1),
        CUDA_ERROR_INVALID_VALUE,
        "past it"
    );
    // Memory B opened is not B's to export.
    assert_eq!(
        b.rc(Command::IpcGetMemHandle { device_ptr: mem }),
        CUDA_ERROR_INVALID_VALUE
    );

    // Opened twice, closed twice: usable until the last close.
    assert_eq!(b.open(handle), (CUDA_SUCCESS, mem, 4096));
    assert_eq!(observer.ipc_opens(), 2);
    assert_eq!(
        b.rc(Command::IpcCloseMemHandle { device_ptr: mem }),
        CUDA_SUCCESS
    );
    assert_eq!(b.memset(mem, 1, 1), CUDA_SUCCESS);
    assert_eq!(
        b.rc(Command::IpcCloseMemHandle { device_ptr: mem }),
        CUDA_SUCCESS
    );
    assert_eq!(b.memset(mem, 1, 1), CUDA_ERROR_INVALID_VALUE, "closed");
    assert_eq!(budget.used(), 4096, "A's alone once B closed it");
    assert_eq!(
        b.rc(Command::IpcCloseMemHandle { device_ptr: mem }),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(observer.ipc_opens(), 0);

    // Flags other than CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
    assert_eq!(
        b.rc(Command::IpcOpenMemHandle { handle, flags: 2 }),
        CUDA_ERROR_INVALID_VALUE
    );
    // Another tenant, with the very bytes; a forged handle in A's tenant.
    assert_eq!(c.open(handle).0, CUDA_ERROR_INVALID_HANDLE);
    let mut forged = handle;
    forged[40] ^= 1;
    assert_eq!(b.open(forged).0, CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(b.open([0; IPC_HANDLE_BYTES]).0, CUDA_ERROR_INVALID_HANDLE);

    // A session's end closes what it left open.
    assert_eq!(b.open(handle).0, CUDA_SUCCESS);
    assert_eq!(observer.ipc_opens(), 1);
    // A frees it: the driver keeps it for B, and the tenant's ledger
    // keeps it charged.
    assert_eq!(a.rc(Command::MemFree { device_ptr: ptr }), CUDA_SUCCESS);
    assert_eq!(budget.used(), 4096, "B's open mapping");
    b.session.shutdown();
    assert_eq!(observer.ipc_opens(), 0);
    assert_eq!(budget.used(), 0, "nothing once B's session ended");
    let mut b = Process::start(
        4,
        &executor,
        &budget,
        &Arc::new(LocalIpcRegistry::default()),
        &Arc::new(LocalShareableRegistry::default()),
        &Arc::new(LocalShareLedger::default()),
    );
    assert_eq!(
        b.open(handle).0,
        CUDA_ERROR_INVALID_HANDLE,
        "another registry"
    );
    c.session.shutdown();
    b.session.shutdown();
    a.session.shutdown();
}

#[test]
fn memory_an_opener_holds_counts_after_its_exporter_freed_it() {
    let World {
        executor: _,
        observer,
        budget,
        mut a,
        mut b,
        c,
    } = world_limited(Some(6144));
    let ptr = a.alloc(4096);
    let handle = a.export_memory(ptr);
    let (rc, mem, _) = b.open(handle);
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(budget.used(), 4096, "charged once");
    assert_eq!(a.rc(Command::MemFree { device_ptr: ptr }), CUDA_SUCCESS);
    assert_eq!(budget.used(), 4096, "B holds it");
    // Without the ledger A could allocate it again, and again.
    assert_eq!(
        a.rc(Command::MemAlloc { size: 4096 }),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!(
        b.rc(Command::IpcCloseMemHandle { device_ptr: mem }),
        CUDA_SUCCESS
    );
    assert_eq!(observer.ipc_opens(), 0);
    assert_eq!(budget.used(), 0);
    assert_eq!(a.rc(Command::MemAlloc { size: 4096 }), CUDA_SUCCESS);
    c.session.shutdown();
    b.session.shutdown();
    a.session.shutdown();
    assert_eq!(budget.used(), 0);
}

#[test]
fn memory_exported_twice_is_carried_once_after_its_exporter_let_go() {
    const SIZE: u64 = 2 << 20;
    let World {
        executor: _,
        observer: _,
        budget,
        mut a,
        mut b,
        c,
    } = world_limited(Some(3 * SIZE));
    assert_eq!(
        a.rc(Command::MemCreate {
            handle: 1,
            size: SIZE
        }),
        CUDA_SUCCESS
    );
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let (rc, token) = a.call(Command::MemExportShareable { handle: 1 });
        assert_eq!(rc, CUDA_SUCCESS);
        tokens.push(<[u8; 32]>::try_from(token.as_slice()).expect("a 32-byte token"));
    }
    for (handle, token) in (1..).zip(tokens) {
        let (rc, size) = b.call(Command::MemImportShareable { handle, token });
        assert_eq!(rc, CUDA_SUCCESS);
        assert_eq!(decode_u64s::<1>(&size).expect("a size"), [SIZE]);
    }
    assert_eq!(budget.used(), SIZE, "charged to its exporter once");
    assert_eq!(a.rc(Command::MemRelease { handle: 1 }), CUDA_SUCCESS);
    // B holds it twice: the ledger carries it once (twice, the tenant
    // could no longer allocate what its limit leaves).
    assert_eq!(budget.used(), SIZE, "carried once");
    assert_eq!(
        a.rc(Command::MemCreate {
            handle: 2,
            size: 2 * SIZE
        }),
        CUDA_SUCCESS
    );
    assert_eq!(a.rc(Command::MemRelease { handle: 2 }), CUDA_SUCCESS);
    assert_eq!(b.rc(Command::MemRelease { handle: 1 }), CUDA_SUCCESS);
    assert_eq!(budget.used(), SIZE, "one import still holds it");
    assert_eq!(b.rc(Command::MemRelease { handle: 2 }), CUDA_SUCCESS);
    assert_eq!(budget.used(), 0);
    c.session.shutdown();
    b.session.shutdown();
    a.session.shutdown();
    assert_eq!(budget.used(), 0);
}

#[test]
fn exports_go_with_their_memory_their_event_and_their_session() {
    let World {
        executor: _,
        observer,
        budget,
        mut a,
        mut b,
        c,
    } = world();
    let first = a.alloc(4096);
    let second = a.alloc(8192);
    let (one, two) = (a.export_memory(first), a.export_memory(second));
    assert_ne!(one, two);
    assert_eq!(
        a.rc(Command::IpcGetMemHandle { device_ptr: 0x1234 }),
        CUDA_ERROR_INVALID_VALUE,
        "no allocation"
    );
    // An event: only its handle's opener may wait for it.
    assert_eq!(
        a.rc(Command::EventCreate { event: 1, flags: 6 }),
        CUDA_SUCCESS
    );
    let event = a.export_event(1);
    assert_eq!(
        b.rc(Command::IpcOpenEventHandle {
            event: 5,
            handle: event
        }),
        CUDA_SUCCESS
    );
    assert_eq!(b.rc(Command::EventSynchronize { event: 5 }), CUDA_SUCCESS);
    assert_eq!(
        b.rc(Command::IpcOpenEventHandle {
            event: 5,
            handle: event
        }),
        CUDA_ERROR_INVALID_VALUE,
        "guest handle in use"
    );
    assert_eq!(b.rc(Command::EventDestroy { event: 5 }), CUDA_SUCCESS);

    // A frees the first allocation and destroys its event: refused.
    assert_eq!(a.rc(Command::MemFree { device_ptr: first }), CUDA_SUCCESS);
    assert_eq!(b.open(one).0, CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(b.open(two).0, CUDA_SUCCESS, "the other stays");
    assert_eq!(
        b.rc(Command::IpcCloseMemHandle { device_ptr: second }),
        CUDA_SUCCESS
    );
    assert_eq!(a.rc(Command::EventDestroy { event: 1 }), CUDA_SUCCESS);
    assert_eq!(
        b.rc(Command::IpcOpenEventHandle {
            event: 6,
            handle: event
        }),
        CUDA_ERROR_INVALID_HANDLE
    );

    // A's session ends with the second allocation exported.
    a.session.shutdown();
    assert_eq!(b.open(two).0, CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(budget.used(), 0);
    assert_eq!(observer.ipc_opens(), 0);
    b.session.shutdown();
    c.session.shutdown();
}

//! NVML's `DeviceStatus` and the lazily created device context: a session
//! that only asks for the device's state never creates a context; the
//! first command that needs one creates it (or fails with its error); a
//! tenant's sessions with a context are listed with their memory.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::sync::Arc;

use guest::*;
use rgpu_executor::sim::{
    SimExecutor, SIM_DRIVER_VERSION_STRING, SIM_GPU_UTILIZATION, SIM_TOTAL_MEM,
};
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use rgpu_proto::reply::{DeviceStatus, SessionUsage, UTILIZATION_UNKNOWN};
use rgpu_proto::Command;
use rgpu_session::{Counters, Session, Tenant};

fn status(guest: &mut Guest, session: &Session) -> DeviceStatus {
    let (result, payload) = guest.call(session, Command::DeviceStatus { device: 0 });
    assert_eq!(result, CUDA_SUCCESS);
    DeviceStatus::decode(&payload).expect("a DeviceStatus payload")
}

#[test]
fn device_status_needs_no_context_and_the_first_command_creates_it() {
    let mut guest = Guest::new();
    let sim = Arc::new(SimExecutor::new());
    let observer = sim.observer();
    let executor = Arc::new(PartialNvml(sim));
    let counters = Arc::new(Counters::default());
    let session = guest.start(executor, counters.clone());
    assert_eq!(Counters::get(&counters.sessions_active), 1);

    let first = status(&mut guest, &session);
    assert_eq!(
        first,
        DeviceStatus {
            free: SIM_TOTAL_MEM,
            total: SIM_TOTAL_MEM,
            gpu_utilization: SIM_GPU_UTILIZATION,
            memory_utilization: UTILIZATION_UNKNOWN,
            driver_version: SIM_DRIVER_VERSION_STRING.into(),
            sessions: Vec::new(),
        }
    );
    assert_eq!(observer.contexts_created(), 0);
    let (result, _) = guest.call(&session, Command::DeviceStatus { device: 3 });
    assert_eq!(result, CUDA_ERROR_INVALID_DEVICE);

    guest.alloc(&session, 5000);
    assert_eq!(observer.contexts_created(), 1);
    let ptr = guest.alloc(&session, 3000);
    assert_eq!(
        status(&mut guest, &session).sessions,
        vec![SessionUsage {
            ctx_id: 7,
            pid: 0,
            device_memory: 8000
        }]
    );
    let (result, _) = guest.call(&session, Command::MemFree { device_ptr: ptr });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(status(&mut guest, &session).sessions[0].device_memory, 5000);
    assert_eq!(observer.contexts_created(), 1);
    session.shutdown();
    assert_eq!(observer.live_contexts(), 0);
    assert_eq!(Counters::get(&counters.device_memory_bytes), 0);
}

#[test]
fn a_context_creation_failure_is_the_result_of_the_commands_that_need_it() {
    let mut guest = Guest::new();
    let executor = Arc::new(SimExecutor::new());
    let observer = executor.observer();
    observer.fail_context_creation(Some(CUDA_ERROR_OUT_OF_MEMORY));
    let counters = Arc::new(Counters::default());
    let session = guest.start(executor.clone(), counters.clone());
    // Detaching a blob before any context exists has nothing to wait for.
    session.detach_blob(DATA_BLOB);

    let (result, _) = guest.call(&session, Command::MemAlloc { size: 64 });
    assert_eq!(result, CUDA_ERROR_OUT_OF_MEMORY);
    // Remembered: no second attempt, the same answer.
    observer.fail_context_creation(None);
    let (result, _) = guest.call(&session, Command::CtxSynchronize);
    assert_eq!(result, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(observer.contexts_created(), 0);
    // NVML still answers.
    assert!(status(&mut guest, &session).sessions.is_empty());
    session.shutdown();
    assert_eq!(Counters::get(&counters.sessions_active), 0);
}

#[test]
fn a_tenant_lists_its_own_sessions_with_a_context() {
    let executor = Arc::new(SimExecutor::new());
    let observer = executor.observer();
    let counters = Arc::new(Counters::default());
    let tenant = Tenant::new();
    let spawn = |ctx_id: u32, tenant: Arc<Tenant>| {
        Session::spawn_in_tenant(
            ctx_id,
            format!("s{ctx_id}"),
            0,
            executor.clone(),
            counters.clone(),
            tenant,
        )
        .unwrap()
    };
    let mut cuda_guest = Guest::new();
    let cuda = cuda_guest.bind(spawn(1, tenant.clone()));
    let mut nvml_guest = Guest::new();
    let nvml = nvml_guest.bind(spawn(2, tenant.clone()));
    let mut other_guest = Guest::new();
    let other = other_guest.bind(spawn(3, Tenant::new()));
    assert_eq!(tenant.session_count(), 2);

    cuda_guest.alloc(&cuda, 1 << 20);
    other_guest.alloc(&other, 4096);
    let expected = vec![SessionUsage {
        ctx_id: 1,
        pid: 0,
        device_memory: 1 << 20,
    }];
    assert_eq!(status(&mut nvml_guest, &nvml).sessions, expected);
    assert_eq!(
        status(&mut other_guest, &other).sessions,
        vec![SessionUsage {
            ctx_id: 3,
            pid: 0,
            device_memory: 4096
        }]
    );
    cuda.shutdown();
    assert!(status(&mut nvml_guest, &nvml).sessions.is_empty());
    assert_eq!(tenant.session_count(), 1);
    nvml.shutdown();
    other.shutdown();
    assert_eq!(tenant.session_count(), 0);
    assert_eq!(observer.live_contexts(), 0);
}

//! The module cache through sessions: an image sent once (by any session
//! with the same settings, as the daemon gives every process of a tenant)
//! loads again by hash alone; a hash the image does not have is refused; a
//! miss is an answer, not an error.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod guest;

use std::sync::Arc;

use guest::*;
use rgpu_executor::sim::SimExecutor;
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS};
use rgpu_proto::reply::FunctionInfo;
use rgpu_proto::Command;
use rgpu_session::module_cache::image_hash;
use rgpu_session::{Counters, SessionSettings, Tenant};

/// A PTX module unique to `tag`, so no test finds another's image.
fn ptx(tag: &str) -> Vec<u8> {
    format!(
        "// {tag}\n.version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .global .align 4 .u32 counter;\n\
         .visible .entry rgpu_fill_index(\n\
         \t.param .u64 .ptr .global .align 4 p0,\n\t.param .u32 p1,\n\t.param .u32 p2\n)\n{{\n\tret;\n}}\n"
    )
    .into_bytes()
}

fn fill_index_info(
    guest: &mut Guest,
    session: &rgpu_session::Session,
    module: u32,
) -> FunctionInfo {
    let (result, payload) = guest.call(
        session,
        Command::ModuleGetFunction {
            module,
            function: module + 100,
            name: b"rgpu_fill_index".to_vec(),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    FunctionInfo::decode(&payload).unwrap()
}

#[test]
fn an_image_sent_once_loads_by_hash_in_any_session() {
    let image = ptx("sent once");
    let hash = image_hash(&image);
    let executor = Arc::new(SimExecutor::new());
    let counters = Arc::new(Counters::default());

    // Two tenants (two guests) of one daemon: their settings share the
    // cache.
    let settings = SessionSettings::default();
    let mut first = Guest::new();
    let session = first.start_in(
        executor.clone(),
        counters.clone(),
        Tenant::with_settings(settings.clone()),
    );
    // Not cached yet: NOT_FOUND, the handle stays free, no error counted.
    let (result, _) = first.call(&session, Command::ModuleLoadCached { module: 1, hash });
    assert_eq!(result, CUDA_ERROR_NOT_FOUND);
    assert_eq!(Counters::get(&counters.command_errors), 0);
    first.data.write(0, &image).unwrap();
    let (result, _) = first.call(
        &session,
        Command::ModuleLoadHashed {
            module: 1,
            hash,
            image: Guest::data_range(0, image.len() as u64),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(fill_index_info(&mut first, &session, 1).params.len(), 3);
    // In the same session, under another handle, without the image.
    let (result, _) = first.call(&session, Command::ModuleLoadCached { module: 2, hash });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(fill_index_info(&mut first, &session, 2).params.len(), 3);
    // A handle in use is refused, cached or not.
    let (result, _) = first.call(&session, Command::ModuleLoadCached { module: 2, hash });
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    session.shutdown();

    // Another session (another process, another VM) gets it by hash alone.
    let mut second = Guest::new();
    let session = second.start_in(executor, counters.clone(), Tenant::with_settings(settings));
    let (result, _) = second.call(&session, Command::ModuleLoadCached { module: 5, hash });
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(fill_index_info(&mut second, &session, 5).params.len(), 3);
    let (result, payload) = second.call(
        &session,
        Command::ModuleGetGlobal {
            module: 5,
            name: b"counter".to_vec(),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(payload.len(), 16);
    session.shutdown();

    assert_eq!(Counters::get(&counters.module_cache_hits), 2);
    assert_eq!(Counters::get(&counters.command_errors), 1);
}

#[test]
fn plain_module_load_fills_the_cache_too() {
    let image = ptx("plain load");
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters.clone());
    let result = guest.load_module(&session, 1, 0, &image);
    assert_eq!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(
        &session,
        Command::ModuleLoadCached {
            module: 2,
            hash: image_hash(&image),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(Counters::get(&counters.module_cache_hits), 1);
    session.shutdown();
}

#[test]
fn an_image_that_does_not_match_its_hash_is_refused_and_not_cached() {
    let image = ptx("mismatch");
    let claimed = image_hash(&ptx("what the guest claims"));
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters.clone());
    guest.data.write(0, &image).unwrap();
    let (result, _) = guest.call(
        &session,
        Command::ModuleLoadHashed {
            module: 1,
            hash: claimed,
            image: Guest::data_range(0, image.len() as u64),
        },
    );
    assert_eq!(result, CUDA_ERROR_INVALID_VALUE);
    // Neither the claimed hash nor the real one was recorded.
    for hash in [claimed, image_hash(&image)] {
        let (result, _) = guest.call(&session, Command::ModuleLoadCached { module: 1, hash });
        assert_eq!(result, CUDA_ERROR_NOT_FOUND);
    }
    // The handle is still free for a correct load.
    let (result, _) = guest.call(
        &session,
        Command::ModuleLoadHashed {
            module: 1,
            hash: image_hash(&image),
            image: Guest::data_range(0, image.len() as u64),
        },
    );
    assert_eq!(result, CUDA_SUCCESS);
    assert_eq!(Counters::get(&counters.command_errors), 1);
    assert_eq!(Counters::get(&counters.module_cache_hits), 0);
    session.shutdown();
}

#[test]
fn an_image_the_executor_refuses_is_not_cached() {
    let image = b"not a module at all\0".to_vec();
    let hash = image_hash(&image);
    let mut guest = Guest::new();
    let counters = Arc::new(Counters::default());
    let session = guest.start(Arc::new(SimExecutor::new()), counters);
    guest.data.write(0, &image).unwrap();
    let (result, _) = guest.call(
        &session,
        Command::ModuleLoadHashed {
            module: 1,
            hash,
            image: Guest::data_range(0, image.len() as u64),
        },
    );
    assert_ne!(result, CUDA_SUCCESS);
    let (result, _) = guest.call(&session, Command::ModuleLoadCached { module: 1, hash });
    assert_eq!(result, CUDA_ERROR_NOT_FOUND);
    session.shutdown();
}

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::sync::Mutex;

use rgpu_proto::cuda_result::*;

use super::integrity::{self, hmac_md2, DeviceIdentity, HashInput, Md2};
use super::*;
use crate::exports::cuGetExportTable;

/// Sizes in bytes driver 580 hands out (shared/cuda-driver-requests.txt).
const RECORDED: [(&str, Option<usize>); 10] = [
    ("6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9", Some(104)),
    ("42D85A81-23F6-CB47-8298-F6E78A3AECDC", Some(24)),
    ("A094798C-2E74-2E74-93F2-0800200C0A66", Some(56)),
    ("C693336E-1121-DF11-A8C3-68F355D89593", None),
    ("D4082055-BDE6-704B-8D34-BA123C66E1F2", Some(24)),
    ("263E8860-7CD2-6143-92F6-BBD5006DFA7E", Some(120)),
    ("F8CFF951-2146-8B4E-B9E2-FB469E7C0DD9", Some(24)),
    ("21318C60-9714-3248-8CA6-41FF7324C8F2", Some(744)),
    ("69A28E9F-2449-8B47-B030-C5DA330EA4E9", Some(272)),
    ("DA9151D3-3AE6-CC41-A5C0-4F26D533E328", Some(56)),
];

fn parse_uuid(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    bytes
}

fn export_table(uuid: &[u8; 16]) -> (u32, *const usize) {
    let mut table: *const c_void = std::ptr::dangling();
    let rc = cuGetExportTable(&mut table, uuid);
    (rc, table.cast())
}

fn slot(table: *const usize, index: usize) -> usize {
    // SAFETY: tests only read slots within the table's known length.
    unsafe { table.add(index).read() }
}

#[test]
fn uuids_print_as_the_recording_does() {
    for (text, _) in RECORDED {
        assert_eq!(uuid_text(&parse_uuid(text)), text);
    }
    // CUuuid byte order: the first byte is the first printed pair.
    assert_eq!(TABLES[RUNTIME].uuid[..4], [0x6B, 0xD5, 0xFB, 0x6C]);
}

#[test]
fn every_recorded_table_is_served_with_its_recorded_size() {
    for (text, size) in RECORDED {
        let uuid = parse_uuid(text);
        let (rc, table) = export_table(&uuid);
        assert_eq!(rc, CUDA_SUCCESS, "{text}");
        let served = find(&uuid).unwrap();
        assert_eq!(table, served.slots.as_ptr().cast(), "{text}");
        match size {
            Some(bytes) => {
                assert!(served.sized, "{text}");
                assert_eq!(slot(table, 0), bytes, "{text}");
                assert_eq!(served.slots.len() * 8, bytes, "{text}");
            }
            None => {
                assert!(!served.sized, "{text}");
                assert!(slot(table, 0) > 4096, "{text}: slot 0 is a function");
            }
        }
    }
}

#[test]
fn every_slot_is_a_distinct_function() {
    let mut seen = BTreeSet::new();
    for t in &TABLES {
        let first = usize::from(t.sized);
        for (i, s) in t.slots.iter().enumerate().skip(first) {
            assert!(s.value() > 4096, "{} slot {i} is not a function", t.name);
            assert!(seen.insert(s.value()), "{} slot {i} is shared", t.name);
        }
    }
}

#[test]
fn unknown_uuids_and_bad_arguments_are_refused() {
    let (rc, table) = export_table(&[0x55; 16]);
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    assert!(table.is_null());
    let uuid = TABLES[RUNTIME].uuid;
    assert_eq!(
        cuGetExportTable(std::ptr::null_mut(), &uuid),
        CUDA_ERROR_INVALID_VALUE
    );
    let mut table: *const c_void = std::ptr::null();
    assert_eq!(
        cuGetExportTable(&mut table, std::ptr::null()),
        CUDA_ERROR_INVALID_VALUE
    );
}

#[test]
fn refusal_list_matches_prefixes() {
    let uuid = TABLES[F8CFF951].uuid;
    assert!(listed("f8cff951", &uuid));
    assert!(listed("263e8860, F8CF-F951-2146", &uuid));
    assert!(!listed("263e8860", &uuid));
    assert!(!listed(" , ", &uuid));
}

type Unknown4 = extern "C" fn(usize, usize, usize, usize) -> u32;

#[test]
fn unknown_slots_answer_not_supported() {
    let f: Unknown4 =
        // SAFETY: the slot holds an `unknown` function of this signature.
        unsafe { std::mem::transmute(TABLES[CONTEXT_STREAM].slots[92].value()) };
    assert_eq!(f(1, 2, 3, 4), CUDA_ERROR_NOT_SUPPORTED);
    assert_eq!(f(1, 2, 3, 4), CUDA_ERROR_NOT_SUPPORTED);
}

type Buffer = extern "C" fn(*mut *mut c_void, *mut usize);

#[test]
fn tool_hooks_hand_out_writable_buffers() {
    for (index, len) in [(2usize, 1024usize), (6, 14)] {
        // SAFETY: hook slots 2 and 6 have this signature.
        let f: Buffer = unsafe { std::mem::transmute(TABLES[TOOLS_HOOKS].slots[index].value()) };
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        f(&mut ptr, &mut size);
        assert_eq!(size, len);
        assert!(!ptr.is_null());
        // SAFETY: at least `len` u32 (and `len` u64) are backed.
        let words = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u64>(), len) };
        assert!(words.iter().all(|w| *w == 0));
        // The same buffer every time.
        let mut again: *mut c_void = std::ptr::null_mut();
        f(&mut again, std::ptr::null_mut());
        assert_eq!(again, ptr);
    }
}

type ContextCheck = extern "C" fn(*mut c_void, *mut u32, *mut *const c_void) -> u32;

#[test]
fn context_check_clears_the_flag_and_keeps_the_pointer() {
    // SAFETY: slot 2 has this signature.
    let f: ContextCheck = unsafe { std::mem::transmute(TABLES[CONTEXT_CHECKS].slots[2].value()) };
    let mut flag = 7u32;
    let marker = 0x1234usize as *const c_void;
    let mut other = marker;
    assert_eq!(f(std::ptr::null_mut(), &mut flag, &mut other), CUDA_SUCCESS);
    assert_eq!((flag, other), (0, marker));
    // SAFETY: slot 3 takes nothing and returns a u32.
    let g: extern "C" fn() -> u32 =
        unsafe { std::mem::transmute(TABLES[CONTEXT_CHECKS].slots[3].value()) };
    assert_eq!(g(), 0);
}

static DESTROYED: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());

extern "C" fn record_destruction(ctx: *mut c_void, key: *mut c_void, value: *mut c_void) {
    DESTROYED
        .lock()
        .unwrap()
        .push((ctx as usize, key as usize, value as usize));
}

#[test]
fn context_local_storage_round_trip_and_destructors() {
    use crate::context_storage::{context_destroyed, forget_at, lookup_at, store_at};
    let (ctx, other) = (0xC0_0000usize, 0xC1_0000usize);
    assert_eq!(lookup_at(ctx, 1), Err(CUDA_ERROR_INVALID_HANDLE));
    store_at(ctx, 1, 0x100, Some(record_destruction)).unwrap();
    store_at(ctx, 2, 0x200, None).unwrap();
    store_at(other, 1, 0x300, Some(record_destruction)).unwrap();
    assert_eq!(lookup_at(ctx, 1), Ok(0x100));
    assert_eq!(lookup_at(other, 1), Ok(0x300));
    store_at(ctx, 2, 0x201, None).unwrap();
    assert_eq!(lookup_at(ctx, 2), Ok(0x201));
    forget_at(ctx, 2).unwrap();
    assert_eq!(lookup_at(ctx, 2), Err(CUDA_ERROR_INVALID_HANDLE));

    context_destroyed(ctx as *mut c_void);
    assert_eq!(lookup_at(ctx, 1), Err(CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(lookup_at(other, 1), Ok(0x300));
    let destroyed = DESTROYED.lock().unwrap().clone();
    assert_eq!(destroyed, vec![(ctx, 1, 0x100)]);
    context_destroyed(other as *mut c_void);
    assert_eq!(DESTROYED.lock().unwrap().len(), 2);
}

type StorageGet = extern "C" fn(*mut *mut c_void, *mut c_void, *mut c_void) -> u32;

#[test]
fn context_local_storage_slots_need_a_context() {
    if std::env::var_os("RGPU_SOCKET").is_some() {
        return;
    }
    // SAFETY: slot 2 has this signature.
    let get: StorageGet = unsafe { std::mem::transmute(TABLES[CONTEXT_STORAGE].slots[2].value()) };
    let mut value: *mut c_void = std::ptr::null_mut();
    let rc = get(&mut value, std::ptr::null_mut(), 8 as *mut c_void);
    assert_eq!(rc, CUDA_ERROR_NOT_INITIALIZED);
    assert_eq!(
        get(std::ptr::null_mut(), std::ptr::null_mut(), 8 as *mut c_void),
        CUDA_ERROR_INVALID_VALUE
    );
}

fn md2_hex(data: &[u8]) -> String {
    let mut h = Md2::default();
    h.update(data);
    h.finish().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn md2_matches_rfc_1319() {
    assert_eq!(md2_hex(b""), "8350e5a3e24c153df2275c9f80692773");
    assert_eq!(md2_hex(b"a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
    assert_eq!(md2_hex(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
    assert_eq!(
        md2_hex(b"message digest"),
        "ab4f496bfb2a530b219ff33031fe06b0"
    );
    assert_eq!(
        md2_hex(
            b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
        ),
        "d5976f79d83d3a0dc9806c3c66f3efd8"
    );
}

#[test]
fn hmac_is_two_md2_passes_over_the_padded_key() {
    let key = [7u8; 16];
    let mut inner = Md2::default();
    inner.update(&[7 ^ 0x36; 16]);
    inner.update(b"data");
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&[7 ^ 0x5c; 16]);
    outer.update(&inner);
    assert_eq!(hmac_md2(&key, b"data"), outer.finish());
    assert_ne!(hmac_md2(&key, b"data"), hmac_md2(&key, b"datb"));
}

fn sample_input(version: u32) -> HashInput {
    HashInput {
        driver_version: 13000,
        version,
        process: 4242,
        thread: 0xF79C_1000,
        runtime_table: 0x7fff_0000_1000,
        integrity_table: 0x7fff_0000_2000,
        function: 0x7fff_0000_3000,
        unix_seconds: 1_790_000_000,
        devices: vec![DeviceIdentity {
            uuid: [0xAB; 16],
            pci_domain: 0,
            pci_bus: 0x1b,
            pci_device: 0,
        }],
    }
}

#[test]
fn integrity_answers_depend_on_every_input() {
    // Versions ending in 0 and 1 get fixed answers.
    assert_eq!(
        integrity::answer(&sample_input(13000)),
        [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]
    );
    assert_eq!(
        integrity::answer(&sample_input(13001)),
        [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8]
    );
    let base = integrity::answer(&sample_input(13002));
    assert_eq!(base, integrity::answer(&sample_input(13002)));
    let mut later = sample_input(13002);
    later.unix_seconds += 1;
    assert_ne!(integrity::answer(&later), base);
    let mut other_thread = sample_input(13002);
    other_thread.thread += 1;
    assert_ne!(integrity::answer(&other_thread), base);
    let mut other_bus = sample_input(13002);
    other_bus.devices[0].pci_bus += 1;
    assert_ne!(integrity::answer(&other_bus), base);
    let mut no_device = sample_input(13002);
    no_device.devices.clear();
    assert_ne!(integrity::answer(&no_device), base);
}

type Integrity = extern "C" fn(u32, u64, *mut [u64; 2]) -> u32;

#[test]
fn integrity_slot_answers_fixed_versions_without_a_driver() {
    // SAFETY: slot 1 has this signature.
    let f: Integrity = unsafe { std::mem::transmute(TABLES[INTEGRITY].slots[1].value()) };
    let mut out = [0u64; 2];
    assert_eq!(f(13000, 1_790_000_000, &mut out), CUDA_SUCCESS);
    assert_eq!(out, [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]);
    assert_eq!(f(13002, 1, std::ptr::null_mut()), CUDA_ERROR_INVALID_VALUE);
    if std::env::var_os("RGPU_SOCKET").is_none() {
        // The full hash needs the devices: not before cuInit.
        assert_eq!(f(13002, 1, &mut out), CUDA_ERROR_NOT_INITIALIZED);
    }
}

fn no_driver() -> bool {
    std::env::var_os("RGPU_SOCKET").is_none()
}

type CurrentContext = extern "C" fn(*mut *mut c_void) -> u32;

#[test]
fn tools_tls_slot_2_answers_the_current_context() {
    // SAFETY: TLS slot 2 has this signature.
    let f: CurrentContext = unsafe { std::mem::transmute(TABLES[TOOLS_TLS].slots[2].value()) };
    // No context is current on a test thread: NULL, and still success.
    let mut ctx = 0x1234usize as *mut c_void;
    assert_eq!(f(&mut ctx), CUDA_SUCCESS);
    assert!(ctx.is_null());
    assert_eq!(f(std::ptr::null_mut()), CUDA_SUCCESS);
}

type ContextId = extern "C" fn(*mut c_void, *mut u64) -> u32;
type PrivateStream = extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, i32) -> u32;
type StreamId = extern "C" fn(*mut c_void, *mut c_void, *mut u64) -> u32;

/// `CU_STREAM_LEGACY` as a handle.
fn legacy_stream() -> *mut c_void {
    crate::abi::CU_STREAM_LEGACY as *mut c_void
}

#[test]
fn context_stream_slots_check_their_arguments() {
    let slots = TABLES[CONTEXT_STREAM].slots;
    // SAFETY: slots 4, 51 and 39 have these signatures.
    let context_id = unsafe { std::mem::transmute::<usize, ContextId>(slots[4].value()) };
    // SAFETY: as above.
    let private_stream = unsafe { std::mem::transmute::<usize, PrivateStream>(slots[51].value()) };
    // SAFETY: as above.
    let stream_id = unsafe { std::mem::transmute::<usize, StreamId>(slots[39].value()) };
    let null = std::ptr::null_mut();
    assert_eq!(context_id(null, null.cast()), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(
        private_stream(null, null, null.cast(), 0),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(stream_id(null, null, &mut 0), CUDA_ERROR_INVALID_VALUE);
    if no_driver() {
        let mut id = 7u64;
        assert_eq!(context_id(null, &mut id), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(id, 7);
        let mut private = legacy_stream();
        assert_eq!(
            private_stream(null, null, &mut private, 0),
            CUDA_ERROR_NOT_INITIALIZED
        );
        assert_eq!(private, legacy_stream());
        assert_eq!(
            stream_id(null, legacy_stream(), &mut id),
            CUDA_ERROR_NOT_INITIALIZED
        );
        assert_eq!(id, 7);
    }
}

#[test]
fn private_streams_are_public_handles_of_the_same_stream() {
    use super::context_stream::private_handle;
    let null = std::ptr::null_mut();
    assert_eq!(private_handle(null, false), 0x1);
    assert_eq!(private_handle(null, true), 0x2);
    assert_eq!(private_handle(legacy_stream(), true), 0x1);
    assert_eq!(private_handle(0x2 as *mut c_void, false), 0x2);
    assert_eq!(private_handle(0xABC0 as *mut c_void, false), 0xABC0);
}

#[test]
fn addresses_name_their_library_and_symbol() {
    use super::addresses::{caller_stack, describe};
    assert_eq!(describe(0x81), "");
    assert_eq!(describe(0x7fff_ffff), "");
    let text = describe(libc::getpid as *const () as usize);
    assert!(text.contains("libc"), "{text}");
    assert!(text.contains("getpid+0x0"), "{text}");
    let heap = Box::new(0u64);
    assert_eq!(describe(&*heap as *const u64 as usize), "");
    if cfg!(target_env = "gnu") {
        assert!(!caller_stack().is_empty());
    }
}

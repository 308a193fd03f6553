//! `cuGetExportTable`: the private function tables NVIDIA's runtime
//! (static cudart), cuBLAS, PyTorch and CuPy ask the driver for by UUID.
//!
//! A table is an array of pointer-sized slots; most start with their own
//! size in bytes (the context-local storage table does not). The layouts,
//! slot meanings and the integrity hash were learnt from public
//! reimplementations (ZLUDA's `dark_api` crate and `zluda/src/impl/driver.rs`,
//! Wine-staging's `nvcuda`, the GX emulator, a CXL GPU-sharing shim) and
//! from the sizes driver 580 hands out (`shared/cuda-driver-requests.txt`).
//! One submodule per kind of table.
//!
//! Every slot is a real function. Slots whose meaning is unknown log once,
//! with their first arguments (each annotated with the library and symbol
//! it points into, if any) and the caller's stack, and answer
//! `CUDA_ERROR_NOT_SUPPORTED`, so a run on the GPU host shows which slots a
//! program uses and who calls them. Unknown UUIDs are
//! logged once and refused with `CUDA_ERROR_INVALID_VALUE`.
//!
//! `RGPU_REFUSE_EXPORT_TABLES=UUID-prefix,...` refuses known tables too:
//! a diagnostic for finding out, without a rebuild, whether a runtime needs
//! a table at all.

mod addresses;
mod checks;
mod context_stream;
mod integrity;
mod opaque;
mod runtime;
mod storage;
mod tools;

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::Mutex;

use rgpu_proto::cuda_result::*;

use crate::abi::write_out;

/// One slot of a table: a function's address or the table's byte size.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Slot(*const c_void);

// SAFETY: a slot holds a function address or an integer, both immutable
// for the life of the library; nothing is reached through it here.
unsafe impl Sync for Slot {}

impl Slot {
    /// Slot 0 of a sized table: the table's size in bytes.
    const fn size(slots: usize) -> Self {
        Self((slots * std::mem::size_of::<Slot>()) as *const c_void)
    }

    const fn function(address: *const c_void) -> Self {
        Self(address)
    }

    pub fn value(self) -> usize {
        self.0 as usize
    }
}

/// A table: its UUID (bytes in the order `CUuuid` holds them), a name for
/// the logs, and its slots.
pub struct Table {
    pub uuid: [u8; 16],
    pub name: &'static str,
    /// Whether slot 0 holds the size.
    pub sized: bool,
    pub slots: &'static [Slot],
}

// Indices into TABLES: the unknown-slot functions name their table by it.
const RUNTIME: usize = 0;
const TOOLS_TLS: usize = 1;
const TOOLS_HOOKS: usize = 2;
const CONTEXT_STORAGE: usize = 3;
const INTEGRITY: usize = 4;
const CONTEXT_CHECKS: usize = 5;
const F8CFF951: usize = 6;
const CONTEXT_STREAM: usize = 7;
const TORCH_69A28E9F: usize = 8;
const CUPY_DA9151D3: usize = 9;

/// Every table served, by the index constants above.
pub static TABLES: [Table; 10] = [
    Table {
        uuid: uuid(0x6BD5FB6C, 0x5BF4, 0xE74A, 0x8987, 0xD93912FD9DF9),
        name: "runtime interface",
        sized: true,
        slots: &runtime::TABLE,
    },
    Table {
        uuid: uuid(0x42D85A81, 0x23F6, 0xCB47, 0x8298, 0xF6E78A3AECDC),
        name: "tools TLS",
        sized: true,
        slots: &tools::TLS_TABLE,
    },
    Table {
        uuid: uuid(0xA094798C, 0x2E74, 0x2E74, 0x93F2, 0x0800200C0A66),
        name: "tools runtime callback hooks",
        sized: true,
        slots: &tools::HOOKS_TABLE,
    },
    Table {
        uuid: uuid(0xC693336E, 0x1121, 0xDF11, 0xA8C3, 0x68F355D89593),
        name: "context-local storage",
        sized: false,
        slots: &storage::TABLE,
    },
    Table {
        uuid: uuid(0xD4082055, 0xBDE6, 0x704B, 0x8D34, 0xBA123C66E1F2),
        name: "integrity check",
        sized: true,
        slots: &integrity::TABLE,
    },
    Table {
        uuid: uuid(0x263E8860, 0x7CD2, 0x6143, 0x92F6, 0xBBD5006DFA7E),
        name: "context checks",
        sized: true,
        slots: &checks::TABLE,
    },
    Table {
        uuid: uuid(0xF8CFF951, 0x2146, 0x8B4E, 0xB9E2, 0xFB469E7C0DD9),
        name: "runtime F8CFF951",
        sized: true,
        slots: &opaque::F8CFF951_TABLE,
    },
    Table {
        uuid: uuid(0x21318C60, 0x9714, 0x3248, 0x8CA6, 0x41FF7324C8F2),
        name: "context and stream",
        sized: true,
        slots: &context_stream::TABLE,
    },
    Table {
        uuid: uuid(0x69A28E9F, 0x2449, 0x8B47, 0xB030, 0xC5DA330EA4E9),
        name: "PyTorch 69A28E9F",
        sized: true,
        slots: &opaque::TORCH_TABLE,
    },
    Table {
        uuid: uuid(0xDA9151D3, 0x3AE6, 0xCC41, 0xA5C0, 0x4F26D533E328),
        name: "CuPy DA9151D3",
        sized: true,
        slots: &opaque::CUPY_TABLE,
    },
];

/// The UUID `AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE` as the bytes in that
/// order (how the logs and REFERENCE-NOTES print them).
const fn uuid(a: u32, b: u16, c: u16, d: u16, e: u64) -> [u8; 16] {
    let a = a.to_be_bytes();
    let b = b.to_be_bytes();
    let c = c.to_be_bytes();
    let d = d.to_be_bytes();
    let e = e.to_be_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], e[2], e[3], e[4], e[5], e[6],
        e[7],
    ]
}

/// `AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE`.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, byte) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{byte:02X}");
    }
    s
}

/// The table with this UUID.
pub fn find(uuid: &[u8; 16]) -> Option<&'static Table> {
    TABLES.iter().find(|t| t.uuid == *uuid)
}

/// Whether `RGPU_REFUSE_EXPORT_TABLES` names this UUID (by a prefix of its
/// text, dashes optional, any case).
fn refused(uuid: &[u8; 16]) -> bool {
    std::env::var("RGPU_REFUSE_EXPORT_TABLES").is_ok_and(|list| listed(&list, uuid))
}

/// Whether a comma-separated list of UUID prefixes names `uuid`.
fn listed(list: &str, uuid: &[u8; 16]) -> bool {
    let text = uuid_text(uuid).replace('-', "");
    list.split(',')
        .map(|p| p.trim().replace('-', "").to_ascii_uppercase())
        .any(|p| !p.is_empty() && text.starts_with(&p))
}

/// UUIDs already reported as unknown or refused (each is logged once).
static REPORTED: Mutex<BTreeSet<[u8; 16]>> = Mutex::new(BTreeSet::new());

fn report_once(uuid: &[u8; 16], what: &str) {
    let first = REPORTED.lock().map(|mut r| r.insert(*uuid)).unwrap_or(true);
    if first {
        log::warn!("rgpu: export table {} {what}", uuid_text(uuid));
    }
}

pub(crate) fn get(table: *mut *const c_void, id: *const [u8; 16]) -> Result<(), u32> {
    if table.is_null() || id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUuuid (16 bytes).
    let uuid = unsafe { id.read_unaligned() };
    let found = find(&uuid).filter(|_| {
        let refuse = refused(&uuid);
        if refuse {
            report_once(&uuid, "refused (RGPU_REFUSE_EXPORT_TABLES)");
        }
        !refuse
    });
    match found {
        Some(t) => {
            log::debug!(
                "rgpu: export table {} ({}, {} slots) handed out",
                uuid_text(&uuid),
                t.name,
                t.slots.len()
            );
            write_out(table, t.slots.as_ptr().cast())
        }
        None => {
            if !refused(&uuid) {
                report_once(&uuid, "is unknown: refused");
            }
            write_out(table, std::ptr::null())?;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

/// `(table, slot)` pairs already reported as called.
static CALLED: Mutex<BTreeSet<(usize, usize)>> = Mutex::new(BTreeSet::new());

/// Logs the first call of a slot whose meaning is unknown.
fn report_unknown_slot(table: usize, slot: usize, args: [usize; 4]) {
    rgpu_shim::init_logging(crate::entry::API.capture_logs);
    let first = CALLED
        .lock()
        .map(|mut c| c.insert((table, slot)))
        .unwrap_or(true);
    let uuid = TABLES
        .get(table)
        .map_or_else(String::new, |t| uuid_text(&t.uuid));
    if first {
        let args: Vec<String> = args
            .iter()
            .map(|&a| format!("{a:#x}{}", addresses::describe(a)))
            .collect();
        log::warn!(
            "rgpu: export table {uuid} slot {slot} called (not implemented): args {}",
            args.join(", ")
        );
        for frame in addresses::caller_stack() {
            log::warn!("rgpu:   slot {slot} called from {frame}");
        }
    }
    log::trace!("rgpu: export table {uuid} slot {slot}({args:x?}) -> {CUDA_ERROR_NOT_SUPPORTED}");
}

/// A slot whose meaning is unknown. The first integer arguments are read
/// whatever the caller passed: on x86-64 and aarch64 they are registers, so
/// reading more than were passed reads harmless leftovers.
extern "C" fn unknown<const TABLE: usize, const SLOT: usize>(
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
) -> u32 {
    report_unknown_slot(TABLE, SLOT, [a0, a1, a2, a3]);
    CUDA_ERROR_NOT_SUPPORTED
}

/// The slot for an unknown function of table `$table` at index `$slot`.
macro_rules! unknown_slot {
    ($table:expr, $slot:literal) => {
        $crate::api::export_table::Slot::function(
            $crate::api::export_table::unknown::<{ $table }, $slot> as *const std::ffi::c_void,
        )
    };
}
use unknown_slot;

/// Logs a known slot's call at debug level.
fn trace_slot(table: usize, slot: usize, what: std::fmt::Arguments<'_>) {
    rgpu_shim::init_logging(crate::entry::API.capture_logs);
    if log::log_enabled!(log::Level::Debug) {
        let uuid = TABLES
            .get(table)
            .map_or_else(String::new, |t| uuid_text(&t.uuid));
        log::debug!("rgpu: export table {uuid} slot {slot}: {what}");
    }
}

/// Runs a slot implementation like an entry point: no unwinding into C.
fn run(table: usize, slot: usize, call: impl FnOnce() -> Result<(), u32>) -> u32 {
    let result = crate::entry::run("export table slot", call);
    trace_slot(table, slot, format_args!("-> {result}"));
    result
}

#[cfg(test)]
mod tests;

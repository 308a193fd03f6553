//! Generates, from NVIDIA's export list, the proc-address recording and the
//! one declarative list of hand-written entry points (`src/exports.rs`):
//!
//! - `unsupported.rs`: a stub for every exported driver symbol that is not
//!   implemented by hand (logs once, returns `CUDA_ERROR_NOT_SUPPORTED`);
//! - `symbol_table.rs`: every exported symbol, sorted by name, with its
//!   address (hand-written or stub);
//! - `proc_table.rs`: how driver 580 answers `cuGetProcAddress_v2`.
//!
//! The build fails when the declarative list names a symbol that NVIDIA's
//! driver does not export, or names one twice, so the export set,
//! `cuGetProcAddress` and the tests cannot drift apart.

// A build script reports a broken input by panicking, and writing to a
// String cannot fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use rgpu_shim::build::{read, read_exports, read_implemented, unsupported_stubs};

const EXPORTS: &str = "data/libcuda-580.159-exports.txt";
const PROC_TABLE: &str = "data/proc-address-table-580.159.tsv";
const DECLARATIONS: &str = "src/exports.rs";

fn main() {
    for path in [EXPORTS, PROC_TABLE, DECLARATIONS] {
        println!("cargo:rerun-if-changed={path}");
    }
    // The application (and NVIDIA's runtime) loads "libcuda.so.1".
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");

    let exports = read_exports(EXPORTS);
    let implemented = read_implemented(DECLARATIONS, "cu", &exports);
    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let out = Path::new(&out_dir);

    write(
        out,
        "unsupported.rs",
        &unsupported_stubs(&exports, &implemented, "crate::entry::API"),
    );
    write(
        out,
        "symbol_table.rs",
        &symbol_table(&exports, &implemented),
    );
    write(out, "proc_table.rs", &proc_table(&exports));
}

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("writing {name}: {e}"));
}

fn symbol_table(exports: &BTreeSet<String>, implemented: &BTreeSet<String>) -> String {
    let mut s = String::new();
    writeln!(s, "pub static SYMBOLS: [Symbol; {}] = [", exports.len()).unwrap();
    // BTreeSet iterates in byte order: the table is sorted for binary search.
    for name in exports {
        let module = if implemented.contains(name) {
            "exports"
        } else {
            "unsupported"
        };
        writeln!(
            s,
            "    Symbol {{ name: \"{name}\", address: Address(crate::{module}::{name} as *const core::ffi::c_void) }},"
        )
        .unwrap();
    }
    s.push_str("];\n");
    s
}

fn proc_table(exports: &BTreeSet<String>) -> String {
    let mut rows = Vec::new();
    for (n, line) in read(PROC_TABLE).lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [name, flags, version, symbol] = fields[..] else {
            panic!("{PROC_TABLE}:{}: expected 4 tab-separated fields", n + 1);
        };
        let flags: u8 = flags.parse().expect("flags is a small integer");
        let version: u32 = version.parse().expect("first_version is an integer");
        let symbol = if symbol == "-" {
            None
        } else {
            assert!(
                exports.contains(symbol),
                "{PROC_TABLE}:{}: {symbol} is not exported",
                n + 1
            );
            Some(symbol.to_owned())
        };
        rows.push((name.to_owned(), flags, version, symbol));
    }
    rows.sort();
    let mut s = String::new();
    writeln!(s, "pub static PROC_TABLE: [ProcRow; {}] = [", rows.len()).unwrap();
    for (name, flags, version, symbol) in rows {
        let symbol = match symbol {
            Some(sym) => format!("Some(\"{sym}\")"),
            None => "None".to_owned(),
        };
        writeln!(
            s,
            "    ProcRow {{ name: \"{name}\", flags: {flags}, version: {version}, symbol: {symbol} }},"
        )
        .unwrap();
    }
    s.push_str("];\n");
    s
}

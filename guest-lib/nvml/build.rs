//! Generates, from NVIDIA's NVML export list (driver 580) and the one
//! declarative list of hand-written entry points (`src/exports.rs`), a stub
//! for every other exported name (`unsupported.rs`: logs once, returns
//! `NVML_ERROR_NOT_SUPPORTED`), and sets the soname `libnvidia-ml.so.1`.
//!
//! The build fails when the list names a symbol NVIDIA's NVML does not
//! export, or names one twice.

// A build script reports a broken input by panicking, and writing to a
// String cannot fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::env;
use std::fs;
use std::path::Path;

use rgpu_shim::build::{read_exports, read_implemented, unsupported_stubs};

const EXPORTS: &str = "data/libnvidia-ml-580-exports.txt";
const DECLARATIONS: &str = "src/exports.rs";

fn main() {
    for path in [EXPORTS, DECLARATIONS] {
        println!("cargo:rerun-if-changed={path}");
    }
    // Applications dlopen "libnvidia-ml.so.1".
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");

    let exports = read_exports(EXPORTS);
    let implemented = read_implemented(DECLARATIONS, "nvml", &exports);
    let stubs = unsupported_stubs(&exports, &implemented, "crate::entry::API");
    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    fs::write(Path::new(&out_dir).join("unsupported.rs"), stubs)
        .unwrap_or_else(|e| panic!("writing unsupported.rs: {e}"));
}

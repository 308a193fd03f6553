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

use std::collections::BTreeSet;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

const EXPORTS: &str = "data/libnvidia-ml-580-exports.txt";
const DECLARATIONS: &str = "src/exports.rs";

fn main() {
    for path in [EXPORTS, DECLARATIONS] {
        println!("cargo:rerun-if-changed={path}");
    }
    // Applications dlopen "libnvidia-ml.so.1".
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");

    let exports: BTreeSet<String> = read(EXPORTS)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let implemented = read_implemented(&exports);
    let missing: Vec<&String> = exports.difference(&implemented).collect();
    let mut s = String::new();
    writeln!(s, "pub(crate) const COUNT: usize = {};", missing.len()).unwrap();
    for (index, name) in missing.iter().enumerate() {
        writeln!(
            s,
            "#[no_mangle]\npub extern \"C\" fn {name}() -> u32 {{ report({index}, \"{name}\") }}"
        )
        .unwrap();
    }
    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    fs::write(Path::new(&out_dir).join("unsupported.rs"), s)
        .unwrap_or_else(|e| panic!("writing unsupported.rs: {e}"));
}

fn read(path: &str) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The names declared as `fn nvmlName(` in the declarative list.
fn read_implemented(exports: &BTreeSet<String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in read(DECLARATIONS).lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let Some((_, rest)) = line.split_once("fn nvml") else {
            continue;
        };
        let Some((name, _)) = rest.split_once('(') else {
            continue;
        };
        let name = format!("nvml{name}");
        assert!(
            exports.contains(&name),
            "{DECLARATIONS} implements {name}, which NVIDIA's NVML does not export"
        );
        assert!(names.insert(name.clone()), "{name} is declared twice");
    }
    assert!(
        !names.is_empty(),
        "no implemented symbols found in {DECLARATIONS}"
    );
    names
}

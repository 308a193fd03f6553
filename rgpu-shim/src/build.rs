//! For the build scripts of the two libraries: the real library's export
//! list, the names the declarative list implements (checked against it),
//! and the stubs for the rest. A build fails when the list names a symbol
//! the real library does not export, or names one twice, so the export set
//! and the tests cannot drift apart. (A build script fails by panicking.)

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;

/// A file the build reads; the build fails if it cannot.
pub fn read(path: &str) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The exported names of the real library (one per line).
pub fn read_exports(path: &str) -> BTreeSet<String> {
    read(path)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The names `declarations` implements: lines with `fn NAME(` (the
/// declarative list, or an entry point written out) whose name starts with
/// `prefix` (`cu`, `nvml`), comments skipped. Each must be one of
/// `exports`, and named once.
pub fn read_implemented(
    declarations: &str,
    prefix: &str,
    exports: &BTreeSet<String>,
) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in read(declarations).lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        // `fn name(` in the list, or `extern "C" fn name(` written out.
        let Some((_, rest)) = line.split_once("fn ") else {
            continue;
        };
        let Some((name, _)) = rest.split_once('(') else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        if !exports.contains(name) {
            panic!("{declarations} implements {name}, which the real library does not export");
        }
        if !names.insert(name.to_owned()) {
            panic!("{name} is declared twice");
        }
    }
    if names.is_empty() {
        panic!("no implemented symbols found in {declarations}");
    }
    names
}

/// The stubs (Rust source, for `include!` in the library's `unsupported`
/// module) of every export not implemented: each calls [`crate::unsupported`]
/// with `api` (a path to the library's [`crate::Api`]) and logs once.
pub fn unsupported_stubs(
    exports: &BTreeSet<String>,
    implemented: &BTreeSet<String>,
    api: &str,
) -> String {
    let missing: Vec<&String> = exports.difference(implemented).collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "static LOGGED: [::std::sync::atomic::AtomicBool; {}] = \
         [const {{ ::std::sync::atomic::AtomicBool::new(false) }}; {}];",
        missing.len(),
        missing.len()
    );
    for (index, name) in missing.iter().enumerate() {
        let _ = writeln!(
            s,
            "#[no_mangle]\npub extern \"C\" fn {name}() -> u32 {{ \
             ::rgpu_shim::unsupported(&{api}, &LOGGED, {index}, \"{name}\") }}"
        );
    }
    s
}

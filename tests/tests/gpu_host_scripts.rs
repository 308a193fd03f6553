//! The scripts that run only on the GPU host (tests/bench, tests/gpu) never
//! run in CI, and the host's time comes in short, scarce sessions: a slip
//! that keeps one from parsing would cost a whole device run. Each must at
//! least parse.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use rgpu_tests::{workspace_root, TempDir};

/// Whether `bash -n` accepts `script`.
fn parses(script: &Path) -> bool {
    Command::new("bash")
        .arg("-n")
        .arg(script)
        .output()
        .expect("run bash -n")
        .status
        .success()
}

fn shell_scripts(folder: &str) -> Vec<PathBuf> {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(workspace_root().join(folder))
        .expect("list the folder")
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sh"))
        .collect();
    scripts.sort();
    scripts
}

#[test]
fn every_gpu_host_script_parses() {
    let scripts: Vec<PathBuf> = ["tests/bench", "tests/gpu"]
        .iter()
        .flat_map(|folder| shell_scripts(folder))
        .collect();
    // The benchmark, the suites and check-all.sh are among them.
    for name in [
        "perf_bench.sh",
        "torch_options.sh",
        "check-all.sh",
        "run-gpu-suite.sh",
    ] {
        assert!(
            scripts.iter().any(|s| s.ends_with(name)),
            "{name} not found among {scripts:?}"
        );
    }
    let broken: Vec<&PathBuf> = scripts.iter().filter(|s| !parses(s)).collect();
    assert!(broken.is_empty(), "scripts bash cannot parse: {broken:?}");
}

#[test]
fn the_check_rejects_a_script_that_does_not_parse() {
    let dir = TempDir::new("rgpu-script-check").unwrap();
    let script = dir.join("unclosed.sh");
    std::fs::write(&script, "if true; then\n    echo never closed\n").unwrap();
    assert!(!parses(&script));
}

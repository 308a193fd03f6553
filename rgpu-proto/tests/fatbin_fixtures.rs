//! The fatbin reader on nvcc's own output: the fixtures that
//! tests/fixtures/fatbin/make-fixtures.sh builds on the GPU host, each
//! checked against its `cuobjdump -lelf -lptx` listing (what NVIDIA's tool
//! finds in it). Until the fixtures are committed, this says so and passes.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use rgpu_proto::fatbin::{container_size, parse, KIND_ELF, KIND_PTX};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/fatbin")
}

/// `(kind, arch)` of every entry cuobjdump listed ("ELF file 1: x.sm_90.cubin").
fn listed(listing: &str) -> Vec<(u16, u32)> {
    listing
        .lines()
        .filter_map(|line| {
            let kind = if line.contains("ELF file") {
                KIND_ELF
            } else if line.contains("PTX file") {
                KIND_PTX
            } else {
                return None;
            };
            let (_, after) = line.rsplit_once("sm_")?;
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            Some((kind, digits.parse().ok()?))
        })
        .collect()
}

fn binaries() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .map(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.extension()
                        .is_some_and(|x| x == "fatbin" || x == "nv_fatbin")
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

#[test]
fn fixtures_parse_as_cuobjdump_lists_them() {
    let binaries = binaries();
    // The committed set (made by make-fixtures.sh with nvcc 13.0 on the GPU
    // host): missing files are a broken checkout, not a reason to skip.
    let names: Vec<String> = binaries
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for wanted in [
        "kernels-sm90.fatbin",
        "kernels-multi.fatbin",
        "kernels-ptx.fatbin",
        "kernels-compressed.fatbin",
        "kernels-compressed-size.fatbin",
        "two-units.nv_fatbin",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "fixture {wanted} missing from {}",
            fixtures_dir().display()
        );
    }
    for path in binaries {
        let name = path.display().to_string();
        let bytes = std::fs::read(&path).unwrap();
        let listing = std::fs::read_to_string(format!("{name}.txt"))
            .unwrap_or_else(|e| panic!("{name}.txt: {e}"));
        let mut expected = listed(&listing);
        assert!(
            !expected.is_empty(),
            "{name}.txt lists no entries:\n{listing}"
        );
        let fatbin = parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut found: Vec<(u16, u32)> = fatbin.entries.iter().map(|e| (e.kind, e.arch)).collect();
        expected.sort_unstable();
        found.sort_unstable();
        assert_eq!(found, expected, "{name}");
        // Payloads are what their kind says, once decompressed.
        for e in fatbin.entries.iter().filter(|e| !e.is_compressed()) {
            let payload = &bytes[e.payload.clone()];
            if e.is_elf() {
                assert!(payload.starts_with(b"\x7fELF"), "{name}: ELF entry");
            } else {
                let text = String::from_utf8_lossy(payload);
                assert!(text.contains(".version"), "{name}: PTX entry");
            }
        }
        if name.contains("compressed") {
            assert!(
                fatbin.entries.iter().any(|e| e.is_compressed()),
                "{name}: nothing compressed"
            );
        }
        if name.ends_with(".nv_fatbin") {
            assert!(fatbin.containers.len() >= 2, "{name}: one container");
        } else {
            // A file nvcc wrote is exactly one container.
            assert_eq!(fatbin.containers.len(), 1, "{name}");
            assert_eq!(fatbin.size, bytes.len(), "{name}");
            assert_eq!(container_size(&bytes), Ok(bytes.len() as u64), "{name}");
        }
    }
}

#[test]
fn listings_are_read_as_cuobjdump_writes_them() {
    let listing = "\nELF file    1: kernels-multi.1.sm_80.cubin\n\
                   ELF file    2: kernels-multi.2.sm_90.cubin\n\
                   PTX file    1: kernels-multi.1.sm_90.ptx\n";
    assert_eq!(
        listed(listing),
        vec![(KIND_ELF, 80), (KIND_ELF, 90), (KIND_PTX, 90)]
    );
}

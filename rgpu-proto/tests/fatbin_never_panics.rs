//! The fatbin reader on untrusted bytes: random bytes and mutations of valid
//! fatbins (bit flips, truncations, size fields overwritten with edge values)
//! give a result or an error, never a panic, and every range it returns lies
//! inside the input. Valid fatbins read back what they were built from.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use rgpu_proto::fatbin::{
    container_size, parse, Compression, Wrapper, FATBIN_MAGIC, FLAG_COMPRESSED_LZ4,
    FLAG_COMPRESSED_ZSTD, KIND_ELF, KIND_PTX,
};

/// One entry to build: kind, arch, flags, payload, header size.
type Spec = (u16, u32, u64, Vec<u8>, u32);

fn build_entry((kind, arch, flags, payload, header_size): &Spec) -> Vec<u8> {
    let padded = payload.len().div_ceil(8) * 8;
    let mut e = vec![0u8; *header_size as usize];
    e[0..2].copy_from_slice(&kind.to_le_bytes());
    e[4..8].copy_from_slice(&header_size.to_le_bytes());
    e[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
    e[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    e[28..32].copy_from_slice(&arch.to_le_bytes());
    e[40..48].copy_from_slice(&flags.to_le_bytes());
    e[56..64].copy_from_slice(&(payload.len() as u64 * 2).to_le_bytes());
    e.extend_from_slice(payload);
    e.resize(*header_size as usize + padded, 0);
    e
}

fn build_container(entries: &[Spec]) -> Vec<u8> {
    let body: Vec<u8> = entries.iter().flat_map(build_entry).collect();
    let mut c = Vec::new();
    c.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
    c.extend_from_slice(&1u16.to_le_bytes());
    c.extend_from_slice(&16u16.to_le_bytes());
    c.extend_from_slice(&(body.len() as u64).to_le_bytes());
    c.extend_from_slice(&body);
    c
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(vec![KIND_PTX, KIND_ELF, 4]),
        prop::sample::select(vec![52u32, 80, 86, 90, 100, 120]),
        prop::sample::select(vec![
            0x11u64,
            0x11 | FLAG_COMPRESSED_LZ4,
            0x11 | FLAG_COMPRESSED_ZSTD,
        ]),
        proptest::collection::vec(any::<u8>(), 0..64),
        prop::sample::select(vec![64u32, 80, 112]),
    )
}

fn fatbin() -> impl Strategy<Value = (Vec<Vec<Spec>>, Vec<u8>)> {
    (
        proptest::collection::vec(proptest::collection::vec(spec(), 0..4), 1..4),
        0usize..24,
    )
        .prop_map(|(containers, padding)| {
            let mut bytes = Vec::new();
            for c in &containers {
                bytes.extend_from_slice(&build_container(c));
                bytes.resize(bytes.len() + padding, 0);
            }
            (containers, bytes)
        })
}

/// Parses and checks that every range stays inside the input.
fn parse_checked(bytes: &[u8]) {
    let _ = container_size(bytes);
    let _ = Wrapper::decode(bytes);
    if let Ok(f) = parse(bytes) {
        assert!(f.size <= bytes.len());
        for c in &f.containers {
            assert!(c.start <= c.end && c.end <= f.size);
        }
        for e in &f.entries {
            assert!(e.payload.start <= e.payload.end && e.payload.end <= f.size);
            assert!(e.container < f.containers.len());
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit { at: usize, bit: u8 },
    Truncate { keep: usize },
    OverwriteU32 { at: usize, value: u32 },
    OverwriteU64 { at: usize, value: u64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let edge32 = prop::sample::select(vec![0u32, 1, 15, 16, 63, 64, 65, u32::MAX - 7, u32::MAX]);
    let edge64 = prop::sample::select(vec![
        0u64,
        1,
        64,
        u64::from(u32::MAX),
        u64::MAX - 15,
        u64::MAX,
    ]);
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        (any::<usize>(), edge32).prop_map(|(at, value)| Mutation::OverwriteU32 { at, value }),
        (any::<usize>(), edge64).prop_map(|(at, value)| Mutation::OverwriteU64 { at, value }),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match m {
            Mutation::FlipBit { at, bit } if len > 0 => bytes[at % len] ^= 1 << bit,
            Mutation::Truncate { keep } => bytes.truncate(keep % (len + 1)),
            Mutation::OverwriteU32 { at, value } if len >= 4 => {
                let at = (at % (len / 4)) * 4;
                bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
            Mutation::OverwriteU64 { at, value } if len >= 8 => {
                let at = (at % (len / 8)) * 8;
                bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            _ => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        parse_checked(&bytes);
    }

    #[test]
    fn random_bytes_after_a_header_never_panic(
        rest in proptest::collection::vec(any::<u8>(), 0..512),
        size in any::<u64>(),
    ) {
        let mut bytes = build_container(&[]);
        bytes[8..16].copy_from_slice(&size.to_le_bytes());
        bytes.extend_from_slice(&rest);
        parse_checked(&bytes);
    }

    #[test]
    fn mutated_fatbins_never_panic(
        (_, bytes) in fatbin(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        parse_checked(&mutate(bytes, &mutations));
    }

    #[test]
    fn valid_fatbins_read_back((containers, bytes) in fatbin()) {
        let f = parse(&bytes).expect("a valid fatbin parses");
        prop_assert_eq!(f.containers.len(), containers.len());
        let specs: Vec<&Spec> = containers.iter().flatten().collect();
        prop_assert_eq!(f.entries.len(), specs.len());
        for (e, (kind, arch, flags, payload, _)) in f.entries.iter().zip(specs) {
            prop_assert_eq!(e.kind, *kind);
            prop_assert_eq!(e.arch, *arch);
            prop_assert_eq!(e.flags, *flags);
            let expected = if flags & FLAG_COMPRESSED_ZSTD != 0 {
                Compression::Zstd
            } else if flags & FLAG_COMPRESSED_LZ4 != 0 {
                Compression::Lz4
            } else {
                Compression::None
            };
            prop_assert_eq!(e.compression, expected);
            prop_assert_eq!(&bytes[e.payload.start..e.payload.start + payload.len()], &payload[..]);
        }
        let first = container_size(&bytes).expect("header reads") as usize;
        prop_assert_eq!(first, f.containers[0].end);
    }
}

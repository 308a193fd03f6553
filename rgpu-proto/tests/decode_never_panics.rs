//! Decoding any byte string returns a value or an error and never panics:
//! random bytes and mutations of valid encodings (bit flips, truncations,
//! length fields overwritten with edge values) go through every decoder the
//! host and guest run on untrusted bytes. Valid encodings round-trip.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use rgpu_proto::batch::{decode_batch, encode_batch};
use rgpu_proto::capset::{Capset, DeviceInfo, ATTRIBUTE_SLOTS};
use rgpu_proto::command::{decode_all, decode_one};
use rgpu_proto::remote::{frame_length, HelloRole, Request, Response, REMOTE_VERSION, TOKEN_BYTES};
use rgpu_proto::reply::{DeviceStatus, FunctionInfo, ParamSlot};
use rgpu_proto::virtio_gpu::{MemEntry, ResourceCreateBlob};
use rgpu_proto::wire::{WireReader, WireWriter};
use rgpu_proto::{Command, ControlCommand, ControlOpcode, Opcode};

/// Runs every decoder over `bytes`; only a panic can fail this.
fn decode_everything(bytes: &[u8]) {
    let _ = decode_one(bytes);
    let _ = decode_all::<Command>(bytes).count();
    let _ = decode_all::<ControlCommand>(bytes).count();
    let _ = decode_batch(bytes);
    let _ = Capset::decode(bytes);
    let _ = ResourceCreateBlob::decode(&mut WireReader::new(bytes));
    let _ = FunctionInfo::decode(bytes);
    let _ = DeviceStatus::decode(bytes);
    // The network carrier's frames (the daemon's gateway decodes requests
    // from the network; guest-lib decodes responses).
    let _ = Request::decode(bytes);
    let _ = Response::decode(bytes);
    if let Some(header) = bytes.first_chunk::<4>() {
        let _ = frame_length(*header);
    }
}

/// A request of every kind, its fields drawn from `draw` and its bytes
/// from `data`.
fn remote_request<'a>(kind: u8, draw: &mut impl FnMut() -> u64, data: &'a [u8]) -> Request<'a> {
    let token = [draw() as u8; TOKEN_BYTES];
    match kind % 11 {
        0 => Request::Hello {
            version: draw() as u32,
            role: HelloRole::Process {
                name: format!("{}:p", draw() % 1000),
            },
        },
        1 => Request::Hello {
            version: REMOTE_VERSION,
            role: HelloRole::Channel {
                token,
                name: "n".into(),
            },
        },
        2 => Request::Hello {
            version: REMOTE_VERSION,
            role: HelloRole::Query {
                token,
                ctx_id: draw() as u32,
            },
        },
        3 => Request::Send { command: data },
        4 => Request::Call { command: data },
        5 => Request::CopyToDevice {
            stream: draw() as u32,
            dst: draw(),
            sync: draw().is_multiple_of(2),
            data,
        },
        6 => Request::CopyFromDevice {
            stream: draw() as u32,
            src: draw(),
            length: draw(),
        },
        7 => Request::ImagePiece { data },
        8 => Request::LoadModule {
            command: data,
            image: data,
        },
        9 => Request::Query {
            after: draw(),
            stream: draw().is_multiple_of(2),
            handle: draw() as u32,
        },
        _ => Request::Ping,
    }
}

/// A splitmix64 stream from `seed`: the values [`Command::draw`] takes.
fn drawer(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Any command of the table (every opcode: a command is covered as soon
/// as it is defined), its fields drawn from a seed. Small values are as
/// likely as any (they are the ones with meaning: sizes, element sizes).
fn command() -> impl Strategy<Value = Command> {
    (
        prop::sample::select(Opcode::ALL.to_vec()),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(op, seed, small)| {
            let mut next = drawer(seed);
            let mut draw = move || if small { next() % 8 } else { next() };
            Command::draw(op, &mut draw)
        })
}

fn control_command() -> impl Strategy<Value = ControlCommand> {
    (
        prop::sample::select(ControlOpcode::ALL.to_vec()),
        any::<u64>(),
    )
        .prop_map(|(op, seed)| {
            let mut draw = drawer(seed);
            ControlCommand::draw(op, &mut draw)
        })
}

fn capset() -> impl Strategy<Value = Capset> {
    let device = (
        "[a-zA-Z0-9 ]{0,40}",
        any::<[u8; 16]>(),
        any::<u64>(),
        any::<u32>(),
        proptest::collection::vec(any::<i32>(), ATTRIBUTE_SLOTS),
    )
        .prop_map(
            |(name, uuid, total_mem, host_ordinal, attributes)| DeviceInfo {
                name,
                uuid,
                total_mem,
                host_ordinal,
                attributes,
            },
        );
    (
        any::<u32>(),
        any::<i32>(),
        prop::sample::select(vec!["sim", "cuda"]),
        proptest::collection::vec(device, 0..3),
    )
        .prop_map(
            |(protocol_version, driver_version, executor, devices)| Capset {
                protocol_version,
                driver_version,
                executor: executor.to_string(),
                devices,
            },
        )
}

fn create_blob_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<[u32; 3]>(),
        any::<u64>(),
        any::<u64>(),
        proptest::collection::vec((any::<u64>(), any::<u32>()), 0..8),
    )
        .prop_map(|(ids, blob_id, size, entries)| {
            let mut w = WireWriter::new();
            ResourceCreateBlob {
                resource_id: ids[0],
                blob_mem: ids[1],
                blob_flags: ids[2],
                blob_id,
                size,
                entries: entries
                    .into_iter()
                    .map(|(addr, length)| MemEntry { addr, length })
                    .collect(),
            }
            .encode(&mut w);
            w.into_bytes()
        })
}

fn function_info_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec((any::<u32>(), any::<u32>()), 0..16).prop_map(|params| {
        let mut w = WireWriter::new();
        FunctionInfo {
            params: params
                .into_iter()
                .map(|(offset, size)| ParamSlot { offset, size })
                .collect(),
        }
        .encode(&mut w);
        w.into_bytes()
    })
}

/// One change to a valid encoding.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    Truncate {
        keep: usize,
    },
    /// Overwrites a 4-byte little-endian field (lengths, counts, sizes) with
    /// a value from the edges of its range.
    OverwriteU32 {
        at: usize,
        value: u32,
    },
    Append {
        bytes: Vec<u8>,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let edge = prop::sample::select(vec![
        0u32,
        1,
        7,
        8,
        15,
        16,
        0x7fff_ffff,
        0x8000_0000,
        0xffff,
        0x1_0000,
        0x1_0001,
        u32::MAX - 7,
        u32::MAX,
    ]);
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        (any::<usize>(), prop_oneof![edge, any::<u32>()])
            .prop_map(|(at, value)| Mutation::OverwriteU32 { at, value }),
        proptest::collection::vec(any::<u8>(), 1..32).prop_map(|bytes| Mutation::Append { bytes }),
    ]
}

/// Every command of the table round-trips, its encoded size is known
/// without encoding it, and no two share an opcode.
#[test]
fn every_command_of_the_table_round_trips() {
    let mut seen = std::collections::HashSet::new();
    for &op in Opcode::ALL {
        assert!(seen.insert(op as u16), "{op:?} shares its opcode");
        assert_eq!(Opcode::from_u16(op as u16), Some(op));
        for seed in 0..16 {
            let mut draw = drawer(seed);
            let mut small = move || draw() % 4 + 1;
            let command = Command::draw(op, &mut small);
            assert_eq!(command.opcode(), op);
            let bytes = command.to_bytes(seed);
            assert_eq!(bytes.len(), command.encoded_len(), "{command:?}");
            assert_eq!(command.header(seed).padded_len(), bytes.len());
            match command.validate() {
                Ok(()) => assert_eq!(
                    decode_one(&bytes).map(|d| d.command),
                    Ok(command.clone()),
                    "{op:?}"
                ),
                Err(e) => assert_eq!(decode_one(&bytes).map(|d| d.command), Err(e)),
            }
        }
    }
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match m {
            Mutation::FlipBit { at, bit } if len > 0 => bytes[at % len] ^= 1 << bit,
            Mutation::Truncate { keep } => bytes.truncate(keep % (len + 1)),
            Mutation::OverwriteU32 { at, value } if len >= 4 => {
                // Fields sit at multiples of 4 in every structure here.
                let at = (at % (len / 4)) * 4;
                bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
            Mutation::Append { bytes: extra } => bytes.extend_from_slice(extra),
            _ => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn network_frames_round_trip_and_mutations_never_panic(
        kind in any::<u8>(),
        seed in any::<u64>(),
        data in proptest::collection::vec(any::<u8>(), 1..256),
        flip in any::<usize>(),
        cut in any::<usize>(),
    ) {
        let mut draw = drawer(seed);
        let request = remote_request(kind, &mut draw, &data);
        let frame = request.encode();
        let body = &frame[4..];
        // Valid ones decode to themselves, unless a drawn field is out of
        // the decoder's bounds (a copy of more than it allows).
        if let Ok(decoded) = Request::decode(body) {
            prop_assert_eq!(decoded, request);
        }
        let mut mutated = body.to_vec();
        let bit = flip % (mutated.len() * 8);
        mutated[bit / 8] ^= 1 << (bit % 8);
        decode_everything(&mutated);
        decode_everything(&body[..cut % body.len()]);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        decode_everything(&bytes);
    }

    #[test]
    fn random_bytes_after_a_valid_batch_header_never_panic(
        rest in proptest::collection::vec(any::<u8>(), 0..512),
        length in any::<u32>(),
    ) {
        let mut bytes = encode_batch(&[]);
        bytes[8..12].copy_from_slice(&length.to_le_bytes());
        bytes.extend_from_slice(&rest);
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_commands_never_panic(
        commands in proptest::collection::vec((any::<u64>(), command()), 1..6),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut w = WireWriter::new();
        for (seq, c) in &commands {
            c.encode(*seq, &mut w);
        }
        decode_everything(&mutate(w.into_bytes(), &mutations));
    }

    #[test]
    fn mutated_batches_never_panic(
        commands in proptest::collection::vec((any::<u64>(), control_command()), 1..6),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        decode_everything(&mutate(encode_batch(&commands), &mutations));
    }

    #[test]
    fn mutated_capsets_never_panic(
        capset in capset(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        decode_everything(&mutate(capset.encode(), &mutations));
    }

    #[test]
    fn mutated_blob_creations_never_panic(
        bytes in create_blob_bytes(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        decode_everything(&mutate(bytes, &mutations));
    }

    #[test]
    fn mutated_function_infos_never_panic(
        bytes in function_info_bytes(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        decode_everything(&mutate(bytes, &mutations));
    }

    #[test]
    fn commands_round_trip(seq in any::<u64>(), c in command()) {
        let bytes = c.to_bytes(seq);
        prop_assert_eq!(bytes.len() % 8, 0);
        prop_assert_eq!(bytes.len(), c.encoded_len());
        match c.validate() {
            Ok(()) => {
                let decoded = decode_one(&bytes).expect("a valid encoding decodes");
                prop_assert_eq!(decoded.reply_seq, seq);
                prop_assert_eq!(decoded.wire_len, bytes.len());
                prop_assert_eq!(&decoded.command, &c);
            }
            // A command its table entry's check refuses is refused on decode.
            Err(e) => prop_assert_eq!(decode_one(&bytes).map(|d| d.command), Err(e)),
        }
    }

    #[test]
    fn batches_round_trip(
        commands in proptest::collection::vec((any::<u64>(), control_command()), 0..8)
            .prop_filter("commands a check accepts", |cs| cs.iter().all(|(_, c)| c.validate().is_ok())),
    ) {
        let decoded = decode_batch(&encode_batch(&commands)).expect("a valid batch decodes");
        prop_assert_eq!(decoded.len(), commands.len());
        for (d, (seq, c)) in decoded.iter().zip(&commands) {
            prop_assert_eq!(d.reply_seq, *seq);
            prop_assert_eq!(&d.command, c);
        }
    }

    #[test]
    fn capsets_round_trip(capset in capset()) {
        prop_assert_eq!(Capset::decode(&capset.encode()).expect("a valid capset decodes"), capset);
    }

    #[test]
    fn function_infos_round_trip(bytes in function_info_bytes()) {
        let info = FunctionInfo::decode(&bytes).expect("a valid function info decodes");
        let mut w = WireWriter::new();
        info.encode(&mut w);
        prop_assert_eq!(w.into_bytes(), bytes);
    }
}

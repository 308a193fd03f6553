//! Decoding any byte string returns a value or an error and never panics:
//! random bytes and mutations of valid encodings (bit flips, truncations,
//! length fields overwritten with edge values) go through every decoder the
//! host and guest run on untrusted bytes. Valid encodings round-trip.

use proptest::prelude::*;
use proptest::strategy::Union;
use rgpu_proto::batch::{decode_batch, encode_batch};
use rgpu_proto::capset::{Capset, DeviceInfo, ATTRIBUTE_SLOTS};
use rgpu_proto::command::{decode_all, decode_one, ChannelLayout, ClusterQuery, Launch};
use rgpu_proto::reply::{DeviceStatus, FunctionInfo, ParamSlot};
use rgpu_proto::virtio_gpu::{MemEntry, ResourceCreateBlob};
use rgpu_proto::wire::{WireReader, WireWriter};
use rgpu_proto::{BlobRange, Command};

/// Runs every decoder over `bytes`; only a panic can fail this.
fn decode_everything(bytes: &[u8]) {
    let _ = decode_one(bytes);
    let _ = decode_all(bytes).count();
    let _ = decode_batch(bytes);
    let _ = Capset::decode(bytes);
    let _ = ResourceCreateBlob::decode(&mut WireReader::new(bytes));
    let _ = FunctionInfo::decode(bytes);
    let _ = DeviceStatus::decode(bytes);
}

fn blob_range() -> impl Strategy<Value = BlobRange> {
    (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(resource_id, offset, length)| BlobRange {
        resource_id,
        offset,
        length,
    })
}

/// A symbol name: no NUL bytes (the decoder rejects them).
fn name() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(1u8..=255, 0..64)
}

fn command() -> impl Strategy<Value = Command> {
    let u = any::<u32>;
    Union::new(vec![
        Just(Command::Padding).boxed(),
        Just(Command::CtxSynchronize).boxed(),
        Just(Command::MemGetInfo).boxed(),
        (u(), any::<[u64; 7]>())
            .prop_map(|(resource_id, v)| {
                Command::BindChannel(ChannelLayout {
                    resource_id,
                    header_offset: v[0],
                    ring_offset: v[1],
                    ring_size: v[2],
                    reply_offset: v[3],
                    reply_size: v[4],
                    bounce_offset: v[5],
                    bounce_size: v[6],
                })
            })
            .boxed(),
        any::<u64>()
            .prop_map(|until| Command::Doorbell { until })
            .boxed(),
        u().prop_map(|limit| Command::CtxGetLimit { limit }).boxed(),
        (u(), any::<u64>())
            .prop_map(|(limit, value)| Command::CtxSetLimit { limit, value })
            .boxed(),
        any::<u64>()
            .prop_map(|size| Command::MemAlloc { size })
            .boxed(),
        any::<u64>()
            .prop_map(|device_ptr| Command::MemFree { device_ptr })
            .boxed(),
        (u(), any::<u64>(), blob_range())
            .prop_map(|(stream, dst, src)| Command::MemcpyHtoD { stream, dst, src })
            .boxed(),
        (u(), blob_range(), any::<u64>())
            .prop_map(|(stream, dst, src)| Command::MemcpyDtoH { stream, dst, src })
            .boxed(),
        (u(), any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(stream, dst, src, size)| Command::MemcpyDtoD {
                stream,
                dst,
                src,
                size,
            })
            .boxed(),
        (
            u(),
            any::<u64>(),
            u(),
            prop::sample::select(vec![1u32, 2, 4]),
            any::<u64>(),
        )
            .prop_map(
                |(stream, dst, value, element_size, count)| Command::Memset {
                    stream,
                    dst,
                    value,
                    element_size,
                    count,
                },
            )
            .boxed(),
        (u(), blob_range())
            .prop_map(|(module, image)| Command::ModuleLoad { module, image })
            .boxed(),
        u().prop_map(|module| Command::ModuleUnload { module })
            .boxed(),
        (u(), any::<[u8; 32]>())
            .prop_map(|(module, hash)| Command::ModuleLoadCached { module, hash })
            .boxed(),
        (u(), any::<[u8; 32]>(), blob_range())
            .prop_map(|(module, hash, image)| Command::ModuleLoadHashed {
                module,
                hash,
                image,
            })
            .boxed(),
        (u(), u(), name())
            .prop_map(|(module, function, name)| Command::ModuleGetFunction {
                module,
                function,
                name,
            })
            .boxed(),
        (u(), name())
            .prop_map(|(module, name)| Command::ModuleGetGlobal { module, name })
            .boxed(),
        (u(), any::<i32>())
            .prop_map(|(function, attribute)| Command::FuncGetAttribute {
                function,
                attribute,
            })
            .boxed(),
        (
            u(),
            any::<[u32; 3]>(),
            any::<[u32; 3]>(),
            u(),
            u(),
            proptest::collection::vec(any::<u8>(), 0..256),
        )
            .prop_map(
                |(function, grid, block, shared_mem_bytes, stream, params)| {
                    Command::LaunchKernel(Launch {
                        function,
                        grid,
                        block,
                        shared_mem_bytes,
                        stream,
                        params,
                    })
                },
            )
            .boxed(),
        (u(), any::<i32>(), any::<i32>())
            .prop_map(|(function, attribute, value)| Command::FuncSetAttribute {
                function,
                attribute,
                value,
            })
            .boxed(),
        (u(), any::<i32>(), u(), any::<u64>())
            .prop_map(|(function, block_size, flags, dynamic_smem_bytes)| {
                Command::OccupancyMaxActiveBlocks {
                    function,
                    block_size,
                    flags,
                    dynamic_smem_bytes,
                }
            })
            .boxed(),
        (u(), any::<i32>(), any::<i32>())
            .prop_map(
                |(function, num_blocks, block_size)| Command::OccupancyAvailableDynamicSmem {
                    function,
                    num_blocks,
                    block_size,
                },
            )
            .boxed(),
        (
            u(),
            any::<[u32; 3]>(),
            any::<[u32; 3]>(),
            u(),
            any::<[u32; 3]>(),
        )
            .prop_map(|(function, grid, block, shared_mem_bytes, cluster)| {
                Command::OccupancyMaxActiveClusters(ClusterQuery {
                    function,
                    grid,
                    block,
                    shared_mem_bytes,
                    cluster,
                })
            })
            .boxed(),
        (u(), u(), any::<i32>())
            .prop_map(|(stream, flags, priority)| Command::StreamCreate {
                stream,
                flags,
                priority,
            })
            .boxed(),
        u().prop_map(|stream| Command::StreamDestroy { stream })
            .boxed(),
        u().prop_map(|stream| Command::StreamSynchronize { stream })
            .boxed(),
        u().prop_map(|stream| Command::StreamQuery { stream })
            .boxed(),
        (u(), u(), u())
            .prop_map(|(stream, event, flags)| Command::StreamWaitEvent {
                stream,
                event,
                flags,
            })
            .boxed(),
        (u(), u())
            .prop_map(|(event, flags)| Command::EventCreate { event, flags })
            .boxed(),
        u().prop_map(|event| Command::EventDestroy { event })
            .boxed(),
        (u(), u())
            .prop_map(|(event, stream)| Command::EventRecord { event, stream })
            .boxed(),
        u().prop_map(|event| Command::EventSynchronize { event })
            .boxed(),
        u().prop_map(|event| Command::EventQuery { event }).boxed(),
        (u(), u())
            .prop_map(|(start, end)| Command::EventElapsedTime { start, end })
            .boxed(),
        u().prop_map(|device| Command::DeviceStatus { device })
            .boxed(),
    ])
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
        let decoded = decode_one(&bytes).expect("a valid encoding decodes");
        prop_assert_eq!(decoded.reply_seq, seq);
        prop_assert_eq!(decoded.wire_len, bytes.len());
        prop_assert_eq!(&decoded.command, &c);
    }

    #[test]
    fn batches_round_trip(commands in proptest::collection::vec((any::<u64>(), command()), 0..8)) {
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

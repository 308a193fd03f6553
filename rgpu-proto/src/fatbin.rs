//! Reading NVIDIA fatbins: the containers nvcc embeds in programs
//! (`.nv_fatbin`) and writes with `-fatbin`, holding SASS (ELF cubins) and
//! PTX for several architectures.
//!
//! Layout (little-endian; learnt from public readers of the format and
//! checked against nvcc's output, `tests/fixtures/fatbin`):
//!
//! - wrapper (`__fatBinC_Wrapper_t`, 24 bytes): magic `0x466243B1`, version
//!   `u32`, pointer to the fatbin `u64`, pointer to a file name or to a
//!   prelinked list `u64`. The pointers are the guest application's: only
//!   the guest follows them.
//! - container header (16 bytes): magic `0xBA55ED50`, version `u16`, header
//!   size `u16` (where the first entry starts), size of the entries `u64`.
//! - entries, back to back up to the container's end, each a header of at
//!   least 64 bytes followed by its payload:
//!
//!   | offset | field |
//!   | --- | --- |
//!   | 0 | kind `u16` (1 PTX, 2 ELF) |
//!   | 2 | version `u16` |
//!   | 4 | header size `u32` (payload starts here) |
//!   | 8 | payload size `u64` (the next entry starts after it) |
//!   | 16 | compressed size `u32` |
//!   | 20 | (unknown) `u32` |
//!   | 24 | minor, major `u16` each |
//!   | 28 | SM architecture `u32` (e.g. 90) |
//!   | 32 | object name offset, length `u32` each |
//!   | 40 | flags `u64` (compression: LZ4 `0x2000`, Zstd `0x8000`) |
//!   | 48 | (zero) `u64` |
//!   | 56 | uncompressed size `u64` |
//!
//! A section may hold several containers one after another (one per
//! translation unit), padded with zero bytes between them.
//!
//! [`parse`] never panics and never reads outside the bytes it is given: it
//! returns byte ranges into them, or a [`FatbinError`].

use std::ops::Range;

use thiserror::Error;

use crate::wire::WireReader;

/// `__fatBinC_Wrapper_t` magic.
pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Container header magic.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Size of the wrapper structure.
pub const WRAPPER_SIZE: usize = 24;
/// Size of the container header this reader knows.
pub const HEADER_SIZE: usize = 16;
/// Size of the entry header fields this reader knows; newer entries may be
/// longer (80 or 112 bytes for sm_100+) and are skipped by their own size.
pub const ENTRY_HEADER_SIZE: usize = 64;

/// Entry kind: PTX text.
pub const KIND_PTX: u16 = 1;
/// Entry kind: an ELF cubin (SASS).
pub const KIND_ELF: u16 = 2;

/// Entry flag: 64-bit code.
pub const FLAG_64BIT: u64 = 0x1;
/// Entry flag: compiled with debug information.
pub const FLAG_DEBUG: u64 = 0x2;
/// Entry flag: payload compressed with NVIDIA's LZ4-style scheme (nvcc's
/// default compression before CUDA 12.8; `0x1000` marks an older variant).
pub const FLAG_COMPRESSED_LZ4: u64 = 0x2000;
/// Older variant of [`FLAG_COMPRESSED_LZ4`].
pub const FLAG_COMPRESSED_LEGACY: u64 = 0x1000;
/// Entry flag: payload compressed with Zstandard.
pub const FLAG_COMPRESSED_ZSTD: u64 = 0x8000;

/// Why bytes are not a fatbin this reader understands.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FatbinError {
    #[error("bad magic {magic:#x} at offset {offset} (expected {expected:#x})")]
    BadMagic {
        offset: usize,
        magic: u32,
        expected: u32,
    },
    #[error("truncated {what} at offset {offset}")]
    Truncated { what: &'static str, offset: usize },
    #[error("{what} at offset {offset} has invalid size {size}")]
    BadSize {
        what: &'static str,
        offset: usize,
        size: u64,
    },
}

/// The wrapper nvcc emits beside each fatbin; `data` points at the fatbin
/// in the application's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrapper {
    pub version: u32,
    pub data: u64,
    /// A file name (version 1) or a list of prelinked fatbins (version 2).
    pub filename_or_prelinked: u64,
}

impl Wrapper {
    pub fn decode(bytes: &[u8]) -> Result<Self, FatbinError> {
        let truncated = FatbinError::Truncated {
            what: "fatbin wrapper",
            offset: 0,
        };
        let mut r = WireReader::new(bytes);
        let magic = r.u32().map_err(|_| truncated.clone())?;
        if magic != WRAPPER_MAGIC {
            return Err(FatbinError::BadMagic {
                offset: 0,
                magic,
                expected: WRAPPER_MAGIC,
            });
        }
        Ok(Self {
            version: r.u32().map_err(|_| truncated.clone())?,
            data: r.u64().map_err(|_| truncated.clone())?,
            filename_or_prelinked: r.u64().map_err(|_| truncated)?,
        })
    }
}

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd,
}

impl Compression {
    fn from_flags(flags: u64) -> Self {
        if flags & FLAG_COMPRESSED_ZSTD != 0 {
            Compression::Zstd
        } else if flags & (FLAG_COMPRESSED_LZ4 | FLAG_COMPRESSED_LEGACY) != 0 {
            Compression::Lz4
        } else {
            Compression::None
        }
    }
}

/// One entry of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// [`KIND_PTX`], [`KIND_ELF`] or a kind this reader does not know.
    pub kind: u16,
    pub version: u16,
    /// SM architecture, e.g. 90 for `sm_90` / `compute_90`.
    pub arch: u32,
    pub flags: u64,
    pub compression: Compression,
    /// Bytes of compressed data at the start of the payload (compressed
    /// entries only; the rest of the payload is padding).
    pub compressed_size: u32,
    /// Size once decompressed (compressed entries only).
    pub uncompressed_size: u64,
    /// The payload, as a range of the bytes given to [`parse`].
    pub payload: Range<usize>,
    /// Index of the container it belongs to in [`Fatbin::containers`].
    pub container: usize,
}

impl Entry {
    pub fn is_ptx(&self) -> bool {
        self.kind == KIND_PTX
    }

    pub fn is_elf(&self) -> bool {
        self.kind == KIND_ELF
    }

    pub fn is_compressed(&self) -> bool {
        self.compression != Compression::None
    }
}

/// What [`parse`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fatbin {
    /// Each container's bytes (header and entries).
    pub containers: Vec<Range<usize>>,
    pub entries: Vec<Entry>,
    /// Where the last container ends: the size of the fatbin data.
    pub size: usize,
}

/// The size of the container whose header starts `bytes` (header plus
/// entries), from its 16-byte header alone: what a reader holding only a
/// pointer needs to know how much to read.
pub fn container_size(bytes: &[u8]) -> Result<u64, FatbinError> {
    let (header_size, entries_size) = container_header(bytes, 0)?;
    u64::from(header_size)
        .checked_add(entries_size)
        .ok_or(FatbinError::BadSize {
            what: "fatbin container",
            offset: 0,
            size: entries_size,
        })
}

/// `(header size, entries size)` of the container header at `offset`.
fn container_header(bytes: &[u8], offset: usize) -> Result<(u16, u64), FatbinError> {
    let truncated = FatbinError::Truncated {
        what: "fatbin header",
        offset,
    };
    let header = bytes
        .get(offset..)
        .and_then(|rest| rest.get(..HEADER_SIZE))
        .ok_or(truncated.clone())?;
    let mut r = WireReader::new(header);
    let magic = r.u32().map_err(|_| truncated.clone())?;
    if magic != FATBIN_MAGIC {
        return Err(FatbinError::BadMagic {
            offset,
            magic,
            expected: FATBIN_MAGIC,
        });
    }
    let _version = r.u16().map_err(|_| truncated.clone())?;
    let header_size = r.u16().map_err(|_| truncated.clone())?;
    let entries_size = r.u64().map_err(|_| truncated)?;
    if usize::from(header_size) < HEADER_SIZE {
        return Err(FatbinError::BadSize {
            what: "fatbin header",
            offset,
            size: header_size.into(),
        });
    }
    Ok((header_size, entries_size))
}

/// Reads every container in `bytes` and their entries. Zero bytes after a
/// container (alignment padding) are skipped; anything else there is an
/// error, as is a container or entry that does not fit.
pub fn parse(bytes: &[u8]) -> Result<Fatbin, FatbinError> {
    let mut fatbin = Fatbin::default();
    let mut offset = 0usize;
    loop {
        let (header_size, entries_size) = container_header(bytes, offset)?;
        let too_big = FatbinError::BadSize {
            what: "fatbin container",
            offset,
            size: entries_size,
        };
        let first_entry = offset
            .checked_add(header_size.into())
            .ok_or(too_big.clone())?;
        let end = usize::try_from(entries_size)
            .ok()
            .and_then(|size| first_entry.checked_add(size))
            .filter(|end| *end <= bytes.len())
            .ok_or(too_big)?;
        let container = fatbin.containers.len();
        let mut at = first_entry;
        while at < end {
            let (entry, next) = parse_entry(bytes, at, end, container)?;
            fatbin.entries.push(entry);
            at = next;
        }
        fatbin.containers.push(offset..end);
        fatbin.size = end;
        // Skip the padding up to the next container, if any.
        let rest = bytes.get(end..).unwrap_or_default();
        match rest.iter().position(|b| *b != 0) {
            Some(skip) => offset = end + skip,
            None => return Ok(fatbin),
        }
    }
}

/// The entry at `at` (inside a container ending at `end`) and where the
/// next one starts.
fn parse_entry(
    bytes: &[u8],
    at: usize,
    end: usize,
    container: usize,
) -> Result<(Entry, usize), FatbinError> {
    let truncated = FatbinError::Truncated {
        what: "fatbin entry header",
        offset: at,
    };
    let header = bytes
        .get(at..end)
        .and_then(|rest| rest.get(..ENTRY_HEADER_SIZE))
        .ok_or(truncated.clone())?;
    let mut r = WireReader::new(header);
    let mut field = || -> Result<u64, FatbinError> { r.u64().map_err(|_| truncated.clone()) };
    let word0 = field()?;
    let payload_size = field()?;
    let word2 = field()?;
    let word3 = field()?;
    let _name = field()?;
    let flags = field()?;
    let _zero = field()?;
    let uncompressed_size = field()?;
    let kind = word0 as u16;
    let version = (word0 >> 16) as u16;
    let header_size = (word0 >> 32) as u32;
    let compressed_size = word2 as u32;
    let arch = (word3 >> 32) as u32;
    if (header_size as usize) < ENTRY_HEADER_SIZE {
        return Err(FatbinError::BadSize {
            what: "fatbin entry header",
            offset: at,
            size: header_size.into(),
        });
    }
    let bad_payload = FatbinError::BadSize {
        what: "fatbin entry payload",
        offset: at,
        size: payload_size,
    };
    let start = at
        .checked_add(header_size as usize)
        .filter(|start| *start <= end)
        .ok_or(bad_payload.clone())?;
    let stop = usize::try_from(payload_size)
        .ok()
        .and_then(|size| start.checked_add(size))
        .filter(|stop| *stop <= end)
        .ok_or(bad_payload)?;
    let compression = Compression::from_flags(flags);
    if compression != Compression::None && u64::from(compressed_size) > payload_size {
        return Err(FatbinError::BadSize {
            what: "fatbin entry compressed data",
            offset: at,
            size: compressed_size.into(),
        });
    }
    let entry = Entry {
        kind,
        version,
        arch,
        flags,
        compression,
        compressed_size,
        uncompressed_size,
        payload: start..stop,
        container,
    };
    Ok((entry, stop))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry header plus payload, laid out as nvcc does.
    fn entry(kind: u16, arch: u32, flags: u64, payload: &[u8], compressed: u32) -> Vec<u8> {
        let padded = payload.len().div_ceil(8) * 8;
        let mut e = Vec::new();
        e.extend_from_slice(&kind.to_le_bytes());
        e.extend_from_slice(&0x0101u16.to_le_bytes());
        e.extend_from_slice(&64u32.to_le_bytes());
        e.extend_from_slice(&(padded as u64).to_le_bytes());
        e.extend_from_slice(&compressed.to_le_bytes());
        e.extend_from_slice(&0u32.to_le_bytes());
        e.extend_from_slice(&[0; 4]);
        e.extend_from_slice(&arch.to_le_bytes());
        e.extend_from_slice(&[0; 8]);
        e.extend_from_slice(&flags.to_le_bytes());
        e.extend_from_slice(&[0; 8]);
        e.extend_from_slice(&(payload.len() as u64 * 3).to_le_bytes());
        assert_eq!(e.len(), 64);
        e.extend_from_slice(payload);
        e.resize(64 + padded, 0);
        e
    }

    fn container(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut c = Vec::new();
        c.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&16u16.to_le_bytes());
        c.extend_from_slice(&(body.len() as u64).to_le_bytes());
        c.extend_from_slice(&body);
        c
    }

    #[test]
    fn reads_entries_of_one_container() {
        let f = container(&[
            entry(KIND_ELF, 90, FLAG_64BIT, b"\x7fELF sass", 0),
            entry(KIND_PTX, 90, FLAG_64BIT | FLAG_COMPRESSED_ZSTD, b"zstd!", 5),
        ]);
        let parsed = parse(&f).unwrap();
        assert_eq!(parsed.size, f.len());
        assert_eq!(parsed.containers, vec![0..f.len()]);
        assert_eq!(parsed.entries.len(), 2);
        let elf = &parsed.entries[0];
        assert!(elf.is_elf() && !elf.is_compressed());
        assert_eq!((elf.arch, elf.version), (90, 0x0101));
        assert_eq!(&f[elf.payload.clone()][..9], b"\x7fELF sass");
        assert_eq!(elf.payload.len(), 16);
        let ptx = &parsed.entries[1];
        assert!(ptx.is_ptx());
        assert_eq!(ptx.compression, Compression::Zstd);
        assert_eq!((ptx.compressed_size, ptx.uncompressed_size), (5, 15));
        assert_eq!(&f[ptx.payload.clone()][..5], b"zstd!");
        assert_eq!(container_size(&f), Ok(f.len() as u64));
    }

    #[test]
    fn reads_concatenated_containers_with_padding() {
        let mut f = container(&[entry(KIND_ELF, 80, FLAG_COMPRESSED_LZ4, b"lz4", 3)]);
        let first = f.len();
        f.extend_from_slice(&[0; 8]);
        let second_start = f.len();
        f.extend_from_slice(&container(&[
            entry(KIND_ELF, 90, 0, b"a", 0),
            entry(KIND_PTX, 90, 0, b"b", 0),
        ]));
        let total = f.len();
        f.extend_from_slice(&[0; 24]);
        let parsed = parse(&f).unwrap();
        assert_eq!(parsed.containers, vec![0..first, second_start..total]);
        assert_eq!(parsed.size, total);
        let summary: Vec<_> = parsed
            .entries
            .iter()
            .map(|e| (e.kind, e.arch, e.compression, e.container))
            .collect();
        assert_eq!(
            summary,
            vec![
                (KIND_ELF, 80, Compression::Lz4, 0),
                (KIND_ELF, 90, Compression::None, 1),
                (KIND_PTX, 90, Compression::None, 1),
            ]
        );
    }

    #[test]
    fn longer_entry_headers_are_skipped_by_their_size() {
        let mut e = entry(KIND_ELF, 100, 0, b"payload!", 0);
        e[4..8].copy_from_slice(&112u32.to_le_bytes());
        e.splice(64..64, [0xee; 48]);
        let f = container(&[e]);
        let parsed = parse(&f).unwrap();
        assert_eq!(&f[parsed.entries[0].payload.clone()], b"payload!");
    }

    #[test]
    fn empty_container_has_no_entries() {
        let f = container(&[]);
        assert_eq!(parse(&f).unwrap().entries, vec![]);
    }

    #[test]
    fn rejects_what_does_not_fit() {
        let good = container(&[entry(KIND_PTX, 90, 0, b".version", 0)]);
        // Entries size beyond the bytes.
        let mut f = good.clone();
        f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(parse(&f), Err(FatbinError::BadSize { .. })));
        // Payload beyond the container.
        let mut f = good.clone();
        f[24..32].copy_from_slice(&1000u64.to_le_bytes());
        assert!(matches!(parse(&f), Err(FatbinError::BadSize { .. })));
        // Entry header smaller than its known fields (would not advance).
        let mut f = good.clone();
        f[20..24].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(parse(&f), Err(FatbinError::BadSize { .. })));
        // Compressed size beyond the payload.
        let mut f = container(&[entry(KIND_ELF, 90, FLAG_COMPRESSED_LZ4, b"x", 9)]);
        assert!(matches!(parse(&f), Err(FatbinError::BadSize { .. })));
        f.truncate(20);
        assert!(matches!(parse(&f), Err(FatbinError::BadSize { .. })));
        // Garbage after a container.
        let mut f = good.clone();
        f.extend_from_slice(&[0, 0, 1, 2]);
        assert!(matches!(parse(&f), Err(FatbinError::Truncated { .. })));
        let mut f = good;
        f.extend_from_slice(&[7; 16]);
        assert!(matches!(parse(&f), Err(FatbinError::BadMagic { .. })));
        assert!(matches!(parse(b""), Err(FatbinError::Truncated { .. })));
        assert!(matches!(
            container_size(&WRAPPER_MAGIC.to_le_bytes().repeat(4)),
            Err(FatbinError::BadMagic { .. })
        ));
    }

    #[test]
    fn decodes_wrappers() {
        let mut w = Vec::new();
        w.extend_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        w.extend_from_slice(&2u32.to_le_bytes());
        w.extend_from_slice(&0x1234_5678u64.to_le_bytes());
        w.extend_from_slice(&0x9abcu64.to_le_bytes());
        assert_eq!(
            Wrapper::decode(&w),
            Ok(Wrapper {
                version: 2,
                data: 0x1234_5678,
                filename_or_prelinked: 0x9abc,
            })
        );
        assert!(matches!(
            Wrapper::decode(&w[..20]),
            Err(FatbinError::Truncated { .. })
        ));
        w[0] ^= 1;
        assert!(matches!(
            Wrapper::decode(&w),
            Err(FatbinError::BadMagic { .. })
        ));
    }
}

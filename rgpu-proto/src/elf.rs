//! How far a cubin (a 64-bit little-endian ELF image) reaches: its header,
//! its section and program header tables, and every section and segment
//! with bytes in the file. The driver API passes such images by pointer
//! alone, so the guest library sizes them with this; the daemon checks
//! with the same function that an image it received holds all of it.
//! (Fatbin containers are `crate::fatbin`'s.)

/// An ELF image starts with this.
pub const MAGIC: [u8; 4] = *b"\x7fELF";
pub const HEADER_SIZE: u64 = 64;
pub const SECTION_HEADER_SIZE: u64 = 64;
pub const PROGRAM_HEADER_SIZE: u64 = 56;
/// A section without bytes in the file (`.bss`, `.nv.global`).
pub const SHT_NOBITS: u32 = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    /// Not 64-bit little-endian: nothing nvcc writes for a current GPU.
    #[error("unsupported ELF image (class {class}, data {data})")]
    Unsupported { class: u8, data: u8 },
    /// A header, table, section or segment that is not there, or lies
    /// past `limit`.
    #[error("malformed ELF image: {0}")]
    Malformed(&'static str),
}

/// `len` bytes at `offset` of an image, if it has them.
pub type ReadAt<'a, 'b> = &'b mut dyn FnMut(u64, u64) -> Option<&'a [u8]>;

/// Where the image `read` hands out ends: the furthest end of its header,
/// tables, sections and segments, none of which may lie past `limit`
/// (tables are checked before any entry of theirs is read).
pub fn extent(read: ReadAt<'_, '_>, limit: u64) -> Result<u64, ElfError> {
    let header = read(0, HEADER_SIZE).ok_or(ElfError::Malformed("short header"))?;
    let (class, data) = (byte(header, 4), byte(header, 5));
    if class != 2 || data != 1 {
        return Err(ElfError::Unsupported { class, data });
    }
    let short = ElfError::Malformed("short header");
    let phoff = le_u64(header, 0x20).ok_or(short.clone())?;
    let shoff = le_u64(header, 0x28).ok_or(short.clone())?;
    let phentsize = le_u16(header, 0x36).ok_or(short.clone())?;
    let phnum = le_u16(header, 0x38).ok_or(short.clone())?;
    let shentsize = le_u16(header, 0x3a).ok_or(short.clone())?;
    let shnum = le_u16(header, 0x3c).ok_or(short)?;
    if (shnum > 0 && shentsize < SECTION_HEADER_SIZE)
        || (phnum > 0 && phentsize < PROGRAM_HEADER_SIZE)
    {
        return Err(ElfError::Malformed("header table entries too small"));
    }
    let within = |start: u64, len: u64, what: &'static str| {
        start
            .checked_add(len)
            .filter(|end| *end <= limit)
            .ok_or(ElfError::Malformed(what))
    };
    let tables = |offset: u64, size: u64, count: u64| {
        size.checked_mul(count)
            .ok_or(ElfError::Malformed("header table out of bounds"))
            .and_then(|len| within(offset, len, "header table out of bounds"))
    };
    let mut end = within(0, HEADER_SIZE, "short header")?
        .max(tables(shoff, shentsize, shnum)?)
        .max(tables(phoff, phentsize, phnum)?);
    for i in 0..shnum {
        let at = shoff + i * shentsize;
        let entry = read(at, SECTION_HEADER_SIZE).ok_or(ElfError::Malformed("section header"))?;
        if le_u32(entry, 4) == Some(SHT_NOBITS) {
            continue;
        }
        let (offset, size) = le_u64(entry, 0x18)
            .zip(le_u64(entry, 0x20))
            .ok_or(ElfError::Malformed("section header"))?;
        end = end.max(within(offset, size, "section out of bounds")?);
    }
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let entry = read(at, PROGRAM_HEADER_SIZE).ok_or(ElfError::Malformed("program header"))?;
        let (offset, size) = le_u64(entry, 0x08)
            .zip(le_u64(entry, 0x20))
            .ok_or(ElfError::Malformed("program header"))?;
        end = end.max(within(offset, size, "segment out of bounds")?);
    }
    Ok(end)
}

/// `len` bytes at `offset` of `image`, if they are there: the reader of an
/// image held in memory.
pub fn slice_at(image: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    image.get(start..end)
}

fn byte(bytes: &[u8], at: usize) -> u8 {
    bytes.get(at).copied().unwrap_or(0)
}

/// Little-endian integers at byte `at` of `bytes`, if they are there.
pub fn le_u16(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(bytes.get(at..at.checked_add(2)?)?.try_into().ok()?).into())
}

pub fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

pub fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF image of `len` bytes with one section of `size` bytes at
    /// `offset` (kind `kind`) in a section table at 128.
    fn image(len: usize, kind: u32, offset: u64, size: u64) -> Vec<u8> {
        let mut image = vec![0u8; len];
        image[..4].copy_from_slice(&MAGIC);
        image[4] = 2;
        image[5] = 1;
        image[0x28..0x30].copy_from_slice(&128u64.to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes());
        image[128 + 4..128 + 8].copy_from_slice(&kind.to_le_bytes());
        image[128 + 0x18..128 + 0x20].copy_from_slice(&offset.to_le_bytes());
        image[128 + 0x20..128 + 0x28].copy_from_slice(&size.to_le_bytes());
        image
    }

    fn extent_of(image: &[u8], limit: u64) -> Result<u64, ElfError> {
        extent(&mut |offset, len| slice_at(image, offset, len), limit)
    }

    #[test]
    fn the_furthest_section_or_table_is_the_end() {
        let e = image(1024, 1, 200, 300);
        assert_eq!(extent_of(&e, 1024), Ok(500));
        let e = image(1024, 1, 0, 10);
        assert_eq!(extent_of(&e, 1024), Ok(192));
        // Sections without file bytes do not count, wherever they say.
        let e = image(1024, SHT_NOBITS, 1 << 40, 1 << 40);
        assert_eq!(extent_of(&e, 1024), Ok(192));
    }

    #[test]
    fn anything_past_the_limit_or_malformed_is_refused() {
        let e = image(1024, 1, 900, 200);
        assert_eq!(
            extent_of(&e, 1024),
            Err(ElfError::Malformed("section out of bounds"))
        );
        let e = image(1024, 1, u64::MAX, 2);
        assert!(extent_of(&e, u64::MAX).is_err());
        assert_eq!(
            extent_of(&e[..150], 150),
            Err(ElfError::Malformed("header table out of bounds"))
        );
        let mut e32 = image(1024, 1, 0, 10);
        e32[4] = 1;
        assert_eq!(
            extent_of(&e32, 1024),
            Err(ElfError::Unsupported { class: 1, data: 1 })
        );
        assert!(extent_of(&e32[..10], 10).is_err());
    }
}

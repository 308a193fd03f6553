//! Finding a module image's size in application memory: the driver API
//! passes images by pointer alone (`cuModuleLoadData`), so the size comes
//! from the image's own format:
//!
//! - fatbin wrapper (`__fatBinC_Wrapper_t`, magic 0x466243B1): points at a
//!   fatbin header;
//! - fatbin header (magic 0xBA55ED50): header size plus payload size;
//! - ELF cubin: the furthest end of its header tables, sections and segments;
//! - otherwise PTX text, NUL-terminated (the NUL included).

use std::ffi::CStr;

use thiserror::Error;

pub const FATBIN_WRAPPER_MAGIC: u32 = 0x466243B1;
pub const FATBIN_MAGIC: u32 = 0xBA55ED50;
/// Largest image accepted.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELF64_HEADER: usize = 64;
const ELF64_SECTION_HEADER: u64 = 64;
const ELF64_PROGRAM_HEADER: u64 = 56;
const SHT_NOBITS: u32 = 8;
const FATBIN_HEADER: usize = 16;
const FATBIN_WRAPPER: usize = 24;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("NULL image")]
    Null,
    #[error("fatbin wrapper without a fatbin (data {0:#x})")]
    BadWrapper(u64),
    #[error("bad fatbin header (header size {header_size})")]
    BadFatbin { header_size: u16 },
    #[error("unsupported ELF image (class {class}, data {data})")]
    UnsupportedElf { class: u8, data: u8 },
    #[error("malformed ELF image: {0}")]
    BadElf(&'static str),
    #[error("image of {0} bytes exceeds the limit")]
    TooLarge(u64),
}

/// The image at `image`, as bytes.
///
/// # Safety
/// `image` must point to a valid module image of one of the formats above
/// (as the driver API requires): the bytes its headers describe must be
/// readable.
pub unsafe fn image_bytes<'a>(image: *const u8) -> Result<&'a [u8], ImageError> {
    if image.is_null() {
        return Err(ImageError::Null);
    }
    let mut head = [0u8; 4];
    for (i, byte) in head.iter_mut().enumerate() {
        // SAFETY: bytes are read one at a time up to the first NUL, which
        // every image format (binary magic or PTX text) has in bounds.
        *byte = unsafe { image.add(i).read() };
        if *byte == 0 {
            // A PTX string shorter than a magic number.
            // SAFETY: `i + 1` bytes were just read.
            return Ok(unsafe { std::slice::from_raw_parts(image, i + 1) });
        }
    }
    let magic = u32::from_le_bytes(head);
    let len = match magic {
        FATBIN_WRAPPER_MAGIC => {
            // SAFETY: a wrapper is 24 bytes (caller's contract).
            let wrapper = unsafe { std::slice::from_raw_parts(image, FATBIN_WRAPPER) };
            let data = read_u64(wrapper, 8).unwrap_or(0);
            if data == 0 {
                return Err(ImageError::BadWrapper(data));
            }
            // SAFETY: the wrapper's data pointer points at a fatbin header.
            let fatbin_head = unsafe { std::slice::from_raw_parts(data as *const u8, 4) };
            if read_u32(fatbin_head, 0) != Some(FATBIN_MAGIC) {
                return Err(ImageError::BadWrapper(data));
            }
            // SAFETY: as above.
            return unsafe { image_bytes(data as *const u8) };
        }
        FATBIN_MAGIC => {
            // SAFETY: a fatbin header is 16 bytes (caller's contract).
            let header = unsafe { std::slice::from_raw_parts(image, FATBIN_HEADER) };
            fatbin_size(header)?
        }
        _ if head == ELF_MAGIC => {
            // SAFETY: an ELF64 header is 64 bytes (caller's contract).
            let header = unsafe { std::slice::from_raw_parts(image, ELF64_HEADER) };
            // SAFETY: the tables the header names lie inside the image.
            unsafe { elf_size(image, header)? }
        }
        _ => {
            // SAFETY: anything else is PTX text, NUL-terminated.
            let text = unsafe { CStr::from_ptr(image.cast()) };
            text.to_bytes_with_nul().len() as u64
        }
    };
    if len > MAX_IMAGE_BYTES {
        return Err(ImageError::TooLarge(len));
    }
    // SAFETY: `len` bytes of image, as its format says (checked above).
    Ok(unsafe { std::slice::from_raw_parts(image, len as usize) })
}

fn fatbin_size(header: &[u8]) -> Result<u64, ImageError> {
    let header_size = read_u16(header, 6).unwrap_or(0);
    let fat_size = read_u64(header, 8).unwrap_or(u64::MAX);
    if usize::from(header_size) < FATBIN_HEADER {
        return Err(ImageError::BadFatbin { header_size });
    }
    u64::from(header_size)
        .checked_add(fat_size)
        .ok_or(ImageError::TooLarge(u64::MAX))
}

/// # Safety
/// `image` points at an ELF image whose header is `header`.
unsafe fn elf_size(image: *const u8, header: &[u8]) -> Result<u64, ImageError> {
    let class = header.get(4).copied().unwrap_or(0);
    let data = header.get(5).copied().unwrap_or(0);
    if class != 2 || data != 1 {
        return Err(ImageError::UnsupportedElf { class, data });
    }
    let field = |offset| read_u64(header, offset).ok_or(ImageError::BadElf("short header"));
    let half = |offset| {
        read_u16(header, offset)
            .map(u64::from)
            .ok_or(ImageError::BadElf("short header"))
    };
    let (phoff, shoff) = (field(0x20)?, field(0x28)?);
    let (phentsize, phnum) = (half(0x36)?, half(0x38)?);
    let (shentsize, shnum) = (half(0x3a)?, half(0x3c)?);
    if (shnum > 0 && shentsize < ELF64_SECTION_HEADER)
        || (phnum > 0 && phentsize < ELF64_PROGRAM_HEADER)
    {
        return Err(ImageError::BadElf("header table entries too small"));
    }
    let table_end = |off: u64, size: u64, num: u64| {
        size.checked_mul(num)
            .and_then(|len| off.checked_add(len))
            .filter(|end| *end <= MAX_IMAGE_BYTES)
            .ok_or(ImageError::BadElf("header table out of bounds"))
    };
    let mut end = (ELF64_HEADER as u64)
        .max(table_end(shoff, shentsize, shnum)?)
        .max(table_end(phoff, phentsize, phnum)?);

    for i in 0..shnum {
        // SAFETY: the section header table lies inside the image (bounded
        // above by MAX_IMAGE_BYTES).
        let sh = unsafe { table_entry(image, shoff, shentsize, i, ELF64_SECTION_HEADER) };
        if read_u32(sh, 4) == Some(SHT_NOBITS) {
            continue;
        }
        let section_end = read_u64(sh, 0x18)
            .zip(read_u64(sh, 0x20))
            .and_then(|(offset, size)| offset.checked_add(size))
            .ok_or(ImageError::BadElf("section out of bounds"))?;
        end = end.max(section_end);
    }
    for i in 0..phnum {
        // SAFETY: as above, for the program header table.
        let ph = unsafe { table_entry(image, phoff, phentsize, i, ELF64_PROGRAM_HEADER) };
        let segment_end = read_u64(ph, 0x08)
            .zip(read_u64(ph, 0x20))
            .and_then(|(offset, size)| offset.checked_add(size))
            .ok_or(ImageError::BadElf("segment out of bounds"))?;
        end = end.max(segment_end);
    }
    if end > MAX_IMAGE_BYTES {
        return Err(ImageError::TooLarge(end));
    }
    Ok(end)
}

/// # Safety
/// `image + offset + index * entry_size` is `len` readable bytes.
unsafe fn table_entry<'a>(
    image: *const u8,
    offset: u64,
    entry_size: u64,
    index: u64,
    len: u64,
) -> &'a [u8] {
    // Bounded by MAX_IMAGE_BYTES (checked by the caller), so no overflow.
    let at = offset + index * entry_size;
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(image.add(at as usize), len as usize) }
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_of(image: &[u8]) -> Result<usize, ImageError> {
        // SAFETY: test images are complete buffers.
        unsafe { image_bytes(image.as_ptr()) }.map(<[u8]>::len)
    }

    #[test]
    fn ptx_includes_the_nul() {
        let ptx = b".version 8.0\n.target sm_80\n\0garbage after";
        assert_eq!(size_of(ptx), Ok(28));
    }

    fn fatbin(payload: usize) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        f.extend_from_slice(&(payload as u64).to_le_bytes());
        f.resize(16 + payload, 0xab);
        f.extend_from_slice(&[0; 32]); // not part of the image
        f
    }

    #[test]
    fn short_ptx_is_read_up_to_its_nul() {
        assert_eq!(size_of(b"ab\0"), Ok(3));
        assert_eq!(size_of(b"\0"), Ok(1));
    }

    #[test]
    fn bare_fatbin_is_header_plus_payload() {
        assert_eq!(size_of(&fatbin(100)), Ok(116));
    }

    #[test]
    fn fatbin_with_short_header_is_rejected() {
        let mut f = fatbin(8);
        f[6] = 4;
        assert_eq!(size_of(&f), Err(ImageError::BadFatbin { header_size: 4 }));
    }

    #[test]
    fn wrapper_points_at_the_fatbin() {
        let f = fatbin(40);
        let mut w = Vec::new();
        w.extend_from_slice(&FATBIN_WRAPPER_MAGIC.to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&(f.as_ptr() as u64).to_le_bytes());
        w.extend_from_slice(&0u64.to_le_bytes());
        // SAFETY: the wrapper points at a live fatbin buffer.
        let bytes = unsafe { image_bytes(w.as_ptr()) }.unwrap();
        assert_eq!(bytes.as_ptr(), f.as_ptr());
        assert_eq!(bytes.len(), 56);
    }

    #[test]
    fn wrapper_without_fatbin_is_rejected() {
        let not_fatbin = [0u8; 16];
        let mut w = Vec::new();
        w.extend_from_slice(&FATBIN_WRAPPER_MAGIC.to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&(not_fatbin.as_ptr() as u64).to_le_bytes());
        w.extend_from_slice(&0u64.to_le_bytes());
        assert!(matches!(size_of(&w), Err(ImageError::BadWrapper(_))));
    }

    /// A minimal ELF64: header, two sections (one NOBITS whose size must
    /// not count), one program header, section headers at the end.
    fn elf() -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(&ELF_MAGIC);
        e[4] = 2;
        e[5] = 1;
        let phoff = 64u64;
        let text_off = phoff + 56;
        let text_len = 40u64;
        let shoff = text_off + text_len;
        e[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        e[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        e[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        e[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        e[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        e[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        let mut ph = vec![0u8; 56];
        ph[0x08..0x10].copy_from_slice(&text_off.to_le_bytes());
        ph[0x20..0x28].copy_from_slice(&text_len.to_le_bytes());
        e.extend_from_slice(&ph);
        e.resize((text_off + text_len) as usize, 0x11);
        let section = |kind: u32, off: u64, len: u64| {
            let mut sh = vec![0u8; 64];
            sh[4..8].copy_from_slice(&kind.to_le_bytes());
            sh[0x18..0x20].copy_from_slice(&off.to_le_bytes());
            sh[0x20..0x28].copy_from_slice(&len.to_le_bytes());
            sh
        };
        e.extend_from_slice(&section(0, 0, 0));
        e.extend_from_slice(&section(1, text_off, text_len));
        e.extend_from_slice(&section(SHT_NOBITS, text_off, 1 << 40));
        e
    }

    #[test]
    fn elf_ends_at_its_furthest_table() {
        let mut e = elf();
        let len = e.len();
        assert_eq!(len, 64 + 56 + 40 + 3 * 64);
        e.extend_from_slice(&[0xff; 64]); // trailing bytes are not the image
        assert_eq!(size_of(&e), Ok(len));
    }

    #[test]
    fn elf_section_beyond_the_limit_is_rejected() {
        let mut e = elf();
        let sh1 = 64 + 56 + 40 + 64;
        e[sh1 + 0x20..sh1 + 0x28].copy_from_slice(&(MAX_IMAGE_BYTES * 2).to_le_bytes());
        assert!(matches!(size_of(&e), Err(ImageError::TooLarge(_))));
    }

    #[test]
    fn elf32_is_rejected() {
        let mut e = elf();
        e[4] = 1;
        assert_eq!(
            size_of(&e),
            Err(ImageError::UnsupportedElf { class: 1, data: 1 })
        );
    }

    #[test]
    fn null_is_rejected() {
        // SAFETY: NULL is checked before anything is read.
        let result = unsafe { image_bytes(std::ptr::null()) };
        assert_eq!(result, Err(ImageError::Null));
    }
}

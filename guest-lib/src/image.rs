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

use rgpu_proto::elf::{self, le_u64};
use rgpu_proto::fatbin::{self, FATBIN_MAGIC, WRAPPER_MAGIC};

/// Largest image accepted.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("NULL image")]
    Null,
    #[error("fatbin wrapper without a fatbin (data {0:#x})")]
    BadWrapper(u64),
    #[error("bad fatbin header: {0}")]
    BadFatbin(#[from] fatbin::FatbinError),
    #[error(transparent)]
    Elf(#[from] elf::ElfError),
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
        WRAPPER_MAGIC => {
            // SAFETY: a wrapper is 24 bytes (caller's contract).
            let wrapper = unsafe { std::slice::from_raw_parts(image, fatbin::WRAPPER_SIZE) };
            let data = le_u64(wrapper, 8).unwrap_or(0);
            if data == 0 {
                return Err(ImageError::BadWrapper(data));
            }
            // SAFETY: the wrapper's data pointer points at a fatbin header.
            let fatbin_head = unsafe { std::slice::from_raw_parts(data as *const u8, 4) };
            if elf::le_u32(fatbin_head, 0) != Some(FATBIN_MAGIC) {
                return Err(ImageError::BadWrapper(data));
            }
            // SAFETY: as above.
            return unsafe { image_bytes(data as *const u8) };
        }
        FATBIN_MAGIC => {
            // SAFETY: a fatbin header is 16 bytes (caller's contract).
            let header = unsafe { std::slice::from_raw_parts(image, fatbin::HEADER_SIZE) };
            fatbin::container_size(header)?
        }
        _ if head == elf::MAGIC => {
            let mut read = |offset: u64, len: u64| {
                // SAFETY: an ELF image holds what its header describes (the
                // caller's contract), and `extent` reads only what the
                // header describes, below the limit.
                Some(unsafe {
                    std::slice::from_raw_parts(image.add(offset as usize), len as usize)
                })
            };
            elf::extent(&mut read, MAX_IMAGE_BYTES)?
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
        assert!(matches!(size_of(&f), Err(ImageError::BadFatbin(_))));
    }

    #[test]
    fn wrapper_points_at_the_fatbin() {
        let f = fatbin(40);
        let mut w = Vec::new();
        w.extend_from_slice(&WRAPPER_MAGIC.to_le_bytes());
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
        w.extend_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&(not_fatbin.as_ptr() as u64).to_le_bytes());
        w.extend_from_slice(&0u64.to_le_bytes());
        assert!(matches!(size_of(&w), Err(ImageError::BadWrapper(_))));
    }

    /// A minimal ELF64: header, two sections (one NOBITS whose size must
    /// not count), one program header, section headers at the end.
    fn elf() -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(&elf::MAGIC);
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
        e.extend_from_slice(&section(elf::SHT_NOBITS, text_off, 1 << 40));
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
        assert!(matches!(size_of(&e), Err(ImageError::Elf(_))));
    }

    #[test]
    fn elf32_is_rejected() {
        let mut e = elf();
        e[4] = 1;
        assert_eq!(
            size_of(&e),
            Err(ImageError::Elf(elf::ElfError::Unsupported {
                class: 1,
                data: 1
            }))
        );
    }

    #[test]
    fn null_is_rejected() {
        // SAFETY: NULL is checked before anything is read.
        let result = unsafe { image_bytes(std::ptr::null()) };
        assert_eq!(result, Err(ImageError::Null));
    }
}

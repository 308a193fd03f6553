//! What kind of code image a guest sent, checked before a driver reads it.
//!
//! `cuModuleLoadData` takes no length: the driver trusts the sizes inside
//! the image. A guest image whose headers point past its end would make the
//! daemon read beyond the guest's blob, so the headers the driver follows
//! first are checked against the real length here. A fatbin *wrapper*
//! (`__fatBinC_Wrapper_t`) holds a pointer into the guest's address space
//! and is refused: the guest library sends the fatbin it points to.

use thiserror::Error;

use rgpu_proto::elf;
use rgpu_proto::fatbin::{FATBIN_MAGIC, WRAPPER_MAGIC};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// PTX text (NUL-terminated or not).
    Ptx,
    /// A cubin (64-bit little-endian ELF).
    Cubin,
    /// A fatbin (header `0xBA55ED50` and its entries).
    Fatbin,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ImageError {
    #[error("empty module image")]
    Empty,
    #[error("fatbin wrapper (it holds a guest pointer); send the fatbin it points to")]
    FatbinWrapper,
    #[error("{0} points past the end of the image")]
    OutOfBounds(&'static str),
    #[error("not PTX, a cubin or a fatbin")]
    Unknown,
}

/// Classifies an image and checks the sizes its headers declare.
pub fn classify(image: &[u8]) -> Result<ImageKind, ImageError> {
    if image.is_empty() {
        return Err(ImageError::Empty);
    }
    if image.starts_with(&elf::MAGIC) {
        check_elf(image)?;
        return Ok(ImageKind::Cubin);
    }
    match elf::le_u32(image, 0) {
        Some(WRAPPER_MAGIC) => return Err(ImageError::FatbinWrapper),
        Some(FATBIN_MAGIC) => {
            check_fatbin(image)?;
            return Ok(ImageKind::Fatbin);
        }
        _ => {}
    }
    if crate::ptx::text(image).is_some() {
        return Ok(ImageKind::Ptx);
    }
    Err(ImageError::Unknown)
}

fn check_elf(image: &[u8]) -> Result<(), ImageError> {
    // Everything the header describes must lie inside the image: the
    // driver follows those offsets.
    let len = image.len() as u64;
    if len < elf::HEADER_SIZE {
        return Err(ImageError::Unknown);
    }
    match elf::extent(&mut |offset, n| elf::slice_at(image, offset, n), len) {
        Ok(_) => Ok(()),
        // 64-bit little-endian only: what nvcc writes for every current GPU.
        Err(elf::ElfError::Unsupported { .. }) => Err(ImageError::Unknown),
        Err(elf::ElfError::Malformed(what)) => Err(ImageError::OutOfBounds(what)),
    }
}

/// Header: magic `u32`, version `u16`, header size `u16`, size of the
/// entries that follow `u64`.
fn check_fatbin(image: &[u8]) -> Result<(), ImageError> {
    // Every container header and entry header must lie inside the image,
    // with every entry's payload: the driver follows those sizes.
    const HEADER_SIZE: usize = 16;
    if image.len() < HEADER_SIZE {
        return Err(ImageError::OutOfBounds("fatbin header"));
    }
    rgpu_proto::fatbin::parse(image)
        .map(|_| ())
        .map_err(|_| ImageError::OutOfBounds("fatbin entries"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(shoff: u64, shnum: u16, section_offset: u64, section_size: u64) -> Vec<u8> {
        let mut image = vec![0u8; 256];
        image[..4].copy_from_slice(&elf::MAGIC);
        image[4] = 2;
        image[5] = 1;
        image[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&shnum.to_le_bytes());
        let start = usize::try_from(shoff).unwrap_or(usize::MAX);
        let section = image.get_mut(start..start.saturating_add(64));
        if let Some(section) = section.filter(|_| shnum > 0) {
            section[4..8].copy_from_slice(&1u32.to_le_bytes());
            section[0x18..0x20].copy_from_slice(&section_offset.to_le_bytes());
            section[0x20..0x28].copy_from_slice(&section_size.to_le_bytes());
        }
        image
    }

    /// A fatbin container with one ELF entry whose header claims a
    /// `payload_size` payload, and `payload` bytes of it actually present.
    fn fatbin(entries_size: u64, payload_size: u64, payload: usize) -> Vec<u8> {
        let mut image = vec![0u8; 16 + 64 + payload];
        image[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image[4..6].copy_from_slice(&1u16.to_le_bytes());
        image[6..8].copy_from_slice(&16u16.to_le_bytes());
        image[8..16].copy_from_slice(&entries_size.to_le_bytes());
        // Entry: kind 2 (ELF), version 0x101, header size 64.
        image[16..24].copy_from_slice(&((64u64 << 32) | (0x101 << 16) | 2).to_le_bytes());
        image[24..32].copy_from_slice(&payload_size.to_le_bytes());
        image
    }

    #[test]
    fn accepts_well_formed_images() {
        assert_eq!(classify(&elf(64, 1, 128, 128)), Ok(ImageKind::Cubin));
        assert_eq!(classify(&elf(0, 0, 0, 0)), Ok(ImageKind::Cubin));
        assert_eq!(classify(&fatbin(64 + 32, 32, 32)), Ok(ImageKind::Fatbin));
        assert_eq!(
            classify(b".version 9.0\n.target sm_90\n\0"),
            Ok(ImageKind::Ptx)
        );
    }

    #[test]
    fn rejects_headers_pointing_outside() {
        assert_eq!(
            classify(&elf(64, 1, 128, 129)),
            Err(ImageError::OutOfBounds("section out of bounds"))
        );
        assert_eq!(
            classify(&elf(u64::MAX - 10, 2, 0, 0)),
            Err(ImageError::OutOfBounds("header table out of bounds"))
        );
        assert_eq!(
            classify(&elf(200, 1, 0, 0)),
            Err(ImageError::OutOfBounds("header table out of bounds"))
        );
        // The container runs past the image.
        assert_eq!(
            classify(&fatbin(64 + 33, 32, 32)),
            Err(ImageError::OutOfBounds("fatbin entries"))
        );
        assert_eq!(
            classify(&fatbin(u64::MAX, 32, 32)),
            Err(ImageError::OutOfBounds("fatbin entries"))
        );
        // The container fits, but an entry's payload runs past it: the driver
        // would follow that size.
        assert_eq!(
            classify(&fatbin(64 + 32, 33, 32)),
            Err(ImageError::OutOfBounds("fatbin entries"))
        );
        assert_eq!(
            classify(&fatbin(64 + 32, u64::MAX, 32)),
            Err(ImageError::OutOfBounds("fatbin entries"))
        );
        assert_eq!(
            classify(&FATBIN_MAGIC.to_le_bytes()),
            Err(ImageError::OutOfBounds("fatbin header"))
        );
    }

    #[test]
    fn rejects_wrappers_and_unknown_bytes() {
        let mut wrapper = WRAPPER_MAGIC.to_le_bytes().to_vec();
        wrapper.extend_from_slice(&[1, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]);
        assert_eq!(classify(&wrapper), Err(ImageError::FatbinWrapper));
        assert_eq!(classify(b""), Err(ImageError::Empty));
        assert_eq!(classify(b"hello"), Err(ImageError::Unknown));
        assert_eq!(classify(b"\x7fELF\x01\x01"), Err(ImageError::Unknown));
    }
}

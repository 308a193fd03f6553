//! Reading a control request out of its descriptor chain and decoding the
//! request bodies that rgpu-proto does not describe (they are plain fixed
//! layouts of the virtio spec).

use std::io::Read;

use rgpu_proto::batch::MAX_BATCH_BYTES;
use rgpu_proto::virtio_gpu::{CtrlHdr, CTRL_HDR_SIZE, CTX_DEBUG_NAME_BYTES, MAX_BLOB_ENTRIES};
use rgpu_proto::wire::{DecodeError, WireReader};
use virtio_queue::Reader;

use super::response::Chain;

/// The largest request read from a chain: a RESOURCE_CREATE_BLOB with the
/// most entries accepted (header, fixed fields, entries).
pub const MAX_REQUEST_BYTES: usize = CTRL_HDR_SIZE + 32 + 16 * MAX_BLOB_ENTRIES as usize;

/// Why a request could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("descriptor chain is not readable guest memory: {0}")]
    Chain(virtio_queue::Error),
    #[error("request of {len} bytes is larger than the {MAX_REQUEST_BYTES} accepted")]
    TooLarge {
        len: usize,
        /// The header, so the error response can echo the fence.
        header: Option<CtrlHdr>,
    },
    #[error("reading the request failed: {0}")]
    Io(std::io::Error),
}

impl ReadError {
    /// The request's header, where it could be read.
    pub fn header(&self) -> Option<CtrlHdr> {
        match self {
            ReadError::TooLarge { header, .. } => *header,
            ReadError::Chain(_) | ReadError::Io(_) => None,
        }
    }
}

/// Copies the device-readable part of `chain` out of guest memory (the guest
/// may change it while we look, so we decode only our copy).
pub fn read_request(chain: &Chain) -> Result<Vec<u8>, ReadError> {
    let mut reader: Reader<'_> =
        Reader::new(chain.memory(), chain.clone()).map_err(ReadError::Chain)?;
    let len = reader.available_bytes();
    if len > MAX_REQUEST_BYTES {
        let mut head = [0u8; CTRL_HDR_SIZE];
        let header = reader
            .read_exact(&mut head)
            .ok()
            .and_then(|()| header(&head));
        return Err(ReadError::TooLarge { len, header });
    }
    let mut bytes = vec![0u8; len];
    reader.read_exact(&mut bytes).map_err(ReadError::Io)?;
    Ok(bytes)
}

/// The header of a request, if at least that much arrived.
pub fn header(bytes: &[u8]) -> Option<CtrlHdr> {
    CtrlHdr::decode(&mut WireReader::new(bytes)).ok()
}

/// The body of a request: everything after the control header.
pub fn body(bytes: &[u8]) -> &[u8] {
    bytes.get(CTRL_HDR_SIZE..).unwrap_or_default()
}

/// `GET_CAPSET_INFO`: which capset (by index).
pub fn capset_index(body: &[u8]) -> Result<u32, DecodeError> {
    let mut r = WireReader::new(body);
    let index = r.u32()?;
    let _padding = r.u32()?;
    Ok(index)
}

/// `GET_CAPSET`: `(capset id, version)`.
pub fn capset_request(body: &[u8]) -> Result<(u32, u32), DecodeError> {
    let mut r = WireReader::new(body);
    Ok((r.u32()?, r.u32()?))
}

/// `CTX_CREATE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtxCreate {
    pub context_init: u32,
    pub debug_name: String,
}

pub fn ctx_create(body: &[u8]) -> Result<CtxCreate, DecodeError> {
    let mut r = WireReader::new(body);
    let nlen = r.u32()?;
    let context_init = r.u32()?;
    let name = r.take(CTX_DEBUG_NAME_BYTES)?;
    let name = usize::try_from(nlen)
        .ok()
        .and_then(|n| name.get(..n))
        .ok_or(DecodeError::LengthOutOfRange {
            length: nlen.into(),
            limit: CTX_DEBUG_NAME_BYTES as u64,
        })?;
    // The driver's name is a process name; keep it printable.
    let debug_name = String::from_utf8_lossy(name)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    Ok(CtxCreate {
        context_init,
        debug_name,
    })
}

/// The `resource_id` (and padding) body of `RESOURCE_UNREF`,
/// `CTX_ATTACH_RESOURCE` and `CTX_DETACH_RESOURCE`.
pub fn resource_id(body: &[u8]) -> Result<u32, DecodeError> {
    let mut r = WireReader::new(body);
    let id = r.u32()?;
    let _padding = r.u32()?;
    Ok(id)
}

/// `SUBMIT_3D`: the command bytes it carries (`size` checked against the
/// request and against [`MAX_BATCH_BYTES`]).
pub fn submit_payload(body: &[u8]) -> Result<&[u8], DecodeError> {
    let mut r = WireReader::new(body);
    let size = r.u32()?;
    // Padding, or `num_in_fences` in newer specs; Linux sends 0.
    let _padding = r.u32()?;
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if size > MAX_BATCH_BYTES {
        return Err(DecodeError::LengthOutOfRange {
            length: size as u64,
            limit: MAX_BATCH_BYTES as u64,
        });
    }
    r.take(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctx_create_bounds_the_name() {
        let mut body = vec![0u8; 8 + CTX_DEBUG_NAME_BYTES];
        body[..4].copy_from_slice(&5u32.to_le_bytes());
        body[4..8].copy_from_slice(&23u32.to_le_bytes());
        body[8..13].copy_from_slice(b"a\nbcd");
        let c = ctx_create(&body).unwrap();
        assert_eq!(c.context_init, 23);
        assert_eq!(c.debug_name, "abcd");

        body[..4].copy_from_slice(&65u32.to_le_bytes());
        assert!(ctx_create(&body).is_err());
        assert!(ctx_create(&body[..40]).is_err());
    }

    #[test]
    fn submit_size_must_fit() {
        let mut body = vec![0u8; 8 + 16];
        body[..4].copy_from_slice(&16u32.to_le_bytes());
        assert_eq!(submit_payload(&body).unwrap().len(), 16);
        body[..4].copy_from_slice(&17u32.to_le_bytes());
        assert!(submit_payload(&body).is_err());
        body[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(submit_payload(&body).is_err());
    }
}

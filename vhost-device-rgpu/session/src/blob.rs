//! Guest blobs (`RESOURCE_CREATE_BLOB` with `BLOB_MEM_GUEST`): a list of
//! guest-physical ranges, resolved once into host mappings.
//!
//! Interface used by the device model:
//! - `Blob::new(resource_id, size, &entries, &GuestMemory) -> Result<Blob, BlobError>`
//!   checks that the entries cover exactly `size` bytes and lie inside guest
//!   memory, and keeps the memory mapping alive;
//! - `Blob::resource_id()`, `Blob::size()`.

#[derive(Debug)]
pub struct Blob;

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("placeholder")]
    Placeholder,
}

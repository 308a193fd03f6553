//! What one connection (a VM, or a local process) may hold at once. Every
//! count and size a guest picks is bounded on the daemon side; the README's
//! "Limits" table lists these with their defaults.

/// Live virtio-gpu contexts (guest CUDA contexts) per connection.
pub const MAX_CONTEXTS: usize = 1024;
/// Worker processes (guest processes using the GPU at once) per connection.
pub const MAX_WORKERS: usize = 64;
/// Live blob resources per connection.
pub const MAX_RESOURCES: usize = 65_536;
/// Blob entries (guest page runs) of all live blobs of a connection.
pub const MAX_BLOB_ENTRIES: usize = 1 << 20;
/// Fenced submissions waiting for one worker; beyond, a fence is answered
/// at once (its guest then sees the context as lost).
pub const MAX_PENDING_FENCES: usize = 4096;
/// How long a worker whose last context ended may take to end its sessions
/// before it is killed (an endless kernel must not keep it forever).
pub const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// Under `--profile-launches`, how long the workers of a connection that
/// ended (or was reset) may take to end their sessions, which log their
/// profiles as they end, before they are killed.
pub const PROFILE_END_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

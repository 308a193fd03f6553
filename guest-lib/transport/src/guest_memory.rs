//! Guest memory of the local carrier: one memfd shared with the daemon, and
//! an allocator of page-aligned ranges in it (vrings, channel blobs, pinned
//! host memory).

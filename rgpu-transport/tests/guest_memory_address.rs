//! The local carrier's guest memory lies at its address hint in a fresh
//! process (its own test binary: no other test has mapped anything there),
//! and a second one, which cannot, lies elsewhere without overlapping it.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rgpu_transport::guest_memory::{GuestMemory, ADDRESS_HINT};

#[test]
fn guest_memory_lies_at_the_hint_while_that_is_free() {
    const SIZE: u64 = 64 << 20;
    let first = GuestMemory::new(SIZE).expect("guest memory");
    assert_eq!(first.base() as usize, ADDRESS_HINT);
    let second = GuestMemory::new(SIZE).expect("guest memory");
    let (a, b) = (first.base() as u64, second.base() as u64);
    assert_ne!(a, b);
    assert!(a + SIZE <= b || b + SIZE <= a, "{a:#x} and {b:#x} overlap");
}

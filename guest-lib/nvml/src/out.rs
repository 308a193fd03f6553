//! Writing results through the application's pointers: null pointers and
//! short buffers are the application's errors, reported as NVML does.

use std::ffi::c_char;

use crate::abi::{NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT};

/// Stores `value` at `ptr`.
pub fn value<T>(ptr: *mut T, value: T) -> Result<(), u32> {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: a non-null out-pointer the application passed for a `T`, as
    // the NVML entry point's contract requires; unaligned stores tolerate a
    // sloppy caller.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and a NUL into the application's buffer of `length` bytes.
pub fn string(buffer: *mut c_char, length: u32, text: &str) -> Result<(), u32> {
    if buffer.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() >= length as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the application's buffer holds `length` bytes (NVML's
    // contract), more than the text and its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), bytes.len());
        buffer.add(bytes.len()).write(0);
    }
    Ok(())
}

/// A fixed C array filled with `text` (cut to leave room for the NUL).
pub fn array<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().take(N.saturating_sub(1)).zip(text.bytes()) {
        *dst = src as c_char;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_need_room_for_their_nul() {
        let mut buffer = [b'x' as c_char; 8];
        assert_eq!(
            string(buffer.as_mut_ptr(), 3, "abc"),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(string(buffer.as_mut_ptr(), 4, "abc"), Ok(()));
        assert_eq!(&buffer[..5], &[97, 98, 99, 0, b'x' as c_char]);
        assert_eq!(
            string(std::ptr::null_mut(), 8, "a"),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
        assert_eq!(
            value(std::ptr::null_mut::<u32>(), 1),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
        let a: [c_char; 4] = array("abcdef");
        assert_eq!(a, [97, 98, 99, 0]);
    }
}

//! Kernel parameters of `cuLaunchKernel`, marshalled into one buffer laid
//! out as the host described the function ([`FunctionInfo`]): either from
//! `kernelParams` (one pointer per parameter) or from the `extra` form
//! (`CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`,
//! `CU_LAUNCH_PARAM_END`).

use std::ffi::c_void;

use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_VALUE;
use rgpu_proto::reply::FunctionInfo;
use rgpu_proto::MAX_KERNEL_PARAMS_BYTES;

pub const CU_LAUNCH_PARAM_END: usize = 0;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;
/// Bound on the `extra` array walked looking for its END.
const MAX_EXTRA_ENTRIES: usize = 64;

/// Builds the parameter buffer.
///
/// # Safety
/// See [`marshal_into`].
pub unsafe fn marshal(
    info: &FunctionInfo,
    kernel_params: *const *const c_void,
    extra: *const *const c_void,
) -> Result<Vec<u8>, u32> {
    let mut buffer = Vec::new();
    // SAFETY: the caller's contract.
    unsafe { marshal_into(info, kernel_params, extra, &mut buffer) }?;
    Ok(buffer)
}

/// Builds the parameter buffer in `buffer` (emptied first; a launch reuses
/// one, so marshalling allocates nothing once it has grown).
///
/// # Safety
/// As `cuLaunchKernel` requires: a non-NULL `kernel_params` holds one valid
/// pointer per parameter of the function, each to at least the parameter's
/// size; a non-NULL `extra` is a key/value array ending in
/// `CU_LAUNCH_PARAM_END` whose buffer holds the size it states.
pub unsafe fn marshal_into(
    info: &FunctionInfo,
    kernel_params: *const *const c_void,
    extra: *const *const c_void,
    buffer: &mut Vec<u8>,
) -> Result<(), u32> {
    buffer.clear();
    let size = info.buffer_size();
    if size > MAX_KERNEL_PARAMS_BYTES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !kernel_params.is_null() {
        buffer.resize(size, 0);
        for (i, slot) in info.params.iter().enumerate() {
            // SAFETY: one pointer per parameter (caller's contract).
            let arg = unsafe { kernel_params.add(i).read() };
            let len = slot.size as usize;
            if arg.is_null() && len > 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let start = slot.offset as usize;
            let dst = buffer
                .get_mut(start..start + len)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if len > 0 {
                // SAFETY: the parameter is `len` readable bytes (caller's
                // contract).
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(arg.cast::<u8>(), len) });
            }
        }
        return Ok(());
    }
    if !extra.is_null() {
        // SAFETY: the caller's contract on `extra`.
        let from_extra = unsafe { from_extra(extra) }?;
        buffer.extend_from_slice(from_extra);
        return Ok(());
    }
    if size == 0 {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The buffer the `extra` form points at.
///
/// # Safety
/// See [`marshal_into`]; the slice lives as long as the caller's buffer.
unsafe fn from_extra<'a>(extra: *const *const c_void) -> Result<&'a [u8], u32> {
    let mut buffer: *const c_void = std::ptr::null();
    let mut size: Option<usize> = None;
    let mut i = 0;
    loop {
        if i >= MAX_EXTRA_ENTRIES {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the array runs to its END key (caller's contract).
        let key = unsafe { extra.add(i).read() } as usize;
        if key == CU_LAUNCH_PARAM_END {
            break;
        }
        // SAFETY: every other key is followed by its value.
        let value = unsafe { extra.add(i + 1).read() };
        match key {
            CU_LAUNCH_PARAM_BUFFER_POINTER => buffer = value,
            CU_LAUNCH_PARAM_BUFFER_SIZE => {
                if value.is_null() {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: the value of BUFFER_SIZE points at a size_t.
                size = Some(unsafe { value.cast::<usize>().read_unaligned() });
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        i += 2;
    }
    match size {
        None | Some(0) => Ok(&[]),
        Some(len) if len > MAX_KERNEL_PARAMS_BYTES || buffer.is_null() => {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        // SAFETY: the buffer holds the size it states (caller's contract).
        Some(len) => Ok(unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), len) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_proto::reply::ParamSlot;
    use std::ptr::null;

    fn info(slots: &[(u32, u32)]) -> FunctionInfo {
        FunctionInfo {
            params: slots
                .iter()
                .map(|&(offset, size)| ParamSlot { offset, size })
                .collect(),
        }
    }

    #[test]
    fn a_reused_buffer_holds_only_the_new_launch() {
        // Two 4-byte parameters with a gap; the buffer held a longer block.
        let f = info(&[(0, 4), (8, 4)]);
        let (a, b) = (7u32, 9u32);
        let args = [
            (&a as *const u32).cast::<c_void>(),
            (&b as *const u32).cast(),
        ];
        let mut buffer = vec![0xffu8; 64];
        // SAFETY: one valid pointer per parameter.
        unsafe { marshal_into(&f, args.as_ptr(), null(), &mut buffer) }.unwrap();
        assert_eq!(buffer, [7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0]);
        // A refused launch leaves nothing a later one could pick up.
        let bad = [std::ptr::null::<c_void>(), std::ptr::null()];
        // SAFETY: NULL parameter pointers are refused before any is read.
        let refused = unsafe { marshal_into(&f, bad.as_ptr(), null(), &mut buffer) };
        assert_eq!(refused, Err(CUDA_ERROR_INVALID_VALUE));
        let none = info(&[]);
        // SAFETY: no parameters, no arrays.
        unsafe { marshal_into(&none, null(), null(), &mut buffer) }.unwrap();
        assert!(buffer.is_empty());
    }

    #[test]
    fn kernel_params_land_at_their_offsets() {
        // rgpu_scale(float *x, float factor, unsigned n)
        let f = info(&[(0, 8), (8, 4), (12, 4)]);
        let x: u64 = 0x7000_0000_1000;
        let factor: f32 = 2.5;
        let n: u32 = 1000;
        let args = [
            (&x as *const u64).cast::<c_void>(),
            (&factor as *const f32).cast(),
            (&n as *const u32).cast(),
        ];
        // SAFETY: one valid pointer per parameter.
        let buffer = unsafe { marshal(&f, args.as_ptr(), null()) }.unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(&x.to_le_bytes());
        want.extend_from_slice(&factor.to_le_bytes());
        want.extend_from_slice(&n.to_le_bytes());
        assert_eq!(buffer, want);
    }

    #[test]
    fn alignment_gaps_stay_zero() {
        let f = info(&[(0, 4), (8, 8)]);
        let a: u32 = 0xdead_beef;
        let b: u64 = 0x0102_0304_0506_0708;
        let args = [
            (&a as *const u32).cast::<c_void>(),
            (&b as *const u64).cast(),
        ];
        // SAFETY: one valid pointer per parameter.
        let buffer = unsafe { marshal(&f, args.as_ptr(), null()) }.unwrap();
        assert_eq!(buffer.len(), 16);
        assert_eq!(&buffer[..4], &a.to_le_bytes());
        assert_eq!(&buffer[4..8], &[0; 4]);
        assert_eq!(&buffer[8..], &b.to_le_bytes());
    }

    #[test]
    fn null_parameter_pointer_is_invalid() {
        let f = info(&[(0, 4)]);
        let args = [null::<c_void>()];
        // SAFETY: the one pointer is NULL, which is checked.
        let result = unsafe { marshal(&f, args.as_ptr(), null()) };
        assert_eq!(result, Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn extra_form_copies_the_buffer() {
        let f = info(&[(0, 8)]);
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let size: usize = data.len();
        let extra = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *const c_void,
            data.as_ptr().cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE as *const c_void,
            (&size as *const usize).cast(),
            CU_LAUNCH_PARAM_END as *const c_void,
        ];
        // SAFETY: a well-formed extra array.
        let buffer = unsafe { marshal(&f, null(), extra.as_ptr()) }.unwrap();
        assert_eq!(buffer, data);
    }

    #[test]
    fn extra_with_unknown_key_is_invalid() {
        let f = info(&[]);
        let extra = [7usize as *const c_void, null(), null()];
        // SAFETY: the unknown key is followed by a value.
        let result = unsafe { marshal(&f, null(), extra.as_ptr()) };
        assert_eq!(result, Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn no_parameters_need_no_arrays() {
        // SAFETY: nothing is read.
        let result = unsafe { marshal(&info(&[]), null(), null()) };
        assert_eq!(result, Ok(Vec::new()));
        // SAFETY: nothing is read.
        let result = unsafe { marshal(&info(&[(0, 4)]), null(), null()) };
        assert_eq!(result, Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn oversized_layout_is_invalid() {
        let f = info(&[(0, MAX_KERNEL_PARAMS_BYTES as u32 + 1)]);
        let big = vec![0u8; MAX_KERNEL_PARAMS_BYTES + 1];
        let args = [big.as_ptr().cast::<c_void>()];
        // SAFETY: the size check comes first.
        let result = unsafe { marshal(&f, args.as_ptr(), null()) };
        assert_eq!(result, Err(CUDA_ERROR_INVALID_VALUE));
    }
}

//! Tensor maps (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapReplaceAddress`): the descriptors Hopper's tensor memory
//! accelerator reads, passed to kernels by value. Their layout is the
//! driver's own, so the host's driver encodes them; the guest copies the
//! 128 bytes into the application's `CUtensorMap`.

use std::ffi::{c_int, c_void};

use rgpu_proto::command::{TensorMapKind, TensorMapSpec, MAX_TENSOR_RANK, TENSOR_MAP_BYTES};
use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{bytes, bytes_mut};
use crate::state::current;

/// The `count` values at `ptr` (an application array), into `out`.
fn read_array<T: Copy + Default, const N: usize>(
    ptr: *const T,
    count: usize,
) -> Result<[T; N], u32> {
    let mut out = [T::default(); N];
    if count == 0 {
        return Ok(out);
    }
    if ptr.is_null() || count > N {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it `count` readable values
    // (the rank says how many) for the duration of the call.
    let values = unsafe { std::slice::from_raw_parts(ptr, count) };
    out[..count].copy_from_slice(values);
    Ok(out)
}

/// Refusals the driver documents, answered without asking the host: a
/// global address not 16-byte aligned, a box edge outside 1 to 256.
fn check_documented(spec: &TensorMapSpec) -> Result<(), u32> {
    let mut boxes = spec.box_dim.iter().take(spec.rank as usize);
    let boxes_ok = spec.kind == TensorMapKind::Im2col || boxes.all(|b| (1..=256).contains(b));
    if !spec.global_address.is_multiple_of(16) || !boxes_ok {
        log::debug!("rgpu: tensor map refused as the driver documents: {spec:?}");
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Sends `command` and writes the descriptor it answers to `tensor_map`.
fn encode_into(tensor_map: *mut c_void, command: &Command) -> Result<(), u32> {
    let out = bytes_mut(tensor_map, TENSOR_MAP_BYTES)?;
    let payload = current()?.call(command)?;
    let map = payload.get(..TENSOR_MAP_BYTES).ok_or(CUDA_ERROR_UNKNOWN)?;
    out.copy_from_slice(map);
    Ok(())
}

/// The rank as an array length, or `CUDA_ERROR_INVALID_VALUE` outside
/// `min..=MAX_TENSOR_RANK`.
fn rank_of(rank: u32, min: usize) -> Result<usize, u32> {
    let rank = rank as usize;
    if (min..=MAX_TENSOR_RANK).contains(&rank) {
        Ok(rank)
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

#[allow(clippy::too_many_arguments)] // cuTensorMapEncodeTiled's own
pub(crate) fn encode_tiled(
    tensor_map: *mut c_void,
    data_type: c_int,
    rank: u32,
    global_address: *mut c_void,
    global_dim: *const u64,
    global_strides: *const u64,
    box_dim: *const u32,
    element_strides: *const u32,
    interleave: c_int,
    swizzle: c_int,
    l2_promotion: c_int,
    oob_fill: c_int,
) -> Result<(), u32> {
    let n = rank_of(rank, 1)?;
    let spec = TensorMapSpec {
        kind: TensorMapKind::Tiled,
        data_type: data_type as u32,
        rank,
        interleave: interleave as u32,
        swizzle: swizzle as u32,
        l2_promotion: l2_promotion as u32,
        oob_fill: oob_fill as u32,
        global_address: global_address as u64,
        global_dim: read_array(global_dim, n)?,
        global_strides: read_array(global_strides, n - 1)?,
        box_dim: read_array(box_dim, n)?,
        element_strides: read_array(element_strides, n)?,
        ..Default::default()
    };
    check_documented(&spec)?;
    encode_into(
        tensor_map,
        &Command::TensorMapEncode {
            spec: Box::new(spec),
        },
    )
}

#[allow(clippy::too_many_arguments)] // cuTensorMapEncodeIm2col's own
pub(crate) fn encode_im2col(
    tensor_map: *mut c_void,
    data_type: c_int,
    rank: u32,
    global_address: *mut c_void,
    global_dim: *const u64,
    global_strides: *const u64,
    lower_corner: *const c_int,
    upper_corner: *const c_int,
    channels_per_pixel: u32,
    pixels_per_column: u32,
    element_strides: *const u32,
    interleave: c_int,
    swizzle: c_int,
    l2_promotion: c_int,
    oob_fill: c_int,
) -> Result<(), u32> {
    let n = rank_of(rank, 3)?;
    let spec = TensorMapSpec {
        kind: TensorMapKind::Im2col,
        data_type: data_type as u32,
        rank,
        interleave: interleave as u32,
        swizzle: swizzle as u32,
        l2_promotion: l2_promotion as u32,
        oob_fill: oob_fill as u32,
        channels_per_pixel,
        pixels_per_column,
        global_address: global_address as u64,
        global_dim: read_array(global_dim, n)?,
        global_strides: read_array(global_strides, n - 1)?,
        element_strides: read_array(element_strides, n)?,
        lower_corner: read_array(lower_corner, n - 2)?,
        upper_corner: read_array(upper_corner, n - 2)?,
        ..Default::default()
    };
    check_documented(&spec)?;
    encode_into(
        tensor_map,
        &Command::TensorMapEncode {
            spec: Box::new(spec),
        },
    )
}

pub(crate) fn replace_address(
    tensor_map: *mut c_void,
    global_address: *mut c_void,
) -> Result<(), u32> {
    let mut map = [0u8; TENSOR_MAP_BYTES];
    map.copy_from_slice(bytes(tensor_map, TENSOR_MAP_BYTES)?);
    encode_into(
        tensor_map,
        &Command::TensorMapReplaceAddress {
            map: Box::new(map),
            address: global_address as u64,
        },
    )
}

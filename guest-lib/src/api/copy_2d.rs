//! Pitched allocations and 2D copies (`cuMemAllocPitch`, `cuMemcpy2D`),
//! done as row copies over the ordinary copy paths: one copy when both
//! sides are contiguous, else one per row. Each device side is checked once,
//! from the first byte the copy touches to the last.

use std::ffi::{c_uint, c_void};

use rgpu_proto::cuda_result::*;

use crate::abi::{write_out, CUdeviceptr, CUstream};
use crate::api::memory::{alloc, dtod_unchecked, dtoh_unchecked, htod_unchecked};
use crate::device_ranges;
use crate::state::{current, resolve_stream, sync_stream, Context};

/// Rows of a pitched allocation start at multiples of this (the texture
/// alignment of current NVIDIA GPUs; cudaMallocPitch's pitch).
const PITCH_ALIGNMENT: usize = 512;

const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
pub struct Memcpy2D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

pub(crate) fn alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> Result<(), u32> {
    if pitch.is_null() || width_in_bytes == 0 || height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !matches!(element_size_bytes, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let row = width_in_bytes
        .checked_next_multiple_of(PITCH_ALIGNMENT)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let size = row.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    alloc(dptr, size)?;
    write_out(pitch, row)
}

/// One side of a 2D copy: where row `r` starts.
#[derive(Clone, Copy)]
enum Side {
    Host(usize),
    Device(CUdeviceptr),
}

fn side(
    memory_type: u32,
    host: usize,
    device: CUdeviceptr,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<(Side, usize), u32> {
    let offset = y
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match memory_type {
        MEMORYTYPE_HOST if host != 0 => Ok((Side::Host(host + offset), pitch)),
        MEMORYTYPE_DEVICE if device != 0 => device
            .checked_add(offset as u64)
            .map(|first| (Side::Device(first), pitch))
            .ok_or(CUDA_ERROR_INVALID_VALUE),
        // Arrays and unified addressing are not offered yet.
        MEMORYTYPE_HOST | MEMORYTYPE_DEVICE => Err(CUDA_ERROR_INVALID_VALUE),
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

/// The device bytes a copy of `height` rows of `width` bytes, `pitch` apart,
/// touches from `first`: `(first, len)`, first byte to last (the last row
/// ends `width` bytes after it starts, not `pitch`).
fn device_span(first: u64, pitch: usize, width: usize, height: usize) -> Result<(u64, u64), u32> {
    let len = height
        .saturating_sub(1)
        .checked_mul(pitch)
        .and_then(|rows| rows.checked_add(width))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok((first, len as u64))
}

fn copy_rows(ctx: &Context, stream: u32, p: &Memcpy2D, sync: bool) -> Result<(), u32> {
    let width = p.width_in_bytes;
    if width == 0 || p.height == 0 {
        return Ok(());
    }
    let (src, src_pitch) = side(
        p.src_memory_type,
        p.src_host as usize,
        p.src_device,
        p.src_x_in_bytes,
        p.src_y,
        p.src_pitch,
    )?;
    let (dst, dst_pitch) = side(
        p.dst_memory_type,
        p.dst_host as usize,
        p.dst_device,
        p.dst_x_in_bytes,
        p.dst_y,
        p.dst_pitch,
    )?;
    if p.height > 1 && (src_pitch < width || dst_pitch < width) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Rows are sent unchecked below: both device spans are checked here, in
    // one lookup each.
    let span = |side: Side, pitch: usize| match side {
        Side::Device(first) => device_span(first, pitch, width, p.height).map(Some),
        Side::Host(_) => Ok(None),
    };
    let (src_span, dst_span) = (span(src, src_pitch)?, span(dst, dst_pitch)?);
    for (first, len) in src_span.into_iter().chain(dst_span) {
        crate::pinned::refuse_as_device("cuMemcpy2D", first, len)?;
    }
    if src_span.is_none() && dst_span.is_none() {
        // Made here, now: a capture would not record it.
        crate::api::memory::refuse_captured_over_network(ctx, stream, "cuMemcpy2DAsync")?;
    }
    match (src_span, dst_span) {
        (Some(s), Some(d)) => device_ranges::check(ctx.space, &[s, d])?,
        (Some(one), None) | (None, Some(one)) => device_ranges::check(ctx.space, &[one])?,
        (None, None) => {}
    }
    // Both sides contiguous: one copy of the whole block.
    let (rows, row_len) = if src_pitch == width && dst_pitch == width {
        (
            1,
            width
                .checked_mul(p.height)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?,
        )
    } else {
        (p.height, width)
    };
    for r in 0..rows {
        let last = r + 1 == rows;
        let at = |side: Side, pitch: usize| -> Side {
            match side {
                Side::Host(a) => Side::Host(a + r * pitch),
                Side::Device(a) => Side::Device(a + (r * pitch) as u64),
            }
        };
        // Only the last row waits, when the copy is synchronous: the rows
        // run in order on one stream.
        let wait = sync && last;
        match (at(src, src_pitch), at(dst, dst_pitch)) {
            (Side::Host(s), Side::Device(d)) => {
                htod_unchecked(ctx, stream, d, s as *const c_void, row_len, wait)?
            }
            (Side::Device(s), Side::Host(d)) => {
                dtoh_unchecked(ctx, stream, d as *mut c_void, s, row_len, true)?
            }
            (Side::Device(s), Side::Device(d)) => dtod_unchecked(ctx, stream, d, s, row_len, wait)?,
            (Side::Host(s), Side::Host(d)) => {
                // SAFETY: the caller's host buffers of `row_len` bytes each
                // (the API contract); they may not overlap.
                unsafe { std::ptr::copy(s as *const u8, d as *mut u8, row_len) }
            }
        }
    }
    Ok(())
}

fn params<'a>(p: *const Memcpy2D) -> Result<&'a Memcpy2D, u32> {
    // SAFETY: a non-NULL CUDA_MEMCPY2D from the caller (the API contract).
    unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)
}

pub(crate) fn memcpy_2d(p: *const Memcpy2D) -> Result<(), u32> {
    copy_rows(current()?.as_ref(), sync_stream(false), params(p)?, true)
}

pub(crate) fn memcpy_2d_ptds(p: *const Memcpy2D) -> Result<(), u32> {
    copy_rows(current()?.as_ref(), sync_stream(true), params(p)?, true)
}

pub(crate) fn memcpy_2d_async(p: *const Memcpy2D, stream: CUstream) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, false)?;
    copy_rows(&ctx, stream, params(p)?, false)
}

pub(crate) fn memcpy_2d_async_ptsz(p: *const Memcpy2D, stream: CUstream) -> Result<(), u32> {
    let (ctx, stream) = resolve_stream(stream, true)?;
    copy_rows(&ctx, stream, params(p)?, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy2d_has_cudas_layout() {
        assert_eq!(std::mem::size_of::<Memcpy2D>(), 128);
        assert_eq!(std::mem::offset_of!(Memcpy2D, src_host), 24);
        assert_eq!(std::mem::offset_of!(Memcpy2D, dst_memory_type), 72);
        assert_eq!(std::mem::offset_of!(Memcpy2D, width_in_bytes), 112);
    }

    #[test]
    fn device_spans_run_from_the_first_byte_to_the_last() {
        // 3 rows of 100 bytes, 512 apart: the last row ends 100 bytes in.
        assert_eq!(device_span(0x1000, 512, 100, 3), Ok((0x1000, 1124)));
        // One row: the pitch does not matter.
        assert_eq!(device_span(0x1000, 0, 100, 1), Ok((0x1000, 100)));
        assert_eq!(
            device_span(0x1000, usize::MAX, 1, 3),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            side(MEMORYTYPE_DEVICE, 0, u64::MAX, 1, 0, 0).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn sides_locate_rows_and_refuse_arrays() {
        let (s, pitch) = side(MEMORYTYPE_DEVICE, 0, 0x1000, 8, 2, 512).unwrap();
        assert!(matches!(s, Side::Device(0x1408)));
        assert_eq!(pitch, 512);
        assert_eq!(side(3, 0, 0, 0, 0, 0).err(), Some(CUDA_ERROR_NOT_SUPPORTED));
        assert_eq!(
            side(MEMORYTYPE_HOST, 0, 0, 0, 0, 0).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
    }
}

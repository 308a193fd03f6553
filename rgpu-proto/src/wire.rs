//! Little-endian cursors over byte slices that never panic.

use thiserror::Error;

/// Why a byte string is not a valid piece of the command stream.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("truncated: needed {needed} bytes at offset {offset}, {available} available")]
    Truncated {
        offset: usize,
        needed: usize,
        available: usize,
    },
    #[error("bad magic {0:#x}")]
    BadMagic(u32),
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u32),
    #[error("unknown opcode {0:#x}")]
    UnknownOpcode(u16),
    #[error("length {length} out of range (limit {limit})")]
    LengthOutOfRange { length: u64, limit: u64 },
    #[error("field {field} has invalid value {value}")]
    InvalidField { field: &'static str, value: u64 },
    #[error("{0} trailing bytes after the command body")]
    TrailingBytes(usize),
}

/// Reads little-endian values from a byte slice, front to back.
#[derive(Debug, Clone)]
pub struct WireReader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> WireReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, offset: 0 }
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.offset)
    }

    pub fn take(&mut self, needed: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .offset
            .checked_add(needed)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(DecodeError::Truncated {
                offset: self.offset,
                needed,
                available: self.remaining(),
            })?;
        let slice = self
            .bytes
            .get(self.offset..end)
            .ok_or(DecodeError::Truncated {
                offset: self.offset,
                needed,
                available: self.remaining(),
            })?;
        self.offset = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn f32(&mut self) -> Result<f32, DecodeError> {
        Ok(f32::from_le_bytes(self.array()?))
    }

    /// A `u32` length followed by that many bytes, bounded by `limit`.
    pub fn bytes_with_len(&mut self, limit: usize) -> Result<&'a [u8], DecodeError> {
        let length = self.u32()? as usize;
        if length > limit {
            return Err(DecodeError::LengthOutOfRange {
                length: length as u64,
                limit: limit as u64,
            });
        }
        self.take(length)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes(extra)),
        }
    }
}

/// Appends little-endian values to a byte vector, or writes them into a
/// slice sized in advance ([`WireWriter::into_slice`]: a header on the
/// stack).
#[derive(Debug)]
pub struct WireWriter<'a> {
    sink: Sink<'a>,
}

#[derive(Debug)]
enum Sink<'a> {
    Owned(Vec<u8>),
    /// `len` bytes of `out` written; `overflowed` once a write did not fit
    /// (it and every later one is dropped).
    Slice {
        out: &'a mut [u8],
        len: usize,
        overflowed: bool,
    },
}

impl Default for WireWriter<'static> {
    fn default() -> Self {
        Self::new()
    }
}

impl WireWriter<'static> {
    pub fn new() -> Self {
        Self {
            sink: Sink::Owned(Vec::new()),
        }
    }
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            sink: Sink::Owned(Vec::with_capacity(capacity)),
        }
    }
}

impl<'a> WireWriter<'a> {
    /// Writes into `out` from its start; what does not fit is dropped
    /// (with every later write), and [`Self::len`] stops there.
    pub fn into_slice(out: &'a mut [u8]) -> Self {
        Self {
            sink: Sink::Slice {
                out,
                len: 0,
                overflowed: false,
            },
        }
    }
    pub fn len(&self) -> usize {
        match &self.sink {
            Sink::Owned(bytes) => bytes.len(),
            Sink::Slice { len, .. } => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes written (a copy of them for a slice writer).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.sink {
            Sink::Owned(bytes) => bytes,
            Sink::Slice { out, len, .. } => out.get(..len).unwrap_or_default().to_vec(),
        }
    }
    /// Empties the writer, keeping its buffer for the next encoding.
    pub fn clear(&mut self) {
        match &mut self.sink {
            Sink::Owned(bytes) => bytes.clear(),
            Sink::Slice {
                len, overflowed, ..
            } => {
                *len = 0;
                *overflowed = false;
            }
        }
    }
    pub fn as_bytes(&self) -> &[u8] {
        match &self.sink {
            Sink::Owned(bytes) => bytes,
            Sink::Slice { out, len, .. } => out.get(..*len).unwrap_or_default(),
        }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.raw(&[v])
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        match &mut self.sink {
            Sink::Owned(bytes) => bytes.extend_from_slice(v),
            Sink::Slice {
                out,
                len,
                overflowed,
            } => match out.get_mut(*len..).and_then(|rest| rest.get_mut(..v.len())) {
                Some(dst) if !*overflowed => {
                    dst.copy_from_slice(v);
                    *len += v.len();
                }
                _ => *overflowed = true,
            },
        }
        self
    }
    /// A `u32` length followed by the bytes.
    pub fn bytes_with_len(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.raw(v)
    }
    /// Overwrites a `u32` at `offset` (for lengths known only at the end).
    pub fn patch_u32(&mut self, offset: usize, v: u32) {
        let written = match &mut self.sink {
            Sink::Owned(bytes) => bytes.as_mut_slice(),
            Sink::Slice { out, len, .. } => out.get_mut(..*len).unwrap_or_default(),
        };
        if let Some(slot) = written.get_mut(offset..offset + 4) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
    }
    /// Pads with zero bytes up to a multiple of `align`.
    pub fn pad_to(&mut self, align: usize) -> &mut Self {
        const ZEROS: [u8; 64] = [0; 64];
        let pad = self.len().next_multiple_of(align) - self.len();
        match ZEROS.get(..pad) {
            Some(zeros) => self.raw(zeros),
            None => self.raw(&vec![0; pad]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_writer_writes_what_a_vector_one_does_and_drops_the_overflow() {
        let mut owned = WireWriter::new();
        owned.u16(0x0102).u32(7).u64(u64::MAX).pad_to(8);
        let mut out = [0xa5u8; 24];
        let mut slice = WireWriter::into_slice(&mut out[..16]);
        slice.u16(0x0102).u32(7).u64(u64::MAX).pad_to(8);
        assert_eq!(slice.as_bytes(), owned.as_bytes());
        assert_eq!(slice.len(), 16);
        // Past the end: nothing written, and nothing after it either.
        slice.u64(1).u8(2);
        assert_eq!(slice.len(), 16);
        assert_eq!(out[16..], [0xa5; 8]);
    }
}

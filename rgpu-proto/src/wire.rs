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

/// Appends little-endian values to a byte vector.
#[derive(Debug, Default, Clone)]
pub struct WireWriter {
    bytes: Vec<u8>,
}

impl WireWriter {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(capacity),
        }
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
    /// Empties the writer, keeping its buffer for the next encoding.
    pub fn clear(&mut self) {
        self.bytes.clear();
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(v);
        self
    }
    /// A `u32` length followed by the bytes.
    pub fn bytes_with_len(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.raw(v)
    }
    /// Overwrites a `u32` at `offset` (for lengths known only at the end).
    pub fn patch_u32(&mut self, offset: usize, v: u32) {
        if let Some(slot) = self.bytes.get_mut(offset..offset + 4) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
    }
    /// Pads with zero bytes up to a multiple of `align`.
    pub fn pad_to(&mut self, align: usize) -> &mut Self {
        while !self.bytes.len().is_multiple_of(align) {
            self.bytes.push(0);
        }
        self
    }
}

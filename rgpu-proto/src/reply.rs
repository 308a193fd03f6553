//! Reply payloads, per command. A reply is `(seq, result, payload)`; the
//! payload is empty unless listed here:
//!
//! | command | payload |
//! | --- | --- |
//! | `MemAlloc` | device pointer `u64` |
//! | `MemGetInfo` | free `u64`, total `u64` |
//! | `CtxGetLimit` | value `u64` |
//! | `ModuleGetFunction` | [`FunctionInfo`] |
//! | `ModuleGetGlobal` | device pointer `u64`, size `u64` |
//! | `FuncGetAttribute` | value `i32` |
//! | `EventElapsedTime` | milliseconds `f32` |
//!
//! `MemcpyDtoH` with a reply number answers once the data is in the blob.

use crate::wire::{DecodeError, WireReader, WireWriter};
use crate::MAX_KERNEL_PARAMS;

/// One kernel parameter: where it sits in the parameter buffer and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSlot {
    pub offset: u32,
    pub size: u32,
}

/// What the guest needs to marshal a launch of a function.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionInfo {
    pub params: Vec<ParamSlot>,
}

impl FunctionInfo {
    pub fn encode(&self, w: &mut WireWriter) {
        w.u32(self.params.len() as u32);
        for p in &self.params {
            w.u32(p.offset).u32(p.size);
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(bytes);
        let count = r.u32()? as usize;
        if count > MAX_KERNEL_PARAMS {
            return Err(DecodeError::LengthOutOfRange {
                length: count as u64,
                limit: MAX_KERNEL_PARAMS as u64,
            });
        }
        let mut params = Vec::with_capacity(count.min(r.remaining() / 8));
        for _ in 0..count {
            params.push(ParamSlot {
                offset: r.u32()?,
                size: r.u32()?,
            });
        }
        r.finish()?;
        Ok(Self { params })
    }

    /// Size of the parameter buffer: the end of the last parameter.
    pub fn buffer_size(&self) -> usize {
        self.params
            .iter()
            .map(|p| p.offset as usize + p.size as usize)
            .max()
            .unwrap_or(0)
    }
}

/// Encodes a `u64` payload.
pub fn u64_payload(values: &[u64]) -> Vec<u8> {
    let mut w = WireWriter::with_capacity(values.len() * 8);
    for v in values {
        w.u64(*v);
    }
    w.into_bytes()
}

/// Decodes a payload of exactly `N` `u64`s.
pub fn decode_u64s<const N: usize>(bytes: &[u8]) -> Result<[u64; N], DecodeError> {
    let mut r = WireReader::new(bytes);
    let mut out = [0u64; N];
    for v in out.iter_mut() {
        *v = r.u64()?;
    }
    r.finish()?;
    Ok(out)
}

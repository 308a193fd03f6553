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
//! | `OccupancyMaxActiveBlocks` | blocks per multiprocessor `i32` |
//! | `OccupancyAvailableDynamicSmem` | bytes `u64` |
//! | `OccupancyMaxActiveClusters` | clusters `i32` |
//! | `EventElapsedTime` | milliseconds `f32` |
//! | `DeviceStatus` | [`DeviceStatus`] |
//! | `IpcGetMemHandle`, `IpcGetEventHandle` | the driver's handle, 64 bytes |
//! | `IpcOpenMemHandle` | device pointer `u64`, size `u64` |
//! | `GraphAddMemAllocNode` | device pointer `u64` |
//! | `GraphExecUpdate` | result `u64`, update result `u64`, failing node `u64` |
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

/// Largest driver version string in a [`DeviceStatus`] (NVML's buffer,
/// NUL included, is 80 bytes).
pub const MAX_DRIVER_VERSION_BYTES: usize = 79;
/// Most sessions listed in a [`DeviceStatus`]: the largest payload then
/// still fits the smallest reply area (`channel::MIN_REPLY_SIZE`).
pub const MAX_STATUS_SESSIONS: usize = 128;
/// A utilisation the host could not measure.
pub const UTILIZATION_UNKNOWN: u32 = u32::MAX;

/// A process (or a session) of the asking tenant that holds device
/// memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionUsage {
    /// The session's virtio-gpu context id; 0 for a whole process.
    pub ctx_id: u32,
    /// The guest process id, as the guest library named it in its
    /// context's debug name ([`crate::process_group`]); 0: unknown.
    pub pid: u32,
    /// Device memory held, in bytes: a process's includes what the driver
    /// holds for it (its contexts, module globals).
    pub device_memory: u64,
}

/// Live state of a device, for NVML.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceStatus {
    /// Free and total device memory in bytes (all tenants together).
    pub free: u64,
    pub total: u64,
    /// Percent of the last sample period, or [`UTILIZATION_UNKNOWN`].
    pub gpu_utilization: u32,
    pub memory_utilization: u32,
    /// The host's NVIDIA driver version ("580.95.05").
    pub driver_version: String,
    /// The asking tenant's processes that hold device memory (or, where
    /// the host keeps no list per tenant, the asking process's sessions).
    pub sessions: Vec<SessionUsage>,
}

impl DeviceStatus {
    pub fn encode(&self, w: &mut WireWriter) {
        let version = self.driver_version.as_bytes();
        let version = version.get(..MAX_DRIVER_VERSION_BYTES).unwrap_or(version);
        w.u64(self.free)
            .u64(self.total)
            .u32(self.gpu_utilization)
            .u32(self.memory_utilization)
            .bytes_with_len(version);
        let sessions = self
            .sessions
            .get(..MAX_STATUS_SESSIONS)
            .unwrap_or(&self.sessions);
        w.u32(sessions.len() as u32);
        for s in sessions {
            w.u32(s.ctx_id).u32(s.pid).u64(s.device_memory);
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = WireWriter::new();
        self.encode(&mut w);
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(bytes);
        let free = r.u64()?;
        let total = r.u64()?;
        let gpu_utilization = r.u32()?;
        let memory_utilization = r.u32()?;
        let version = r.bytes_with_len(MAX_DRIVER_VERSION_BYTES)?;
        if version.contains(&0) {
            return Err(DecodeError::InvalidField {
                field: "device_status.driver_version",
                value: 0,
            });
        }
        let count = r.u32()? as usize;
        if count > MAX_STATUS_SESSIONS {
            return Err(DecodeError::LengthOutOfRange {
                length: count as u64,
                limit: MAX_STATUS_SESSIONS as u64,
            });
        }
        let mut sessions = Vec::with_capacity(count.min(r.remaining() / 16));
        for _ in 0..count {
            let ctx_id = r.u32()?;
            let pid = r.u32()?;
            sessions.push(SessionUsage {
                ctx_id,
                pid,
                device_memory: r.u64()?,
            });
        }
        r.finish()?;
        Ok(Self {
            free,
            total,
            gpu_utilization,
            memory_utilization,
            driver_version: String::from_utf8_lossy(version).into_owned(),
            sessions,
        })
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

/// Decodes a payload of whole `u64`s, at most `max` of them.
pub fn decode_u64_list(bytes: &[u8], max: usize) -> Result<Vec<u64>, DecodeError> {
    let count = bytes.len() / 8;
    if count > max {
        return Err(DecodeError::LengthOutOfRange {
            length: count as u64,
            limit: max as u64,
        });
    }
    let mut r = WireReader::new(bytes);
    let values = (0..count).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok(values)
}

/// Encodes an attribute's 64-byte value union (`CUlaunchAttributeValue`,
/// the answer of the attribute queries).
pub fn value_union_payload(union: &[u32; 16]) -> Vec<u8> {
    let mut w = WireWriter::with_capacity(64);
    for word in union {
        w.u32(*word);
    }
    w.into_bytes()
}

/// Decodes [`value_union_payload`].
pub fn decode_value_union(bytes: &[u8]) -> Result<[u32; 16], DecodeError> {
    let mut r = WireReader::new(bytes);
    let mut out = [0u32; 16];
    for word in out.iter_mut() {
        *word = r.u32()?;
    }
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_unions_round_trip_and_launch_attributes_take_their_head() {
        let union: [u32; 16] = std::array::from_fn(|i| 0x1000 + i as u32);
        assert_eq!(decode_value_union(&value_union_payload(&union)), Ok(union));
        assert!(decode_value_union(&[0; 60]).is_err());
        let attr = crate::command::LaunchAttr::from_union(8, &union);
        assert_eq!(attr.value[0], 0x1001 << 32 | 0x1000);
        assert_eq!(attr.value[3], 0x1007 << 32 | 0x1006);
    }

    #[test]
    fn device_status_round_trip_and_limits() {
        let status = DeviceStatus {
            free: 100 << 30,
            total: 141 << 30,
            gpu_utilization: 42,
            memory_utilization: UTILIZATION_UNKNOWN,
            driver_version: "580.159.03".into(),
            sessions: vec![SessionUsage {
                ctx_id: 3,
                pid: 4242,
                device_memory: 1 << 20,
            }],
        };
        let bytes = status.to_bytes();
        assert_eq!(DeviceStatus::decode(&bytes), Ok(status.clone()));
        assert!(DeviceStatus::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            DeviceStatus::decode(&longer),
            Err(DecodeError::TrailingBytes(1))
        );
        // A count beyond the limit is refused before anything is allocated.
        let mut w = WireWriter::new();
        w.u64(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .bytes_with_len(b"1")
            .u32(u32::MAX);
        assert!(matches!(
            DeviceStatus::decode(w.as_bytes()),
            Err(DecodeError::LengthOutOfRange { .. })
        ));
        // An over-long version is cut when encoding.
        let long = DeviceStatus {
            driver_version: "9".repeat(200),
            ..status
        };
        let decoded = DeviceStatus::decode(&long.to_bytes()).unwrap();
        assert_eq!(decoded.driver_version.len(), MAX_DRIVER_VERSION_BYTES);
    }

    #[test]
    fn the_largest_device_status_fits_the_smallest_reply_area() {
        let status = DeviceStatus {
            driver_version: "9".repeat(MAX_DRIVER_VERSION_BYTES),
            sessions: vec![
                SessionUsage {
                    ctx_id: 1,
                    pid: 0,
                    device_memory: 1
                };
                MAX_STATUS_SESSIONS + 5
            ],
            ..DeviceStatus::default()
        };
        let room = crate::channel::MIN_REPLY_SIZE - crate::channel::REPLY_OFFSET_PAYLOAD;
        assert!(status.to_bytes().len() as u64 <= room);
        let decoded = DeviceStatus::decode(&status.to_bytes()).unwrap();
        assert_eq!(decoded.sessions.len(), MAX_STATUS_SESSIONS);
    }

    #[test]
    fn device_status_command_round_trip() {
        let command = crate::Command::DeviceStatus { device: 2 };
        let decoded = crate::command::decode_one(&command.to_bytes(9)).unwrap();
        assert_eq!(decoded.command, command);
        assert_eq!(decoded.reply_seq, 9);
        assert_eq!(
            crate::Opcode::from_u16(0x0600),
            Some(crate::Opcode::DeviceStatus)
        );
    }
}

//! The rgpu capset payload (`GET_CAPSET`): the protocol version and the
//! host's GPUs, so the guest answers device queries without a round trip.

use crate::wire::{DecodeError, WireReader, WireWriter};

/// "RGCS" little-endian.
pub const CAPSET_MAGIC: u32 = 0x5343_4752;
/// Device attribute slots carried per device (CUDA 13.0 defines up to 147).
pub const ATTRIBUTE_SLOTS: usize = 192;
/// Attribute value meaning "the host driver does not know this attribute".
pub const ATTRIBUTE_UNSUPPORTED: i32 = i32::MIN;

/// The `CUdevice_attribute` numbers (cuda.h) that rgpu's crates read or set
/// by name: one list, so no crate keeps its own copy of a number.
pub mod device_attribute {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    /// X, Y and Z.
    pub const MAX_BLOCK_DIM: [i32; 3] = [2, 3, 4];
    /// X, Y and Z.
    pub const MAX_GRID_DIM: [i32; 3] = [5, 6, 7];
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
}
pub const NAME_BYTES: usize = 256;
pub const MAX_DEVICES: usize = 64;
const HEADER_SIZE: usize = 32;
const DEVICE_SIZE: usize = NAME_BYTES + 16 + 8 + 4 + 4 + ATTRIBUTE_SLOTS * 4;

/// One host GPU as the guest sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub uuid: [u8; 16],
    pub total_mem: u64,
    /// The host's ordinal of this GPU (informational).
    pub host_ordinal: u32,
    /// `attributes[n]` is `cuDeviceGetAttribute(n)`, or
    /// [`ATTRIBUTE_UNSUPPORTED`].
    pub attributes: Vec<i32>,
}

impl DeviceInfo {
    pub fn attribute(&self, attribute: i32) -> Option<i32> {
        let index = usize::try_from(attribute).ok()?;
        self.attributes
            .get(index)
            .copied()
            .filter(|v| *v != ATTRIBUTE_UNSUPPORTED)
    }

    /// Sets attribute `attribute` to `value`; one outside the carried
    /// slots is left alone (no such attribute exists to answer).
    pub fn set_attribute(&mut self, attribute: i32, value: i32) {
        let slot = usize::try_from(attribute)
            .ok()
            .and_then(|index| self.attributes.get_mut(index));
        if let Some(slot) = slot {
            *slot = value;
        }
    }

    /// The UUID as NVML and nvidia-smi print it:
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lower-case hex).
    pub fn uuid_string(&self) -> String {
        let hex: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        let part = |range: std::ops::Range<usize>| hex.get(range).unwrap_or_default();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            part(0..8),
            part(8..12),
            part(12..16),
            part(16..20),
            part(20..32)
        )
    }
}

/// The whole capset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capset {
    pub protocol_version: u32,
    /// The host driver's `cuDriverGetVersion`.
    pub driver_version: i32,
    /// "sim" or "cuda": which executor answers.
    pub executor: String,
    pub devices: Vec<DeviceInfo>,
}

impl Capset {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = WireWriter::with_capacity(HEADER_SIZE + DEVICE_SIZE * self.devices.len());
        let mut executor = [0u8; 8];
        for (dst, src) in executor.iter_mut().zip(self.executor.bytes()) {
            *dst = src;
        }
        w.u32(CAPSET_MAGIC)
            .u32(self.protocol_version)
            .i32(self.driver_version)
            .u32(self.devices.len().min(MAX_DEVICES) as u32)
            .u32(DEVICE_SIZE as u32)
            .u32(0)
            .raw(&executor);
        for d in self.devices.iter().take(MAX_DEVICES) {
            let mut name = [0u8; NAME_BYTES];
            for (dst, src) in name.iter_mut().take(NAME_BYTES - 1).zip(d.name.bytes()) {
                *dst = src;
            }
            w.raw(&name)
                .raw(&d.uuid)
                .u64(d.total_mem)
                .u32(d.host_ordinal)
                .u32(0);
            for i in 0..ATTRIBUTE_SLOTS {
                w.i32(
                    d.attributes
                        .get(i)
                        .copied()
                        .unwrap_or(ATTRIBUTE_UNSUPPORTED),
                );
            }
        }
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(bytes);
        let magic = r.u32()?;
        if magic != CAPSET_MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let protocol_version = r.u32()?;
        let driver_version = r.i32()?;
        let count = r.u32()? as usize;
        let device_size = r.u32()? as usize;
        let _reserved = r.u32()?;
        let executor_bytes = r.take(8)?;
        if count > MAX_DEVICES {
            return Err(DecodeError::LengthOutOfRange {
                length: count as u64,
                limit: MAX_DEVICES as u64,
            });
        }
        if device_size != DEVICE_SIZE {
            return Err(DecodeError::InvalidField {
                field: "capset.device_size",
                value: device_size as u64,
            });
        }
        let executor = c_string(executor_bytes);
        let mut devices = Vec::with_capacity(count);
        for _ in 0..count {
            let name = c_string(r.take(NAME_BYTES)?);
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(r.take(16)?);
            let total_mem = r.u64()?;
            let host_ordinal = r.u32()?;
            let _reserved = r.u32()?;
            let mut attributes = Vec::with_capacity(ATTRIBUTE_SLOTS);
            for _ in 0..ATTRIBUTE_SLOTS {
                attributes.push(r.i32()?);
            }
            devices.push(DeviceInfo {
                name,
                uuid,
                total_mem,
                host_ordinal,
                attributes,
            });
        }
        Ok(Self {
            protocol_version,
            driver_version,
            executor,
            devices,
        })
    }
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(bytes.get(..end).unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capset_round_trip() {
        let mut attributes = vec![ATTRIBUTE_UNSUPPORTED; ATTRIBUTE_SLOTS];
        attributes[75] = 9;
        attributes[76] = 0;
        let capset = Capset {
            protocol_version: crate::PROTOCOL_VERSION,
            driver_version: 13000,
            executor: "sim".into(),
            devices: vec![DeviceInfo {
                name: "NVIDIA H200".into(),
                uuid: [7; 16],
                total_mem: 143_771 << 20,
                host_ordinal: 0,
                attributes,
            }],
        };
        let decoded = Capset::decode(&capset.encode()).expect("valid capset");
        assert_eq!(decoded, capset);
        assert_eq!(decoded.devices[0].attribute(75), Some(9));
        assert_eq!(decoded.devices[0].attribute(1), None);
        assert_eq!(decoded.devices[0].attribute(-1), None);
        assert_eq!(decoded.devices[0].attribute(100_000), None);
        assert_eq!(
            decoded.devices[0].uuid_string(),
            "GPU-07070707-0707-0707-0707-070707070707"
        );
    }
}

//! The virtio-gpu control-queue structures rgpu uses (virtio spec 1.2+,
//! "GPU Device"; Linux `include/uapi/linux/virtio_gpu.h`). Shared by the
//! device model in the daemon and the local carrier, which plays the driver.

use crate::wire::{DecodeError, WireReader, WireWriter};

pub const VIRTIO_ID_GPU: u32 = 16;

// Device feature bits.
pub const VIRTIO_GPU_F_VIRGL: u32 = 0;
pub const VIRTIO_GPU_F_EDID: u32 = 1;
pub const VIRTIO_GPU_F_RESOURCE_UUID: u32 = 2;
pub const VIRTIO_GPU_F_RESOURCE_BLOB: u32 = 3;
pub const VIRTIO_GPU_F_CONTEXT_INIT: u32 = 4;

// Control commands.
pub const CMD_GET_DISPLAY_INFO: u32 = 0x0100;
pub const CMD_RESOURCE_CREATE_2D: u32 = 0x0101;
pub const CMD_RESOURCE_UNREF: u32 = 0x0102;
pub const CMD_SET_SCANOUT: u32 = 0x0103;
pub const CMD_RESOURCE_FLUSH: u32 = 0x0104;
pub const CMD_TRANSFER_TO_HOST_2D: u32 = 0x0105;
pub const CMD_RESOURCE_ATTACH_BACKING: u32 = 0x0106;
pub const CMD_RESOURCE_DETACH_BACKING: u32 = 0x0107;
pub const CMD_GET_CAPSET_INFO: u32 = 0x0108;
pub const CMD_GET_CAPSET: u32 = 0x0109;
pub const CMD_GET_EDID: u32 = 0x010a;
pub const CMD_RESOURCE_ASSIGN_UUID: u32 = 0x010b;
pub const CMD_RESOURCE_CREATE_BLOB: u32 = 0x010c;
pub const CMD_SET_SCANOUT_BLOB: u32 = 0x010d;
pub const CMD_CTX_CREATE: u32 = 0x0200;
pub const CMD_CTX_DESTROY: u32 = 0x0201;
pub const CMD_CTX_ATTACH_RESOURCE: u32 = 0x0202;
pub const CMD_CTX_DETACH_RESOURCE: u32 = 0x0203;
pub const CMD_RESOURCE_CREATE_3D: u32 = 0x0204;
pub const CMD_TRANSFER_TO_HOST_3D: u32 = 0x0205;
pub const CMD_TRANSFER_FROM_HOST_3D: u32 = 0x0206;
pub const CMD_SUBMIT_3D: u32 = 0x0207;
pub const CMD_RESOURCE_MAP_BLOB: u32 = 0x0208;
pub const CMD_RESOURCE_UNMAP_BLOB: u32 = 0x0209;
pub const CMD_UPDATE_CURSOR: u32 = 0x0300;
pub const CMD_MOVE_CURSOR: u32 = 0x0301;

// Responses.
pub const RESP_OK_NODATA: u32 = 0x1100;
pub const RESP_OK_DISPLAY_INFO: u32 = 0x1101;
pub const RESP_OK_CAPSET_INFO: u32 = 0x1102;
pub const RESP_OK_CAPSET: u32 = 0x1103;
pub const RESP_ERR_UNSPEC: u32 = 0x1200;
pub const RESP_ERR_OUT_OF_MEMORY: u32 = 0x1201;
pub const RESP_ERR_INVALID_SCANOUT_ID: u32 = 0x1202;
pub const RESP_ERR_INVALID_RESOURCE_ID: u32 = 0x1203;
pub const RESP_ERR_INVALID_CONTEXT_ID: u32 = 0x1204;
pub const RESP_ERR_INVALID_PARAMETER: u32 = 0x1205;

// Header flags.
pub const FLAG_FENCE: u32 = 1 << 0;
pub const FLAG_INFO_RING_IDX: u32 = 1 << 1;

/// `context_init` of CTX_CREATE: the low byte is the capset id.
pub const CONTEXT_INIT_CAPSET_ID_MASK: u32 = 0xff;

pub const BLOB_MEM_GUEST: u32 = 1;
pub const BLOB_MEM_HOST3D: u32 = 2;
pub const BLOB_MEM_HOST3D_GUEST: u32 = 3;
pub const BLOB_FLAG_USE_MAPPABLE: u32 = 1;
pub const BLOB_FLAG_USE_SHAREABLE: u32 = 2;
pub const BLOB_FLAG_USE_CROSS_DEVICE: u32 = 4;

pub const MAX_SCANOUTS: usize = 16;
pub const CTRL_HDR_SIZE: usize = 24;
pub const CONFIG_SIZE: usize = 16;
pub const DISPLAY_INFO_SIZE: usize = CTRL_HDR_SIZE + MAX_SCANOUTS * 24;
pub const CTX_DEBUG_NAME_BYTES: usize = 64;
/// Most memory entries accepted in one RESOURCE_CREATE_BLOB (a 1 GiB blob of
/// single 4 KiB pages).
pub const MAX_BLOB_ENTRIES: u32 = 1 << 18;

/// `struct virtio_gpu_ctrl_hdr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtrlHdr {
    pub type_: u32,
    pub flags: u32,
    pub fence_id: u64,
    pub ctx_id: u32,
    pub ring_idx: u8,
}

impl CtrlHdr {
    pub fn decode(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let type_ = r.u32()?;
        let flags = r.u32()?;
        let fence_id = r.u64()?;
        let ctx_id = r.u32()?;
        let ring_idx = r.u8()?;
        r.take(3)?;
        Ok(Self {
            type_,
            flags,
            fence_id,
            ctx_id,
            ring_idx,
        })
    }

    pub fn encode(&self, w: &mut WireWriter) {
        w.u32(self.type_)
            .u32(self.flags)
            .u64(self.fence_id)
            .u32(self.ctx_id)
            .u8(self.ring_idx)
            .raw(&[0; 3]);
    }

    /// The response header for a request: the fence fields are echoed so the
    /// driver signals the right fence.
    pub fn response(&self, type_: u32) -> Self {
        Self {
            type_,
            flags: self.flags & (FLAG_FENCE | FLAG_INFO_RING_IDX),
            fence_id: self.fence_id,
            ctx_id: self.ctx_id,
            ring_idx: self.ring_idx,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = WireWriter::with_capacity(CTRL_HDR_SIZE);
        self.encode(&mut w);
        w.into_bytes()
    }
}

/// `struct virtio_gpu_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuConfig {
    pub events_read: u32,
    pub events_clear: u32,
    pub num_scanouts: u32,
    pub num_capsets: u32,
}

impl GpuConfig {
    pub fn to_bytes(&self) -> [u8; CONFIG_SIZE] {
        let mut out = [0u8; CONFIG_SIZE];
        for (slot, v) in out.chunks_exact_mut(4).zip([
            self.events_read,
            self.events_clear,
            self.num_scanouts,
            self.num_capsets,
        ]) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
        out
    }
}

/// One guest-physical range of a guest blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemEntry {
    pub addr: u64,
    pub length: u32,
}

/// `struct virtio_gpu_resource_create_blob` and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceCreateBlob {
    pub resource_id: u32,
    pub blob_mem: u32,
    pub blob_flags: u32,
    pub blob_id: u64,
    pub size: u64,
    pub entries: Vec<MemEntry>,
}

impl ResourceCreateBlob {
    /// Decodes the body after the control header.
    pub fn decode(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let resource_id = r.u32()?;
        let blob_mem = r.u32()?;
        let blob_flags = r.u32()?;
        let nr_entries = r.u32()?;
        let blob_id = r.u64()?;
        let size = r.u64()?;
        if nr_entries > MAX_BLOB_ENTRIES {
            return Err(DecodeError::LengthOutOfRange {
                length: nr_entries.into(),
                limit: MAX_BLOB_ENTRIES.into(),
            });
        }
        let needed = nr_entries as usize * 16;
        if r.remaining() < needed {
            return Err(DecodeError::Truncated {
                offset: r.offset(),
                needed,
                available: r.remaining(),
            });
        }
        let mut entries = Vec::with_capacity(nr_entries as usize);
        for _ in 0..nr_entries {
            let addr = r.u64()?;
            let length = r.u32()?;
            let _padding = r.u32()?;
            entries.push(MemEntry { addr, length });
        }
        Ok(Self {
            resource_id,
            blob_mem,
            blob_flags,
            blob_id,
            size,
            entries,
        })
    }

    pub fn encode(&self, w: &mut WireWriter) {
        w.u32(self.resource_id)
            .u32(self.blob_mem)
            .u32(self.blob_flags)
            .u32(self.entries.len() as u32)
            .u64(self.blob_id)
            .u64(self.size);
        for e in &self.entries {
            w.u64(e.addr).u32(e.length).u32(0);
        }
    }
}

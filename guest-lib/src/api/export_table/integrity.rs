//! The integrity check (D4082055, 3 slots): the runtime makes sure it talks
//! to NVIDIA's driver by asking slot 1 for a keyed hash of what both sides
//! know, and stops with `cudaErrorSoftwareValidityNotEstablished` (103) when
//! the answer is wrong.
//!
//! The hash, as ZLUDA's `dark_api::integrity_check` reproduces it, is
//! HMAC-MD2 (RFC 2104 over RFC 1319, 16-byte blocks) with a fixed 16-byte
//! key, over: driver version (what `cuDriverGetVersion` answers), the
//! runtime's version argument, process id, thread id (`pthread_self`
//! truncated), the addresses of the runtime-interface table, of this table
//! and of this function, the runtime's timestamp argument; then for each
//! device its UUID and PCI domain, bus and device. Versions ending in 0 or 1
//! get fixed answers. The runtime calls it with its version + 0, 1 and 2
//! (13000..13002 for CUDA 13.0).
//!
//! Slot 2 takes a flag and succeeds (observed on NVIDIA's driver, per a
//! public bring-up note); it is logged.

use std::ffi::{c_int, c_void};

use rgpu_proto::cuda_result::*;

use super::{run, trace_slot, Slot, INTEGRITY};
use crate::exports;

pub static TABLE: [Slot; 3] = [
    Slot::size(3),
    Slot::function(integrity_check as *const c_void),
    Slot::function(set_flag as *const c_void),
];

/// The HMAC key.
const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];
/// The answers for versions ending in 0 and 1.
const ANSWER_0: [u64; 2] = [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8];
const ANSWER_1: [u64; 2] = [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8];

const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;

/// RFC 1319's substitution table (derived from the digits of pi).
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 (RFC 1319), streaming.
pub struct Md2 {
    state: [u8; 48],
    checksum: [u8; 16],
    block: [u8; 16],
    filled: usize,
}

impl Default for Md2 {
    fn default() -> Self {
        Self {
            state: [0; 48],
            checksum: [0; 16],
            block: [0; 16],
            filled: 0,
        }
    }
}

impl Md2 {
    pub fn update(&mut self, data: &[u8]) {
        for &byte in data {
            self.block[self.filled] = byte;
            self.filled += 1;
            if self.filled == 16 {
                let block = self.block;
                self.compress(&block);
                self.filled = 0;
            }
        }
    }

    fn compress(&mut self, block: &[u8; 16]) {
        let mut last = self.checksum[15];
        for (c, m) in self.checksum.iter_mut().zip(block) {
            *c ^= PI_SUBST[usize::from(m ^ last)];
            last = *c;
        }
        for (j, &m) in block.iter().enumerate() {
            self.state[16 + j] = m;
            self.state[32 + j] = m ^ self.state[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for x in self.state.iter_mut() {
                *x ^= PI_SUBST[usize::from(t)];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = 16 - self.filled;
        self.update(&vec![pad as u8; pad]);
        let checksum = self.checksum;
        self.update(&checksum);
        let mut digest = [0; 16];
        digest.copy_from_slice(&self.state[..16]);
        digest
    }
}

/// HMAC-MD2 with a 16-byte key (one MD2 block: no key hashing or padding).
pub fn hmac_md2(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
    let pad = |mask: u8| key.map(|k| k ^ mask);
    let mut inner = Md2::default();
    inner.update(&pad(0x36));
    inner.update(message);
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&pad(0x5c));
    outer.update(&inner);
    outer.finish()
}

/// What identifies one device to the hash.
pub struct DeviceIdentity {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// Everything the hash covers.
pub struct HashInput {
    pub driver_version: u32,
    pub version: u32,
    pub process: u32,
    pub thread: u32,
    pub runtime_table: usize,
    pub integrity_table: usize,
    pub function: usize,
    pub unix_seconds: u64,
    pub devices: Vec<DeviceIdentity>,
}

impl HashInput {
    /// The bytes hashed: the C layout the runtime hashes (four u32, three
    /// pointers, a u64; per device 16 bytes of UUID and three i32), in the
    /// machine's byte order.
    fn message(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(48 + 28 * self.devices.len());
        for v in [self.driver_version, self.version, self.process, self.thread] {
            m.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [self.runtime_table, self.integrity_table, self.function] {
            m.extend_from_slice(&(v as u64).to_ne_bytes());
        }
        m.extend_from_slice(&self.unix_seconds.to_ne_bytes());
        for d in &self.devices {
            m.extend_from_slice(&d.uuid);
            for v in [d.pci_domain, d.pci_bus, d.pci_device] {
                m.extend_from_slice(&v.to_ne_bytes());
            }
        }
        m
    }
}

/// The fixed answers, for versions ending in 0 or 1.
pub fn fixed_answer(version: u32) -> Option<[u64; 2]> {
    match version % 10 {
        0 => Some(ANSWER_0),
        1 => Some(ANSWER_1),
        _ => None,
    }
}

/// The answer for `input`.
pub fn answer(input: &HashInput) -> [u64; 2] {
    if let Some(fixed) = fixed_answer(input.version) {
        return fixed;
    }
    let digest = hmac_md2(&KEY, &input.message());
    let mut words = [0u64; 2];
    for (word, bytes) in words.iter_mut().zip(digest.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        *word = u64::from_ne_bytes(b);
    }
    words
}

/// Calls an entry point of ours, as the runtime sees it.
fn check(code: u32) -> Result<(), u32> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

/// The devices as the application sees them through the driver API.
fn devices() -> Result<Vec<DeviceIdentity>, u32> {
    let mut count: c_int = 0;
    check(exports::cuDeviceGetCount(&mut count))?;
    (0..count)
        .map(|dev| {
            let mut d = DeviceIdentity {
                uuid: [0; 16],
                pci_domain: 0,
                pci_bus: 0,
                pci_device: 0,
            };
            check(exports::cuDeviceGetUuid(&mut d.uuid, dev))?;
            check(exports::cuDeviceGetAttribute(
                &mut d.pci_domain,
                CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
                dev,
            ))?;
            check(exports::cuDeviceGetAttribute(
                &mut d.pci_bus,
                CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                dev,
            ))?;
            check(exports::cuDeviceGetAttribute(
                &mut d.pci_device,
                CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
                dev,
            ))?;
            Ok(d)
        })
        .collect()
}

/// The input for this process, thread and driver.
pub fn current_input(version: u32, unix_seconds: u64) -> Result<HashInput, u32> {
    let mut driver_version: c_int = 0;
    check(exports::cuDriverGetVersion(&mut driver_version))?;
    // SAFETY: getpid and pthread_self have no preconditions.
    let (process, thread) = unsafe { (libc::getpid(), libc::pthread_self()) };
    Ok(HashInput {
        driver_version: driver_version as u32,
        version,
        process: process as u32,
        // Truncated to 32 bits, as the runtime does.
        thread: thread as u32,
        runtime_table: super::runtime::TABLE.as_ptr() as usize,
        integrity_table: TABLE.as_ptr() as usize,
        function: TABLE[1].value(),
        unix_seconds,
        devices: devices()?,
    })
}

/// Slot 1.
extern "C" fn integrity_check(version: u32, unix_seconds: u64, result: *mut [u64; 2]) -> u32 {
    run(INTEGRITY, 1, || {
        if result.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let words = match fixed_answer(version) {
            Some(fixed) => fixed,
            None => answer(&current_input(version, unix_seconds)?),
        };
        log::debug!("rgpu: integrity check, version {version}, time {unix_seconds}");
        // SAFETY: non-NULL; the runtime passes room for two u64.
        unsafe { result.write_unaligned(words) };
        Ok(())
    })
}

/// Slot 2: takes a flag; succeeds.
extern "C" fn set_flag(flag: c_int) -> u32 {
    trace_slot(INTEGRITY, 2, format_args!("flag {flag}"));
    CUDA_SUCCESS
}

//! The device queries: static values from the capset, live ones (memory,
//! utilisation, processes) from the host's `DeviceStatus`.

use std::ffi::{c_char, c_int, c_uint, CStr};

use rgpu_proto::capset::device_attribute::{
    COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY_MINOR, PCI_BUS_ID, PCI_DEVICE_ID, PCI_DOMAIN_ID,
};
use rgpu_proto::capset::DeviceInfo;
use rgpu_proto::reply::SessionUsage;

use crate::abi::*;
use crate::{out, state};

pub fn get_count(count: *mut c_uint) -> Result<(), u32> {
    let connection = state::connection()?;
    out::value(count, connection.device_count() as c_uint)
}

pub fn get_handle_by_index(index: c_uint, device: *mut NvmlDevice) -> Result<(), u32> {
    let connection = state::connection()?;
    let handle = connection.handle(index as usize)?;
    out::value(device, handle)
}

/// A C string argument, or `NVML_ERROR_INVALID_ARGUMENT`.
fn c_str<'a>(text: *const c_char) -> Result<&'a str, u32> {
    if text.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: a non-null NUL-terminated string, as the entry point's
    // contract requires; only read during the call.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

/// The handle of the first device `matches` accepts.
fn find(device: *mut NvmlDevice, matches: impl Fn(&DeviceInfo) -> bool) -> Result<(), u32> {
    let connection = state::connection()?;
    if device.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let index = connection
        .capset()
        .devices
        .iter()
        .take(connection.device_count())
        .position(matches)
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    out::value(device, connection.handle(index)?)
}

pub fn get_handle_by_uuid(uuid: *const c_char, device: *mut NvmlDevice) -> Result<(), u32> {
    let uuid = c_str(uuid)?;
    find(device, |d| d.uuid_string().eq_ignore_ascii_case(uuid))
}

/// `domain:bus:device.function` as NVML and CUDA print it (domain of 4 or
/// 8 hex digits, or absent), hex in either case.
pub fn parse_pci_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let hex = |s: &str| {
        (!s.is_empty() && s.len() <= 8)
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let (rest, function) = text.trim().rsplit_once('.')?;
    hex(function)?;
    let mut parts = rest.rsplit(':');
    let device = hex(parts.next()?)?;
    let bus = hex(parts.next()?)?;
    let domain = match parts.next() {
        Some(domain) => hex(domain)?,
        None => 0,
    };
    parts.next().is_none().then_some((domain, bus, device))
}

fn pci_location(info: &DeviceInfo) -> (u32, u32, u32) {
    let attribute = |a| {
        info.attribute(a)
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0)
    };
    (
        attribute(PCI_DOMAIN_ID),
        attribute(PCI_BUS_ID),
        attribute(PCI_DEVICE_ID),
    )
}

pub fn get_handle_by_pci_bus_id(bus_id: *const c_char, device: *mut NvmlDevice) -> Result<(), u32> {
    let wanted = parse_pci_bus_id(c_str(bus_id)?).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    find(device, |d| pci_location(d) == wanted)
}

pub fn get_name(device: NvmlDevice, name: *mut c_char, length: c_uint) -> Result<(), u32> {
    let connection = state::connection()?;
    let (_, info) = connection.device(device)?;
    out::string(name, length, &info.name)
}

pub fn get_uuid(device: NvmlDevice, uuid: *mut c_char, length: c_uint) -> Result<(), u32> {
    let connection = state::connection()?;
    let (_, info) = connection.device(device)?;
    out::string(uuid, length, &info.uuid_string())
}

pub fn get_index(device: NvmlDevice, index: *mut c_uint) -> Result<(), u32> {
    let connection = state::connection()?;
    let (index_of, _) = connection.device(device)?;
    out::value(index, index_of as c_uint)
}

/// The guest has no `/dev/nvidiaN`: the minor number is the index.
pub fn get_minor_number(device: NvmlDevice, minor: *mut c_uint) -> Result<(), u32> {
    get_index(device, minor)
}

/// The v3 PCI record of a device.
pub fn pci_info_of(info: &DeviceInfo) -> PciInfo {
    let (domain, bus, device) = pci_location(info);
    PciInfo {
        bus_id_legacy: out::array(&format!("{domain:04X}:{bus:02X}:{device:02X}.0")),
        domain,
        bus,
        device,
        // The product id is not in the capset: only NVIDIA's vendor id.
        pci_device_id: PCI_VENDOR_NVIDIA,
        pci_sub_system_id: 0,
        bus_id: out::array(&format!("{domain:08X}:{bus:02X}:{device:02X}.0")),
    }
}

pub fn get_pci_info_v3(device: NvmlDevice, pci: *mut PciInfo) -> Result<(), u32> {
    let connection = state::connection()?;
    let (_, info) = connection.device(device)?;
    out::value(pci, pci_info_of(info))
}

/// The `_v1`/`_v2` record: the same fields up to `pciSubSystemId`, then
/// reserved words (v1) or the 32-byte bus id (v2). Only the common prefix
/// is written, so an older, shorter struct is never overrun.
pub fn get_pci_info_legacy(device: NvmlDevice, pci: *mut PciInfo) -> Result<(), u32> {
    let connection = state::connection()?;
    let (_, info) = connection.device(device)?;
    if pci.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let record = pci_info_of(info);
    let prefix = std::mem::offset_of!(PciInfo, bus_id);
    // SAFETY: `pci` is the application's non-null record, whose every
    // version starts with these `prefix` bytes; `record` is a local copy.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&record as *const PciInfo).cast::<u8>(),
            pci.cast::<u8>(),
            prefix,
        );
    }
    Ok(())
}

pub fn get_pci_info_ext(device: NvmlDevice, pci: *mut PciInfoExt) -> Result<(), u32> {
    let connection = state::connection()?;
    let (_, info) = connection.device(device)?;
    if pci.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null; the version word is the first field of every
    // version of the record.
    let version = unsafe { pci.cast::<c_uint>().read_unaligned() };
    if version != PCI_INFO_EXT_V1 {
        return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    let record = pci_info_of(info);
    out::value(
        pci,
        PciInfoExt {
            version,
            domain: record.domain,
            bus: record.bus,
            device: record.device,
            pci_device_id: record.pci_device_id,
            pci_sub_system_id: record.pci_sub_system_id,
            // Display controller, 3D controller (what an H200 reports).
            base_class: 0x03,
            sub_class: 0x02,
            bus_id: record.bus_id,
        },
    )
}

pub fn get_cuda_compute_capability(
    device: NvmlDevice,
    major: *mut c_int,
    minor: *mut c_int,
) -> Result<(), u32> {
    let connection = state::connection()?;
    let (_, info) = connection.device(device)?;
    let major_value = info
        .attribute(COMPUTE_CAPABILITY_MAJOR)
        .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    let minor_value = info
        .attribute(COMPUTE_CAPABILITY_MINOR)
        .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    if major.is_null() || minor.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out::value(major, major_value)?;
    out::value(minor, minor_value)
}

/// `(total, free, used)` bytes of a device, live from the host.
fn memory(device: NvmlDevice) -> Result<(u64, u64, u64), u32> {
    let connection = state::connection()?;
    let (index, _) = connection.device(device)?;
    let status = connection.status(index)?;
    let free = status.free.min(status.total);
    Ok((status.total, free, status.total - free))
}

pub fn get_memory_info(device: NvmlDevice, memory_out: *mut Memory) -> Result<(), u32> {
    if memory_out.is_null() {
        state::connection()?;
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let (total, free, used) = memory(device)?;
    out::value(memory_out, Memory { total, free, used })
}

pub fn get_memory_info_v2(device: NvmlDevice, memory_out: *mut MemoryV2) -> Result<(), u32> {
    if memory_out.is_null() {
        state::connection()?;
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null; the version word is the record's first field.
    let version = unsafe { memory_out.cast::<c_uint>().read_unaligned() };
    if version != MEMORY_V2 {
        state::connection()?;
        return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    let (total, free, used) = memory(device)?;
    out::value(
        memory_out,
        MemoryV2 {
            version,
            total,
            reserved: 0,
            free,
            used,
        },
    )
}

pub fn get_utilization_rates(device: NvmlDevice, rates: *mut Utilization) -> Result<(), u32> {
    let connection = state::connection()?;
    let (index, _) = connection.device(device)?;
    if rates.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let status = connection.status(index)?;
    let known = |v: u32| (v <= 100).then_some(v).ok_or(NVML_ERROR_NOT_SUPPORTED);
    out::value(
        rates,
        Utilization {
            gpu: known(status.gpu_utilization)?,
            memory: known(status.memory_utilization)?,
        },
    )
}

/// This tenant's processes, as the host lists them: by the pids the guest
/// library named (one line per process, its memory summed over its
/// entries). An entry without a pid (an older guest library) is this
/// process's own, the only one the guest could name then.
fn processes(device: NvmlDevice) -> Result<Vec<ProcessInfo>, u32> {
    let connection = state::connection()?;
    let (index, _) = connection.device(device)?;
    let status = connection.status(index)?;
    Ok(group_by_pid(&status.sessions, std::process::id()))
}

fn group_by_pid(entries: &[SessionUsage], own_pid: u32) -> Vec<ProcessInfo> {
    let mut list: Vec<ProcessInfo> = Vec::new();
    for entry in entries {
        let pid = if entry.pid == 0 { own_pid } else { entry.pid };
        match list.iter_mut().find(|p| p.pid == pid) {
            Some(p) => p.used_gpu_memory = p.used_gpu_memory.saturating_add(entry.device_memory),
            None => list.push(ProcessInfo {
                pid,
                used_gpu_memory: entry.device_memory,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            }),
        }
    }
    list
}

/// NVML's size protocol: `*count` too small (or `infos` NULL with a
/// non-zero need) answers the needed count and INSUFFICIENT_SIZE.
fn write_processes<T>(
    count: *mut c_uint,
    infos: *mut T,
    list: &[ProcessInfo],
    convert: impl Fn(&ProcessInfo) -> T,
) -> Result<(), u32> {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null in/out count of the entry point's contract.
    let room = unsafe { count.read_unaligned() } as usize;
    let needed = list.len() as c_uint;
    if list.len() > room || (infos.is_null() && !list.is_empty()) {
        out::value(count, needed)?;
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, process) in list.iter().enumerate() {
        // SAFETY: `infos` holds `room` >= list.len() records (the
        // application said so through `*count`).
        unsafe { infos.add(i).write_unaligned(convert(process)) };
    }
    out::value(count, needed)
}

pub fn get_compute_running_processes_v1(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Result<(), u32> {
    let list = processes(device)?;
    write_processes(count, infos, &list, |p| ProcessInfoV1 {
        pid: p.pid,
        used_gpu_memory: p.used_gpu_memory,
    })
}

pub fn get_compute_running_processes(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Result<(), u32> {
    let list = processes(device)?;
    write_processes(count, infos, &list, |p| *p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_proto::capset::{ATTRIBUTE_SLOTS, ATTRIBUTE_UNSUPPORTED};

    #[test]
    fn pci_bus_ids_parse_in_every_spelling() {
        assert_eq!(parse_pci_bus_id("00000000:3B:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_pci_bus_id("0001:3b:1f.0"), Some((1, 0x3b, 0x1f)));
        assert_eq!(parse_pci_bus_id("3b:02.0"), Some((0, 0x3b, 2)));
        for bad in [
            "",
            "3b",
            "3b:02",
            "x:3b:02.0",
            "0:0:0:0.0",
            "000000000:00:00.0",
            ":00.0",
        ] {
            assert_eq!(parse_pci_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn pci_records_format_the_location() {
        let mut attributes = vec![ATTRIBUTE_UNSUPPORTED; ATTRIBUTE_SLOTS];
        attributes[33] = 0x19;
        attributes[34] = 0;
        attributes[50] = 0;
        let info = DeviceInfo {
            name: "x".into(),
            uuid: [0; 16],
            total_mem: 1,
            host_ordinal: 0,
            attributes,
        };
        let pci = pci_info_of(&info);
        // SAFETY: NUL-terminated by `out::array`.
        let bus_id = unsafe { CStr::from_ptr(pci.bus_id.as_ptr()) };
        assert_eq!(bus_id, c"00000000:19:00.0");
        // SAFETY: as above.
        let legacy = unsafe { CStr::from_ptr(pci.bus_id_legacy.as_ptr()) };
        assert_eq!(legacy, c"0000:19:00.0");
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x19, 0));
        assert_eq!(pci.pci_device_id & 0xffff, PCI_VENDOR_NVIDIA);
    }

    #[test]
    fn processes_are_listed_by_pid_and_unnamed_entries_are_this_process() {
        let entry = |ctx_id, pid, device_memory| SessionUsage {
            ctx_id,
            pid,
            device_memory,
        };
        let list = group_by_pid(
            &[
                entry(0, 40, 100),
                entry(3, 0, 5),
                entry(0, 41, 7),
                entry(4, 0, 6),
                entry(0, 40, 1),
            ],
            9,
        );
        let pairs: Vec<(u32, u64)> = list.iter().map(|p| (p.pid, p.used_gpu_memory)).collect();
        assert_eq!(pairs, [(40, 101), (9, 11), (41, 7)]);
        assert!(group_by_pid(&[], 9).is_empty());
    }

    #[test]
    fn the_size_protocol_of_process_lists() {
        let one = [ProcessInfo {
            pid: 7,
            used_gpu_memory: 9,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
        }];
        let mut count: c_uint = 0;
        assert_eq!(
            write_processes(&mut count, std::ptr::null_mut(), &one, |p| *p),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(count, 1);
        let mut infos = [ProcessInfoV1::default(); 2];
        count = 2;
        let convert = |p: &ProcessInfo| ProcessInfoV1 {
            pid: p.pid,
            used_gpu_memory: p.used_gpu_memory,
        };
        assert_eq!(
            write_processes(&mut count, infos.as_mut_ptr(), &one, convert),
            Ok(())
        );
        assert_eq!((count, infos[0].pid, infos[0].used_gpu_memory), (1, 7, 9));
        count = 0;
        assert_eq!(
            write_processes(&mut count, std::ptr::null_mut::<ProcessInfo>(), &[], |p| *p),
            Ok(())
        );
        assert_eq!(count, 0);
        assert_eq!(
            write_processes(std::ptr::null_mut(), infos.as_mut_ptr(), &one, convert),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
    }
}

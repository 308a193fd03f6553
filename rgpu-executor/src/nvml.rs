//! NVIDIA's NVML on the host, loaded at run time with libloading: the cuda
//! executor's source of GPU utilisation and the driver version string. It
//! is optional: without `libnvidia-ml.so.1` (or with rgpu's own guest NVML
//! on the library path) those values are simply unknown.

use std::ffi::{c_char, c_uint, c_void, CString};
use std::ptr::null_mut;

use log::{debug, info};

/// Exported by rgpu's guest NVML, so the daemon never talks to itself.
pub const GUEST_NVML_MARKER: &str = "rgpu_nvml_marker";
const LIBRARY: &str = "libnvidia-ml.so.1";
const NVML_SUCCESS: u32 = 0;
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
const DRIVER_VERSION_BYTES: usize = 80;

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> u32;
type ShutdownFn = unsafe extern "C" fn() -> u32;
type DriverVersionFn = unsafe extern "C" fn(*mut c_char, c_uint) -> u32;
type HandleByUuidFn = unsafe extern "C" fn(*const c_char, *mut Device) -> u32;
type UtilizationFn = unsafe extern "C" fn(Device, *mut Utilization) -> u32;
type MemoryInfoFn = unsafe extern "C" fn(Device, *mut MemoryInfo) -> u32;
type RunningProcessesFn = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> u32;

const NVML_ERROR_INSUFFICIENT_SIZE: u32 = 7;
/// `NVML_VALUE_NOT_AVAILABLE` in a process's `usedGpuMemory`.
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// More compute processes on one GPU than this is not a case to handle.
const MAX_PROCESSES: usize = 4096;

/// `nvmlProcessInfo_t` (the record of the `_v2` and `_v3` process lists).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlMemory_t` (version 1).
#[repr(C)]
#[derive(Default)]
struct MemoryInfo {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// NVML initialised, with the handle of the executor's GPU.
pub struct HostNvml {
    device: Device,
    utilization: UtilizationFn,
    memory_info: MemoryInfoFn,
    running_processes: Option<RunningProcessesFn>,
    shutdown: ShutdownFn,
    driver_version: String,
    /// Kept loaded while the entry points above are used.
    _library: libloading::Library,
}

// SAFETY: NVML is thread-safe; the device handle is an opaque token only
// passed back to NVML.
unsafe impl Send for HostNvml {}
// SAFETY: as above.
unsafe impl Sync for HostNvml {}

fn symbol<T: Copy>(library: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: each `T` used here is the C signature of that NVML entry point
    // (nvml.h), with `nvmlReturn_t` as `u32`.
    unsafe { library.get::<T>(name.as_bytes()).ok().map(|s| *s) }
}

impl HostNvml {
    /// Loads NVML and finds the GPU of `uuid` (`GPU-…`); `None`, logged,
    /// when any of that fails.
    pub fn open(uuid: &str) -> Option<Self> {
        Self::open_library(LIBRARY, uuid)
    }

    fn open_library(name: &str, uuid: &str) -> Option<Self> {
        // SAFETY: loading runs NVIDIA's library initialisers, nothing else.
        let library = match unsafe { libloading::Library::new(name) } {
            Ok(library) => library,
            Err(e) => {
                info!("host NVML not available ({e}): GPU utilisation will read as unknown");
                return None;
            }
        };
        if symbol::<*const c_void>(&library, GUEST_NVML_MARKER).is_some() {
            info!("{name} on the daemon's library path is rgpu's guest NVML: not used");
            return None;
        }
        let init: InitFn = symbol(&library, "nvmlInit_v2")?;
        let shutdown: ShutdownFn = symbol(&library, "nvmlShutdown")?;
        let driver_version: DriverVersionFn = symbol(&library, "nvmlSystemGetDriverVersion")?;
        let by_uuid: HandleByUuidFn = symbol(&library, "nvmlDeviceGetHandleByUUID")?;
        let utilization: UtilizationFn = symbol(&library, "nvmlDeviceGetUtilizationRates")?;
        let memory_info: MemoryInfoFn = symbol(&library, "nvmlDeviceGetMemoryInfo")?;
        let running_processes: Option<RunningProcessesFn> =
            symbol(&library, "nvmlDeviceGetComputeRunningProcesses_v3");
        // SAFETY: plain initialisation, balanced by `shutdown` in drop.
        let code = unsafe { init() };
        if code != NVML_SUCCESS {
            info!("host nvmlInit_v2 failed with NVML error {code}");
            return None;
        }
        let close = || {
            // SAFETY: balances the successful init above.
            unsafe { shutdown() };
        };
        let mut version = [0 as c_char; DRIVER_VERSION_BYTES];
        // SAFETY: the buffer holds the length passed.
        let code = unsafe { driver_version(version.as_mut_ptr(), DRIVER_VERSION_BYTES as c_uint) };
        let version = if code == NVML_SUCCESS {
            let bytes: Vec<u8> = version
                .iter()
                .take_while(|c| **c != 0)
                .map(|c| *c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            String::new()
        };
        let Ok(cuuid) = CString::new(uuid) else {
            close();
            return None;
        };
        let mut device: Device = null_mut();
        // SAFETY: NUL-terminated UUID, valid out-pointer.
        let code = unsafe { by_uuid(cuuid.as_ptr(), &mut device) };
        if code != NVML_SUCCESS {
            info!("host NVML does not know GPU {uuid} (NVML error {code})");
            close();
            return None;
        }
        debug!("host NVML: driver {version}, GPU {uuid}");
        Some(Self {
            device,
            utilization,
            memory_info,
            running_processes,
            shutdown,
            driver_version: version,
            _library: library,
        })
    }

    pub fn driver_version(&self) -> &str {
        &self.driver_version
    }

    /// `(gpu, memory)` utilisation percent, if NVML answers.
    pub fn utilization(&self) -> Option<(u32, u32)> {
        let mut rates = Utilization::default();
        // SAFETY: a handle NVML gave out, valid out-pointer.
        let code = unsafe { (self.utilization)(self.device, &mut rates) };
        (code == NVML_SUCCESS).then_some((rates.gpu, rates.memory))
    }
}

impl HostNvml {
    /// `(free, total)` device memory as NVML counts it (guests that compare
    /// with NVIDIA's NVML see the same numbers), if NVML answers.
    pub fn memory(&self) -> Option<(u64, u64)> {
        let mut memory = MemoryInfo::default();
        // SAFETY: a handle NVML gave out, valid out-pointer.
        let code = unsafe { (self.memory_info)(self.device, &mut memory) };
        (code == NVML_SUCCESS).then_some((memory.free, memory.total))
    }
}

impl HostNvml {
    /// Device memory process `pid` holds on the GPU as the driver counts
    /// it (contexts, module globals, allocations), if NVML knows it; 0 for
    /// a process that has no context there.
    pub fn process_memory(&self, pid: u32) -> Option<u64> {
        let list = self.running_processes?;
        let mut records = vec![ProcessInfo::default(); 64];
        loop {
            let mut count = c_uint::try_from(records.len()).ok()?;
            // SAFETY: a handle NVML gave out; `records` holds `count`
            // records, and NVML writes at most that many.
            let code = unsafe { list(self.device, &mut count, records.as_mut_ptr()) };
            let needed = usize::try_from(count).ok()?;
            match code {
                NVML_SUCCESS => {
                    records.truncate(needed);
                    break;
                }
                NVML_ERROR_INSUFFICIENT_SIZE if needed <= MAX_PROCESSES => {
                    // A little room for processes that start meanwhile.
                    records.resize(needed + 8, ProcessInfo::default());
                }
                _ => return None,
            }
        }
        match records.iter().find(|r| r.pid == pid) {
            None => Some(0),
            Some(r) if r.used_gpu_memory == VALUE_NOT_AVAILABLE => None,
            Some(r) => Some(r.used_gpu_memory),
        }
    }
}

/// The kernel module's version from `/proc/driver/nvidia/version` (the
/// same string NVML reports), for hosts without NVML.
pub fn kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_kernel_module_version(&text)
}

/// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue …" ->
/// "580.95.05": the first dotted number after "Kernel Module" on the NVRM
/// line (the open module says "Kernel Module for x86_64" first).
fn parse_kernel_module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let (_, rest) = line.split_once("Kernel Module")?;
    rest.split_whitespace()
        .find(|word| {
            word.contains('.')
                && word.starts_with(|c: char| c.is_ascii_digit())
                && word.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_owned)
}

impl Drop for HostNvml {
    fn drop(&mut self) {
        // SAFETY: balances the init of `open`.
        unsafe { (self.shutdown)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_module_version_is_read_from_the_nvrm_line() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.03  \
                    Release Build  (dvs-builder@U22)  Tue Nov  4 2025\nGCC version:  gcc 12\n";
        assert_eq!(
            parse_kernel_module_version(text).as_deref(),
            Some("580.159.03")
        );
        let plain = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep\n";
        assert_eq!(
            parse_kernel_module_version(plain).as_deref(),
            Some("580.95.05")
        );
        assert_eq!(parse_kernel_module_version("GCC version: 12\n"), None);
        assert_eq!(
            parse_kernel_module_version("NVRM version: Kernel Module x<y\n"),
            None
        );
    }

    #[test]
    fn a_missing_library_is_none() {
        assert!(HostNvml::open_library("librgpu-no-such-nvml.so.1", "GPU-x").is_none());
    }

    #[test]
    fn a_library_with_the_guest_marker_is_refused() {
        let dir = std::env::temp_dir().join(format!("rgpu-host-nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("marked.c");
        let so = dir.join("marked.so");
        std::fs::write(
            &c,
            "int rgpu_nvml_marker(void) { return 1; }\nint nvmlInit_v2(void) { return 0; }\n",
        )
        .unwrap();
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&c)
            .status()
            .is_ok_and(|s| s.success());
        if built {
            assert!(HostNvml::open_library(&so.to_string_lossy(), "GPU-x").is_none());
        } else {
            eprintln!("no C compiler: marker probe skipped");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

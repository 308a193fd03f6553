//! `cuGetProcAddress(_v2)`: the entry point a caller built against
//! `cudaVersion` with `flags` expects, exactly as NVIDIA's driver 580 answers
//! (recorded in `data/proc-address-table-580.159.tsv`, generated into
//! `PROC_TABLE` by build.rs). Runtimes resolve every driver function this way
//! before `cuInit`, so none of this needs the driver.

use std::ffi::{c_char, c_int, c_void};

use rgpu_proto::cuda_result::*;

use crate::abi::{c_str, write_optional, write_out};

/// One recorded change: from `version` on, `(name, flags)` resolves to
/// `symbol` (`None`: not found).
pub struct ProcRow {
    pub name: &'static str,
    pub flags: u8,
    pub version: u32,
    pub symbol: Option<&'static str>,
}

include!(concat!(env!("OUT_DIR"), "/proc_table.rs"));

/// `CUdriverProcAddressQueryResult`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The outcome of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcLookup {
    Found(&'static str),
    /// A later CUDA version has the symbol.
    VersionNotSufficient,
    NotFound,
}

/// The driver's answer for `(name, version, flags)`.
pub fn lookup(name: &str, version: i32, flags: u8) -> ProcLookup {
    let rows = rows_of(name, flags);
    let version = u32::try_from(version).unwrap_or(0);
    let current = rows.iter().rev().find(|r| r.version <= version);
    if let Some(ProcRow {
        symbol: Some(symbol),
        ..
    }) = current
    {
        return ProcLookup::Found(symbol);
    }
    let later = rows
        .iter()
        .any(|r| r.version > version && r.symbol.is_some());
    if later {
        ProcLookup::VersionNotSufficient
    } else {
        ProcLookup::NotFound
    }
}

/// The rows of `(name, flags)`, by rising version (the table is sorted).
fn rows_of(name: &str, flags: u8) -> &'static [ProcRow] {
    let key = |r: &ProcRow| (r.name, r.flags);
    let start = PROC_TABLE.partition_point(|r| key(r) < (name, flags));
    let end = PROC_TABLE.partition_point(|r| key(r) <= (name, flags));
    PROC_TABLE.get(start..end).unwrap_or_default()
}

/// `CU_GET_PROC_ADDRESS_*` flags as recorded (0 default, 1 legacy stream,
/// 2 per-thread default stream).
fn flag_of(flags: u64) -> Result<u8, u32> {
    match flags {
        0..=2 => Ok(flags as u8),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Resolves to an address, or the error and query status.
fn resolve(
    symbol: *const c_char,
    version: c_int,
    flags: u64,
) -> Result<*const c_void, (u32, c_int)> {
    let not_found = (CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    let name = c_str(symbol)
        .map_err(|e| (e, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND))?
        .to_str()
        .map_err(|_| not_found)?;
    let flags = flag_of(flags).map_err(|e| (e, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND))?;
    match lookup(name, version, flags) {
        ProcLookup::Found(symbol) => crate::symbols::lookup(symbol).ok_or(not_found),
        ProcLookup::VersionNotSufficient => Err((
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
        )),
        ProcLookup::NotFound => Err(not_found),
    }
}

fn get_proc_address_impl(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), u32> {
    if symbol.is_null() || pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match resolve(symbol, version, flags) {
        Ok(address) => {
            write_optional(status, CU_GET_PROC_ADDRESS_SUCCESS);
            write_out(pfn, address.cast_mut())
        }
        Err((code, query_status)) => {
            write_optional(status, query_status);
            write_out(pfn, std::ptr::null_mut())?;
            Err(code)
        }
    }
}

pub(crate) fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> Result<(), u32> {
    get_proc_address_impl(symbol, pfn, version, flags, std::ptr::null_mut())
}

pub(crate) fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), u32> {
    get_proc_address_impl(symbol, pfn, version, flags, status)
}

/// What `cuGetProcAddress_v2` answers for a name the tests expect to be
/// implemented here (it must be found, status 0).
#[cfg(test)]
pub(crate) fn resolve_implemented(name: &str, version: c_int, flags: u64) -> *const c_void {
    let name = std::ffi::CString::new(name).expect("a name without NUL");
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = -1;
    let rc =
        crate::exports::cuGetProcAddress_v2(name.as_ptr(), &mut pfn, version, flags, &mut status);
    assert_eq!((rc, status), (CUDA_SUCCESS, 0), "{name:?}");
    pfn.cast_const()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn versions_pick_the_recorded_variant() {
        assert_eq!(
            lookup("cuMemAlloc", 3020, 0),
            ProcLookup::Found("cuMemAlloc_v2")
        );
        assert_eq!(
            lookup("cuMemAlloc", 2000, 0),
            ProcLookup::Found("cuMemAlloc")
        );
        assert_eq!(
            lookup("cuMemAlloc", 12080, 0),
            ProcLookup::Found("cuMemAlloc_v2")
        );
        assert_eq!(
            lookup("cuCtxCreate", 12050, 0),
            ProcLookup::Found("cuCtxCreate_v4")
        );
        assert_eq!(
            lookup("cuCtxCreate", 12040, 0),
            ProcLookup::Found("cuCtxCreate_v3")
        );
        assert_eq!(
            lookup("cuCtxCreate", 3020, 0),
            ProcLookup::Found("cuCtxCreate_v2")
        );
        assert_eq!(
            lookup("cuCtxGetDevice", 13000, 0),
            ProcLookup::Found("cuCtxGetDevice_v2")
        );
        assert_eq!(
            lookup("cuCtxGetDevice", 12090, 0),
            ProcLookup::Found("cuCtxGetDevice")
        );
    }

    #[test]
    fn per_thread_flag_picks_ptsz_and_ptds() {
        assert_eq!(
            lookup("cuStreamSynchronize", 12000, 2),
            ProcLookup::Found("cuStreamSynchronize_ptsz")
        );
        assert_eq!(
            lookup("cuStreamSynchronize", 12000, 0),
            ProcLookup::Found("cuStreamSynchronize")
        );
        assert_eq!(
            lookup("cuMemcpyHtoD", 12000, 2),
            ProcLookup::Found("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(
            lookup("cuMemcpyHtoDAsync", 12000, 1),
            ProcLookup::Found("cuMemcpyHtoDAsync_v2")
        );
    }

    #[test]
    fn too_old_a_version_is_not_sufficient() {
        assert_eq!(
            lookup("cuLaunchKernel", 2000, 0),
            ProcLookup::VersionNotSufficient
        );
        assert_eq!(
            lookup("cuLaunchKernel", 3999, 0),
            ProcLookup::VersionNotSufficient
        );
        assert_eq!(
            lookup("cuLaunchKernel", 4000, 0),
            ProcLookup::Found("cuLaunchKernel")
        );
        assert_eq!(
            lookup("cuStreamSynchronize", 6000, 2),
            ProcLookup::VersionNotSufficient
        );
    }

    #[test]
    fn unknown_names_are_not_found() {
        assert_eq!(lookup("cuNoSuchFunction", 12000, 0), ProcLookup::NotFound);
        assert_eq!(lookup("cuMemAlloc_v2", 12000, 0), ProcLookup::NotFound);
        // Driver 580 answers nothing for versions past its own.
        assert_eq!(lookup("cuMemAlloc", 13010, 0), ProcLookup::NotFound);
    }

    #[test]
    fn every_recorded_symbol_has_an_address() {
        for row in PROC_TABLE.iter() {
            if let Some(symbol) = row.symbol {
                assert!(crate::symbols::lookup(symbol).is_some(), "{symbol}");
            }
        }
    }

    #[test]
    fn the_exported_entry_point_answers_with_status() {
        let name = CString::new("cuMemAlloc").unwrap();
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        let rc =
            crate::exports::cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 12000, 0, &mut status);
        assert_eq!(rc, CUDA_SUCCESS);
        assert_eq!(status, CU_GET_PROC_ADDRESS_SUCCESS);
        assert_eq!(
            pfn.cast_const(),
            crate::exports::cuMemAlloc_v2 as *const c_void
        );

        let name = CString::new("cuLaunchKernel").unwrap();
        let rc = crate::exports::cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 2000, 0, &mut status);
        assert_eq!(rc, CUDA_ERROR_NOT_FOUND);
        assert_eq!(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        assert!(pfn.is_null());

        let name = CString::new("cuBogus").unwrap();
        let rc =
            crate::exports::cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 12000, 0, &mut status);
        assert_eq!(rc, CUDA_ERROR_NOT_FOUND);
        assert_eq!(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

        let rc =
            crate::exports::cuGetProcAddress_v2(std::ptr::null(), &mut pfn, 12000, 0, &mut status);
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn v1_takes_four_arguments() {
        let name = CString::new("cuStreamQuery").unwrap();
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let rc = crate::exports::cuGetProcAddress(name.as_ptr(), &mut pfn, 12000, 2);
        assert_eq!(rc, CUDA_SUCCESS);
        assert_eq!(
            pfn.cast_const(),
            crate::exports::cuStreamQuery_ptsz as *const c_void
        );
    }
}

//! `nvmlErrorString`: NVIDIA's texts for the result codes.

use std::ffi::{c_char, CStr};

use crate::abi::*;

const STRINGS: &[(u32, &CStr)] = &[
    (NVML_SUCCESS, c"Success"),
    (NVML_ERROR_UNINITIALIZED, c"Uninitialized"),
    (NVML_ERROR_INVALID_ARGUMENT, c"Invalid Argument"),
    (NVML_ERROR_NOT_SUPPORTED, c"Not Supported"),
    (NVML_ERROR_NO_PERMISSION, c"Insufficient Permissions"),
    (NVML_ERROR_ALREADY_INITIALIZED, c"Already Initialized"),
    (NVML_ERROR_NOT_FOUND, c"Not Found"),
    (NVML_ERROR_INSUFFICIENT_SIZE, c"Insufficient Size"),
    (
        NVML_ERROR_INSUFFICIENT_POWER,
        c"Insufficient External Power",
    ),
    (NVML_ERROR_DRIVER_NOT_LOADED, c"Driver Not Loaded"),
    (NVML_ERROR_TIMEOUT, c"Timeout"),
    (NVML_ERROR_IRQ_ISSUE, c"Interrupt Request Issue"),
    (
        NVML_ERROR_LIBRARY_NOT_FOUND,
        c"NVML Shared Library Not Found",
    ),
    (NVML_ERROR_FUNCTION_NOT_FOUND, c"Function Not Found"),
    (NVML_ERROR_CORRUPTED_INFOROM, c"Corrupted infoROM"),
    (NVML_ERROR_GPU_IS_LOST, c"GPU is lost"),
    (NVML_ERROR_RESET_REQUIRED, c"GPU requires restart"),
    (
        NVML_ERROR_OPERATING_SYSTEM,
        c"The operating system has blocked the request.",
    ),
    (
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        c"RM has detected an NVML/RM version mismatch.",
    ),
    (NVML_ERROR_IN_USE, c"In use by another client"),
    (NVML_ERROR_MEMORY, c"Insufficient Memory"),
    (NVML_ERROR_NO_DATA, c"No data"),
    (
        NVML_ERROR_VGPU_ECC_NOT_ENABLED,
        c"The requested vgpu operation is not available on target device, because ECC is enabled",
    ),
    (
        NVML_ERROR_INSUFFICIENT_RESOURCES,
        c"Ran out of critical resources, other than memory",
    ),
    (NVML_ERROR_FREQ_NOT_SUPPORTED, c"Frequency not supported"),
    (
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        c"Version mismatch between the struct and the API",
    ),
    (
        NVML_ERROR_DEPRECATED,
        c"Requested functionality is deprecated",
    ),
    (NVML_ERROR_NOT_READY, c"System is not ready for the request"),
    (NVML_ERROR_GPU_NOT_FOUND, c"No GPUs were found"),
    (NVML_ERROR_INVALID_STATE, c"Resource not in correct state"),
    (NVML_ERROR_UNKNOWN, c"Unknown Error"),
];

/// The text of `result`; "Unknown Error" for codes NVML does not define.
pub fn error_string(result: u32) -> &'static CStr {
    STRINGS
        .iter()
        .find(|(code, _)| *code == result)
        .map_or(c"Unknown Error", |(_, text)| text)
}

pub fn error_string_ptr(result: u32) -> *const c_char {
    error_string(result).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_text_and_unknown_ones_read_unknown() {
        assert_eq!(error_string(NVML_SUCCESS), c"Success");
        assert_eq!(error_string(NVML_ERROR_UNINITIALIZED), c"Uninitialized");
        assert_eq!(
            error_string(NVML_ERROR_INVALID_ARGUMENT),
            c"Invalid Argument"
        );
        assert_eq!(error_string(12345), c"Unknown Error");
        for (i, (code, _)) in STRINGS.iter().enumerate() {
            assert!(
                STRINGS.iter().skip(i + 1).all(|(other, _)| other != code),
                "{code} twice"
            );
        }
    }
}

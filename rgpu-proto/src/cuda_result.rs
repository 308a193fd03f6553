//! CUDA driver result codes as plain `u32`s.
//!
//! Results travel as integers: a foreign integer is never turned into a Rust
//! enum (an unknown value would be undefined behaviour).

pub const CUDA_SUCCESS: u32 = 0;
pub const CUDA_ERROR_INVALID_VALUE: u32 = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: u32 = 3;
pub const CUDA_ERROR_DEINITIALIZED: u32 = 4;
pub const CUDA_ERROR_NO_DEVICE: u32 = 100;
pub const CUDA_ERROR_INVALID_DEVICE: u32 = 101;
pub const CUDA_ERROR_INVALID_IMAGE: u32 = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: u32 = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: u32 = 209;
pub const CUDA_ERROR_INVALID_PTX: u32 = 218;
pub const CUDA_ERROR_INVALID_SOURCE: u32 = 300;
pub const CUDA_ERROR_FILE_NOT_FOUND: u32 = 301;
pub const CUDA_ERROR_OPERATING_SYSTEM: u32 = 304;
pub const CUDA_ERROR_INVALID_HANDLE: u32 = 400;
pub const CUDA_ERROR_NOT_FOUND: u32 = 500;
pub const CUDA_ERROR_NOT_READY: u32 = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: u32 = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: u32 = 701;
pub const CUDA_ERROR_LAUNCH_TIMEOUT: u32 = 702;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: u32 = 709;
pub const CUDA_ERROR_LAUNCH_FAILED: u32 = 719;
pub const CUDA_ERROR_NOT_PERMITTED: u32 = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: u32 = 801;
pub const CUDA_ERROR_ILLEGAL_STATE: u32 = 401;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: u32 = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: u32 = 901;
pub const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: u32 = 910;
pub const CUDA_ERROR_INVALID_CLUSTER_SIZE: u32 = 912;
pub const CUDA_ERROR_UNKNOWN: u32 = 999;

/// `(code, name, description)` for the codes this crate names; the guest
/// library answers `cuGetErrorName`/`cuGetErrorString` from it.
pub const KNOWN_RESULTS: &[(u32, &str, &str)] = &[
    (CUDA_SUCCESS, "CUDA_SUCCESS", "no error"),
    (
        CUDA_ERROR_ILLEGAL_STATE,
        "CUDA_ERROR_ILLEGAL_STATE",
        "the operation cannot be performed in the present state",
    ),
    (
        CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
        "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
        "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
    ),
    (
        CUDA_ERROR_INVALID_CLUSTER_SIZE,
        "CUDA_ERROR_INVALID_CLUSTER_SIZE",
        "invalid cluster size",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "operation not permitted when stream is capturing",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "the stream capture was invalidated by an earlier error in it",
    ),
    (
        CUDA_ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE",
        "invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        "CUDA_ERROR_OUT_OF_MEMORY",
        "out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        "CUDA_ERROR_NOT_INITIALIZED",
        "initialization error",
    ),
    (
        CUDA_ERROR_DEINITIALIZED,
        "CUDA_ERROR_DEINITIALIZED",
        "driver shutting down",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        "CUDA_ERROR_NO_DEVICE",
        "no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        "CUDA_ERROR_INVALID_DEVICE",
        "invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        "CUDA_ERROR_INVALID_IMAGE",
        "device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        "CUDA_ERROR_INVALID_CONTEXT",
        "invalid device context",
    ),
    (
        CUDA_ERROR_NO_BINARY_FOR_GPU,
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "no kernel image is available for execution on the device",
    ),
    (
        CUDA_ERROR_INVALID_PTX,
        "CUDA_ERROR_INVALID_PTX",
        "a PTX JIT compilation failed",
    ),
    (
        CUDA_ERROR_INVALID_SOURCE,
        "CUDA_ERROR_INVALID_SOURCE",
        "device kernel image is invalid",
    ),
    (
        CUDA_ERROR_FILE_NOT_FOUND,
        "CUDA_ERROR_FILE_NOT_FOUND",
        "file not found",
    ),
    (
        CUDA_ERROR_OPERATING_SYSTEM,
        "CUDA_ERROR_OPERATING_SYSTEM",
        "OS call failed or operation not supported on this OS",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        "CUDA_ERROR_INVALID_HANDLE",
        "invalid resource handle",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        "CUDA_ERROR_NOT_FOUND",
        "named symbol not found",
    ),
    (
        CUDA_ERROR_NOT_READY,
        "CUDA_ERROR_NOT_READY",
        "device not ready",
    ),
    (
        CUDA_ERROR_ILLEGAL_ADDRESS,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "an illegal memory access was encountered",
    ),
    (
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        "too many resources requested for launch",
    ),
    (
        CUDA_ERROR_LAUNCH_TIMEOUT,
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "the launch timed out and was terminated",
    ),
    (
        CUDA_ERROR_CONTEXT_IS_DESTROYED,
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "context is destroyed",
    ),
    (
        CUDA_ERROR_LAUNCH_FAILED,
        "CUDA_ERROR_LAUNCH_FAILED",
        "unspecified launch failure",
    ),
    (
        CUDA_ERROR_NOT_PERMITTED,
        "CUDA_ERROR_NOT_PERMITTED",
        "operation not permitted",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED",
        "operation not supported",
    ),
    (CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"),
];

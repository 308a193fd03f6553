//! What every exported entry point does around its implementation: logging,
//! no unwinding across the C ABI, and the result as a plain `u32`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::{NVML_ERROR_UNKNOWN, NVML_SUCCESS};

/// Runs one API call: a panic becomes `NVML_ERROR_UNKNOWN`.
pub(crate) fn run(name: &'static str, call: impl FnOnce() -> Result<(), u32>) -> u32 {
    crate::logging::init();
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            log::error!("rgpu: {name} panicked; returning NVML_ERROR_UNKNOWN");
            NVML_ERROR_UNKNOWN
        }
    }
}

/// Declares the hand-written entry points: `fn nvmlName(args) => implementation;`.
/// Each becomes an unmangled `extern "C"` function that traces its arguments
/// and result; `IMPLEMENTED` lists the names. The build script reads the same
/// list (one `fn nvmlName(` per line) to generate stubs for everything else.
macro_rules! nvml_api {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $imp:path;)*) => {
        $(
            #[no_mangle]
            #[allow(non_snake_case)]
            pub extern "C" fn $name($($arg: $ty),*) -> u32 {
                let result = $crate::entry::run(stringify!($name), || $imp($($arg),*));
                if log::log_enabled!(log::Level::Trace) {
                    let args: &[String] = &[$(format!("{}={:?}", stringify!($arg), $arg)),*];
                    log::trace!("{}({}) -> {}", stringify!($name), args.join(", "), result);
                }
                result
            }
        )*

        /// Every hand-written entry point that returns `nvmlReturn_t`.
        pub const IMPLEMENTED: &[&str] = &[$(stringify!($name)),*];
    };
}
pub(crate) use nvml_api;

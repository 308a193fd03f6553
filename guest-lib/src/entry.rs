//! What every exported entry point does around its implementation: logging,
//! no unwinding across the C ABI, and the result as a plain `u32`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use rgpu_proto::cuda_result::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};

/// Runs one API call: a panic becomes `CUDA_ERROR_UNKNOWN`.
pub(crate) fn run(name: &'static str, call: impl FnOnce() -> Result<(), u32>) -> u32 {
    crate::logging::init();
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            log::error!("rgpu: {name} panicked; returning CUDA_ERROR_UNKNOWN");
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// Declares the hand-written entry points: `fn cuName(args) => implementation;`.
/// Each becomes an unmangled `extern "C"` function that traces its arguments
/// and result; `IMPLEMENTED` lists the names. The build script reads the same
/// list (one `fn cuName(` per line) to generate stubs for everything else.
macro_rules! cuda_api {
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

        /// Every hand-written entry point, in declaration order.
        pub const IMPLEMENTED: &[&str] = &[$(stringify!($name)),*];
    };
}
pub(crate) use cuda_api;

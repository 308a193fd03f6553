//! `cuGetErrorName` / `cuGetErrorString`, from rgpu-proto's table. The
//! strings are static, as the API promises.

use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, KNOWN_RESULTS};

use crate::abi::write_out;

/// A result code's name and description, NUL-terminated.
struct ResultText {
    code: u32,
    name: CString,
    text: CString,
}

/// Made once from rgpu-proto's table; the pointers handed out stay valid.
fn table() -> &'static [ResultText] {
    static TABLE: OnceLock<Vec<ResultText>> = OnceLock::new();
    TABLE.get_or_init(|| {
        KNOWN_RESULTS
            .iter()
            .filter_map(|(code, name, text)| {
                Some(ResultText {
                    code: *code,
                    name: CString::new(*name).ok()?,
                    text: CString::new(*text).ok()?,
                })
            })
            .collect()
    })
}

fn answer(code: u32, out: *mut *const c_char, pick: fn(&ResultText) -> &CStr) -> Result<(), u32> {
    match table().iter().find(|e| e.code == code) {
        Some(entry) => write_out(out, pick(entry).as_ptr()),
        None => {
            write_out(out, std::ptr::null())?;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

pub(crate) fn get_error_name(code: u32, out: *mut *const c_char) -> Result<(), u32> {
    answer(code, out, |e| &e.name)
}

pub(crate) fn get_error_string(code: u32, out: *mut *const c_char) -> Result<(), u32> {
    answer(code, out, |e| &e.text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exports::{cuGetErrorName, cuGetErrorString};
    use rgpu_proto::cuda_result::*;

    fn read(f: extern "C" fn(u32, *mut *const c_char) -> u32, code: u32) -> (u32, Option<String>) {
        let mut out: *const c_char = c"sentinel".as_ptr();
        let rc = f(code, &mut out);
        let text = (!out.is_null()).then(|| {
            // SAFETY: a non-NULL answer is a static NUL-terminated string.
            unsafe { CStr::from_ptr(out) }
                .to_string_lossy()
                .into_owned()
        });
        (rc, text)
    }

    #[test]
    fn known_codes_have_names_and_strings() {
        assert_eq!(
            read(cuGetErrorName, CUDA_ERROR_INVALID_VALUE),
            (CUDA_SUCCESS, Some("CUDA_ERROR_INVALID_VALUE".into()))
        );
        assert_eq!(
            read(cuGetErrorString, CUDA_ERROR_OUT_OF_MEMORY),
            (CUDA_SUCCESS, Some("out of memory".into()))
        );
        assert_eq!(
            read(cuGetErrorName, CUDA_SUCCESS),
            (CUDA_SUCCESS, Some("CUDA_SUCCESS".into()))
        );
    }

    #[test]
    fn unknown_codes_are_invalid_and_null() {
        assert_eq!(
            read(cuGetErrorName, 123_456),
            (CUDA_ERROR_INVALID_VALUE, None)
        );
        assert_eq!(
            read(cuGetErrorString, 123_456),
            (CUDA_ERROR_INVALID_VALUE, None)
        );
    }

    #[test]
    fn null_out_pointer_is_invalid() {
        assert_eq!(
            cuGetErrorName(CUDA_SUCCESS, std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}

//! A private temporary directory removed with everything in it on drop.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `/tmp/<prefix>.XXXXXX` with mode 0700 (`mkdtemp`).
    pub fn new(prefix: &str) -> io::Result<Self> {
        let base = std::env::temp_dir().join(format!("{prefix}.XXXXXX"));
        let template = CString::new(base.into_os_string().into_vec())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut bytes = template.into_bytes_with_nul();
        // SAFETY: `bytes` is a writable NUL-terminated template that outlives
        // the call; mkdtemp only rewrites the trailing XXXXXX in place.
        let ret = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if ret.is_null() {
            return Err(io::Error::last_os_error());
        }
        bytes.pop();
        Ok(Self {
            path: PathBuf::from(OsString::from_vec(bytes)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

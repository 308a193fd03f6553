//! Context-independent code: `CUlibrary` and `CUkernel` (CUDA 12+), what
//! NVIDIA's runtimes load fatbins with.
//!
//! A library keeps a copy of its image and loads it as a module in a context
//! the first time it is used there (lazy loading, NVIDIA's default). A
//! kernel names a function by library and name; it resolves to that
//! context's function, so a `CUkernel` passed where a `CUfunction` is
//! expected (`cuLaunchKernel`, as the runtimes do) launches in the context of
//! the stream.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::{Arc, Mutex};

use rgpu_proto::cuda_result::*;

use crate::abi::{c_str, write_optional, write_out, CUdevice, CUdeviceptr, CUfunction, CUmodule};
use crate::api::module::{
    self, eager_loading, function_attribute, load_image, module_function, module_global,
    param_info, set_function_attribute,
};
use crate::image::image_bytes;
use crate::state::{
    current_or_none, driver, Context, Function, Module, Registry, FUNCTIONS, MODULES,
};

pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;

/// Largest file `cuLibraryLoadFromFile` reads.
const MAX_FILE_BYTES: u64 = crate::image::MAX_IMAGE_BYTES;

pub(crate) struct Library {
    image: Vec<u8>,
    /// The module of each context it was used in.
    modules: Mutex<Vec<Arc<Module>>>,
    /// Kernels handed out, by name (the same name gives the same handle).
    kernels: Mutex<HashMap<Vec<u8>, usize>>,
}

pub(crate) struct Kernel {
    library: Arc<Library>,
    name: CString,
    /// The function it resolved to in each context.
    functions: Mutex<Vec<Arc<Function>>>,
    /// `cuKernelSetAttribute` values: answered by `cuKernelGetAttribute`,
    /// and set in each context the kernel reaches.
    attributes: Mutex<HashMap<c_int, c_int>>,
}

pub(crate) static LIBRARIES: Registry<Library> = Registry::new();
pub(crate) static KERNELS: Registry<Kernel> = Registry::new();

fn lock<T>(mutex: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, u32> {
    mutex.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

impl Library {
    /// Its module in `ctx`, loaded there on first use.
    fn module_in(&self, ctx: &Arc<Context>) -> Result<Arc<Module>, u32> {
        let mut modules = lock(&self.modules)?;
        let session = ctx.ctx_id();
        if let Some(m) = modules
            .iter()
            .find(|m| Arc::ptr_eq(&m.context, ctx) && m.session == session)
        {
            return Ok(m.clone());
        }
        // Modules of ended contexts, or of an earlier session of this one.
        modules.retain(|m| m.context.is_alive() && m.context.ctx_id() == m.session);
        let module = load_image(ctx, &self.image)?;
        MODULES.insert(module.clone());
        modules.push(module.clone());
        Ok(module)
    }
}

impl Kernel {
    /// The function it names in `ctx`; a context it is new to gets the
    /// attributes set on the kernel so far.
    fn function_in(&self, ctx: &Arc<Context>) -> Result<Arc<Function>, u32> {
        let mut functions = lock(&self.functions)?;
        let session = ctx.ctx_id();
        if let Some(f) = functions
            .iter()
            .find(|f| Arc::ptr_eq(&f.context, ctx) && f.session == session)
        {
            return Ok(f.clone());
        }
        functions.retain(|f| f.context.is_alive() && f.context.ctx_id() == f.session);
        let module = self.library.module_in(ctx)?;
        let handle = module_function(&module, self.name.as_bytes())?;
        let function = FUNCTIONS.get(handle).ok_or(CUDA_ERROR_UNKNOWN)?;
        let attributes: Vec<(c_int, c_int)> = lock(&self.attributes)?
            .iter()
            .map(|(a, v)| (*a, *v))
            .collect();
        for (attribute, value) in attributes {
            set_function_attribute(&function, attribute, value)?;
        }
        functions.push(function.clone());
        Ok(function)
    }

    /// `cuKernelSetAttribute`: on the host for every context of `device`
    /// the kernel is loaded in (the current or primary context first, so a
    /// bad value fails now), and kept for the contexts it reaches later.
    pub(crate) fn set_attribute(
        &self,
        attribute: c_int,
        value: c_int,
        device: CUdevice,
    ) -> Result<(), u32> {
        if let Ok(ctx) = query_context(device) {
            if ctx.device == device {
                self.function_in(&ctx)?;
            }
        }
        let functions: Vec<Arc<Function>> = lock(&self.functions)?
            .iter()
            .filter(|f| f.context.is_alive() && f.context.device == device)
            .cloned()
            .collect();
        for f in &functions {
            set_function_attribute(f, attribute, value)?;
        }
        lock(&self.attributes)?.insert(attribute, value);
        Ok(())
    }
}

/// The function a `CUfunction` argument names: a function, or a kernel
/// resolved in `ctx`.
pub(crate) fn function_or_kernel(f: CUfunction, ctx: &Arc<Context>) -> Result<Arc<Function>, u32> {
    if let Some(function) = FUNCTIONS.get(f) {
        return Ok(function);
    }
    KERNELS
        .get(f)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .function_in(ctx)
}

/// The context a kernel query runs in: the current one, else the primary
/// context of `device` if it is active.
fn query_context(device: CUdevice) -> Result<Arc<Context>, u32> {
    if let Some(ctx) = current_or_none()? {
        return Ok(ctx);
    }
    let primary = driver()?.primary(device)?;
    let primary = primary.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    primary
        .context
        .clone()
        .filter(|c| c.is_alive())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

fn register(library: *mut CUlibrary, image: Vec<u8>) -> Result<(), u32> {
    let object = Arc::new(Library {
        image,
        modules: Mutex::new(Vec::new()),
        kernels: Mutex::new(HashMap::new()),
    });
    if eager_loading() {
        if let Some(ctx) = current_or_none()? {
            object.module_in(&ctx)?;
        }
    }
    write_out(library, LIBRARIES.insert(object))
}

/// JIT and library options are the host driver's business (the image is
/// always copied, so `CU_LIBRARY_BINARY_IS_PRESERVED` changes nothing).
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_data(
    library: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit_options: c_uint,
    _library_options: *mut c_int,
    _library_values: *mut *mut c_void,
    _num_library_options: c_uint,
) -> Result<(), u32> {
    if library.is_null() || code.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    // SAFETY: the API contract makes `code` a complete module image.
    let bytes = unsafe { image_bytes(code.cast()) }.map_err(|e| {
        log::error!("rgpu: library image rejected: {e}");
        CUDA_ERROR_INVALID_IMAGE
    })?;
    register(library, bytes.to_vec())
}

/// The file's bytes are the image (NUL-terminated, for PTX text).
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_from_file(
    library: *mut CUlibrary,
    file_name: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit_options: c_uint,
    _library_options: *mut c_int,
    _library_values: *mut *mut c_void,
    _num_library_options: c_uint,
) -> Result<(), u32> {
    if library.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let path = std::path::PathBuf::from(
        c_str(file_name)?
            .to_str()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
    );
    driver()?;
    let size = std::fs::metadata(&path)
        .map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let mut image = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    if image.is_empty() {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let binary = image.starts_with(&rgpu_proto::elf::MAGIC)
        || image.starts_with(&rgpu_proto::fatbin::FATBIN_MAGIC.to_le_bytes());
    if !binary && image.last() != Some(&0) {
        image.push(0);
    }
    register(library, image)
}

pub(crate) fn unload(library: CUlibrary) -> Result<(), u32> {
    driver()?;
    let object = LIBRARIES.remove(library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    KERNELS.retain(|k| !Arc::ptr_eq(&k.library, &object));
    let modules = std::mem::take(&mut *lock(&object.modules)?);
    let mut result = Ok(());
    for module in modules.iter().filter(|m| m.context.is_alive()) {
        // Already gone if the application unloaded the library's module.
        let handle = Arc::as_ptr(module) as CUmodule;
        if MODULES.get(handle).is_some() {
            if let Err(code) = module::unload(handle) {
                result = result.and(Err(code));
            }
        }
    }
    result
}

pub(crate) fn get_kernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> Result<(), u32> {
    if kernel.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = c_str(name)?.to_owned();
    driver()?;
    let object = LIBRARIES.get(library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let mut kernels = lock(&object.kernels)?;
    if let Some(k) = kernels.get(name.as_bytes()) {
        return write_out(kernel, *k as CUkernel);
    }
    let created = Arc::new(Kernel {
        library: object.clone(),
        name: name.clone(),
        functions: Mutex::new(Vec::new()),
        attributes: Mutex::new(HashMap::new()),
    });
    // With a context at hand, an unknown name fails here, as it does with
    // NVIDIA's driver; without one, at first use.
    if let Some(ctx) = current_or_none()? {
        created.function_in(&ctx)?;
    }
    let handle = KERNELS.insert(created);
    kernels.insert(name.into_bytes(), handle as usize);
    write_out(kernel, handle)
}

pub(crate) fn get_module(module: *mut CUmodule, library: CUlibrary) -> Result<(), u32> {
    if module.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = crate::state::current()?;
    let object = LIBRARIES.get(library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let loaded = object.module_in(&ctx)?;
    write_out(module, Arc::as_ptr(&loaded) as CUmodule)
}

pub(crate) fn get_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: *const c_char,
) -> Result<(), u32> {
    let name = c_str(name)?.to_bytes();
    let ctx = crate::state::current()?;
    let object = LIBRARIES.get(library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let module = object.module_in(&ctx)?;
    let (ptr, size) = module_global(&module, name)?;
    write_optional(dptr, ptr);
    write_optional(bytes, usize::try_from(size).unwrap_or(usize::MAX));
    Ok(())
}

pub(crate) fn kernel_get_function(function: *mut CUfunction, kernel: CUkernel) -> Result<(), u32> {
    if function.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = crate::state::current()?;
    let object = KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let f = object.function_in(&ctx)?;
    write_out(function, Arc::as_ptr(&f) as CUfunction)
}

pub(crate) fn kernel_get_library(library: *mut CUlibrary, kernel: CUkernel) -> Result<(), u32> {
    if library.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let object = KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    write_out(library, Arc::as_ptr(&object.library) as CUlibrary)
}

pub(crate) fn kernel_get_attribute(
    value: *mut c_int,
    attribute: c_int,
    kernel: CUkernel,
    device: CUdevice,
) -> Result<(), u32> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let object = KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(v) = lock(&object.attributes)?.get(&attribute) {
        return write_out(value, *v);
    }
    let f = object.function_in(&query_context(device)?)?;
    write_out(value, function_attribute(&f, attribute)?)
}

pub(crate) fn kernel_set_attribute(
    attribute: c_int,
    value: c_int,
    kernel: CUkernel,
    device: CUdevice,
) -> Result<(), u32> {
    driver()?.device(device)?;
    let object = KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    object.set_attribute(attribute, value, device)
}

/// A cache preference is a hint: accepted and ignored.
pub(crate) fn kernel_set_cache_config(
    kernel: CUkernel,
    _config: c_int,
    device: CUdevice,
) -> Result<(), u32> {
    driver()?.device(device)?;
    KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}

pub(crate) fn kernel_get_name(name: *mut *const c_char, kernel: CUkernel) -> Result<(), u32> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let object = KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // The name lives as long as the library is loaded.
    write_out(name, object.name.as_ptr())
}

pub(crate) fn kernel_get_param_info(
    kernel: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), u32> {
    driver()?;
    let object = KERNELS.get(kernel).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let f = object.function_in(&query_context(0)?)?;
    param_info(&f.info, index, offset, size)
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_int, c_void};

    use rgpu_proto::cuda_result::{CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};

    use crate::api::proc_address::resolve_implemented as resolve;
    use crate::exports;

    #[test]
    fn proc_address_resolves_the_library_api_here() {
        let expected: &[(&str, *const c_void)] = &[
            (
                "cuLibraryLoadData",
                exports::cuLibraryLoadData as *const c_void,
            ),
            (
                "cuLibraryLoadFromFile",
                exports::cuLibraryLoadFromFile as *const c_void,
            ),
            ("cuLibraryUnload", exports::cuLibraryUnload as *const c_void),
            (
                "cuLibraryGetKernel",
                exports::cuLibraryGetKernel as *const c_void,
            ),
            (
                "cuLibraryGetModule",
                exports::cuLibraryGetModule as *const c_void,
            ),
            (
                "cuLibraryGetGlobal",
                exports::cuLibraryGetGlobal as *const c_void,
            ),
            (
                "cuKernelGetFunction",
                exports::cuKernelGetFunction as *const c_void,
            ),
            (
                "cuKernelGetLibrary",
                exports::cuKernelGetLibrary as *const c_void,
            ),
            (
                "cuKernelGetAttribute",
                exports::cuKernelGetAttribute as *const c_void,
            ),
            (
                "cuKernelSetAttribute",
                exports::cuKernelSetAttribute as *const c_void,
            ),
            (
                "cuKernelSetCacheConfig",
                exports::cuKernelSetCacheConfig as *const c_void,
            ),
            ("cuKernelGetName", exports::cuKernelGetName as *const c_void),
            (
                "cuKernelGetParamInfo",
                exports::cuKernelGetParamInfo as *const c_void,
            ),
            (
                "cuFuncGetParamInfo",
                exports::cuFuncGetParamInfo as *const c_void,
            ),
            ("cuFuncGetName", exports::cuFuncGetName as *const c_void),
            (
                "cuModuleGetLoadingMode",
                exports::cuModuleGetLoadingMode as *const c_void,
            ),
            (
                "cuLaunchKernelEx",
                exports::cuLaunchKernelEx as *const c_void,
            ),
        ];
        for (name, address) in expected {
            assert_eq!(resolve(name, 12080, 0), *address, "{name}");
        }
        // The per-thread-default-stream flavour.
        assert_eq!(
            resolve("cuLaunchKernelEx", 12080, 2),
            exports::cuLaunchKernelEx_ptsz as *const c_void
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12080, 2),
            exports::cuLaunchKernel_ptsz as *const c_void
        );
    }

    #[test]
    fn calls_before_init_fail_cleanly() {
        // No cuInit in unit tests: every entry point answers, none panics.
        let mut library: *mut c_void = std::ptr::null_mut();
        let ptx = b".version 8.0\n.target sm_80\n\0";
        let rc = exports::cuLibraryLoadData(
            &mut library,
            ptx.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
        assert_eq!(rc, CUDA_ERROR_NOT_INITIALIZED);
        let mut name: *const std::ffi::c_char = std::ptr::null();
        assert_eq!(
            exports::cuKernelGetName(&mut name, std::ptr::null_mut()),
            CUDA_ERROR_NOT_INITIALIZED
        );
        let mut mode: c_int = 0;
        assert_eq!(exports::cuModuleGetLoadingMode(&mut mode), CUDA_SUCCESS);
        assert!(mode == 1 || mode == 2);
    }
}

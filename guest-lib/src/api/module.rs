//! Modules (PTX, cubin, fatbin shipped whole to the host, which picks SASS
//! or JITs), their functions (parameter layouts come back with the lookup,
//! cached per module and name) and globals.
//!
//! An image crosses to the host once per content: the guest first asks the
//! daemon to load the image it has cached under the image's SHA-256, and
//! sends the image only when the daemon does not have it.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::io::Read;
use std::sync::{Arc, Mutex};

use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::{decode_u64s, FunctionInfo};
use rgpu_proto::Command;
use sha2::{Digest, Sha256};

use crate::abi::{c_str, write_optional, write_out, CUdeviceptr, CUfunction, CUmodule};
use crate::image::image_bytes;
use crate::state::{current, driver, Context, Function, Module, FUNCTIONS, MODULES};

/// `CUfunction_attribute` numbers (cuda.h).
const FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
const FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
const FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: c_int = 9;
const FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: c_int = 11;
const FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: c_int = 13;
const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;
const FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: c_int = 15;
/// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`.
const DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;

/// `CU_MODULE_EAGER_LOADING`.
const CU_MODULE_EAGER_LOADING: c_int = 1;
/// `CU_MODULE_LAZY_LOADING`.
const CU_MODULE_LAZY_LOADING: c_int = 2;

/// Loads `bytes` (a whole image) in `ctx`, from the daemon's cache when it
/// has the image. The module is not registered yet.
pub(crate) fn load_image(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Arc<Module>, u32> {
    let hash: [u8; 32] = Sha256::digest(bytes).into();
    let mut handle = ctx.new_handle()?;
    let cached = ctx.with_channel(|c| {
        c.call(&Command::ModuleLoadCached {
            module: handle,
            hash,
        })
    })?;
    match cached.result {
        CUDA_SUCCESS => log::debug!(
            "rgpu: module {handle}: {}-byte image loaded from the daemon's cache",
            bytes.len()
        ),
        CUDA_ERROR_NOT_FOUND => {
            // A fresh handle: the old one stays unused whatever the host did.
            handle = ctx.new_handle()?;
            log::debug!(
                "rgpu: module {handle}: sending a {}-byte image",
                bytes.len()
            );
            let reply = ctx.with_channel(|c| {
                c.call_with_data(bytes, &|range| Command::ModuleLoadHashed {
                    module: handle,
                    hash,
                    image: range,
                })
            })?;
            if reply.result != CUDA_SUCCESS {
                return Err(reply.result);
            }
        }
        error => return Err(error),
    }
    Ok(Arc::new(Module {
        context: ctx.clone(),
        session: ctx.ctx_id(),
        handle,
        functions: Mutex::new(HashMap::new()),
    }))
}

fn load(module: *mut CUmodule, image: *const c_void) -> Result<(), u32> {
    if module.is_null() || image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current()?;
    // SAFETY: the API contract makes `image` a complete module image.
    let bytes = unsafe { image_bytes(image.cast()) }.map_err(|e| {
        log::error!("rgpu: module image rejected: {e}");
        CUDA_ERROR_INVALID_IMAGE
    })?;
    let object = load_image(&ctx, bytes)?;
    write_out(module, MODULES.insert(object))
}

/// `cuModuleLoad`: the image is the file's whole content (a cubin, a
/// fatbin or PTX text, which gets its NUL here). Triton's and Inductor's
/// launchers load their cubins by path.
pub(crate) fn load_file(module: *mut CUmodule, fname: *const c_char) -> Result<(), u32> {
    if module.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let path = c_str(fname)?
        .to_str()
        .map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    let ctx = current()?;
    let mut bytes = read_image_file(path)?;
    let binary = bytes.starts_with(&rgpu_proto::elf::MAGIC)
        || rgpu_proto::elf::le_u32(&bytes, 0) == Some(rgpu_proto::fatbin::FATBIN_MAGIC);
    if !binary {
        if bytes.contains(&0) {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        bytes.push(0);
    }
    let object = load_image(&ctx, &bytes)?;
    write_out(module, MODULES.insert(object))
}

/// The content of the image file at `path`, bounded like any image.
fn read_image_file(path: &str) -> Result<Vec<u8>, u32> {
    let file = std::fs::File::open(path).map_err(|e| {
        log::debug!("rgpu: cuModuleLoad {path}: {e}");
        CUDA_ERROR_FILE_NOT_FOUND
    })?;
    let mut bytes = Vec::new();
    let limit = crate::image::MAX_IMAGE_BYTES;
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| {
        log::debug!("rgpu: cuModuleLoad {path}: {e}");
        CUDA_ERROR_FILE_NOT_FOUND
    })?;
    if bytes.len() as u64 > limit {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    Ok(bytes)
}

pub(crate) fn load_data(module: *mut CUmodule, image: *const c_void) -> Result<(), u32> {
    load(module, image)
}

/// JIT options are the host driver's business; they are ignored here.
pub(crate) fn load_data_ex(
    module: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> Result<(), u32> {
    if num_options > 0 {
        log::debug!(
            "rgpu: cuModuleLoadDataEx: ignoring {num_options} JIT option(s) {options:?}/{values:?}"
        );
    }
    load(module, image)
}

pub(crate) fn load_fat_binary(module: *mut CUmodule, fat_cubin: *const c_void) -> Result<(), u32> {
    load(module, fat_cubin)
}

pub(crate) fn unload(module: CUmodule) -> Result<(), u32> {
    driver()?;
    let object = MODULES.remove(module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    FUNCTIONS.retain(|f| !(Arc::ptr_eq(&f.context, &object.context) && f.module == object.handle));
    // Whatever the host answers, the guest can no longer name the module.
    crate::device_ranges::forget_module(object.context.id, object.handle);
    object
        .context
        .call(&Command::ModuleUnload {
            module: object.handle,
        })
        .map(|_| ())
}

/// The function `name` of a module (looked up on the host once per name).
pub(crate) fn module_function(object: &Module, name: &[u8]) -> Result<CUfunction, u32> {
    let mut cache = object.functions.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if let Some(f) = cache.get(name) {
        return Ok(*f as CUfunction);
    }
    let ctx = &object.context;
    let handle = ctx.new_handle()?;
    let payload = ctx.call(&Command::ModuleGetFunction {
        module: object.handle,
        function: handle,
        name: name.to_vec(),
    })?;
    let info = FunctionInfo::decode(&payload).map_err(|e| {
        log::error!("rgpu: bad function reply: {e}");
        CUDA_ERROR_UNKNOWN
    })?;
    let function = FUNCTIONS.insert(Arc::new(Function {
        context: ctx.clone(),
        session: ctx.ctx_id(),
        module: object.handle,
        handle,
        name: CString::new(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
        info,
        attributes: Mutex::new(HashMap::new()),
        occupancy: Mutex::new(HashMap::new()),
    }));
    cache.insert(name.to_vec(), function as usize);
    Ok(function)
}

pub(crate) fn get_function(
    hfunc: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> Result<(), u32> {
    if hfunc.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = c_str(name)?.to_bytes();
    driver()?;
    let object = MODULES.get(module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    write_out(hfunc, module_function(&object, name)?)
}

/// `(device pointer, size)` of the global `name` of a module, which copies
/// and memsets may name from now on, until the module is unloaded.
pub(crate) fn module_global(object: &Module, name: &[u8]) -> Result<(u64, u64), u32> {
    let payload = object.context.call(&Command::ModuleGetGlobal {
        module: object.handle,
        name: name.to_vec(),
    })?;
    let [ptr, size] = decode_u64s::<2>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    crate::device_ranges::add_global(
        object.context.space,
        object.context.id,
        object.handle,
        ptr,
        size,
    );
    Ok((ptr, size))
}

pub(crate) fn get_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> Result<(), u32> {
    let name = c_str(name)?.to_bytes();
    driver()?;
    let object = MODULES.get(module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let (ptr, size) = module_global(&object, name)?;
    write_optional(dptr, ptr);
    write_optional(bytes, usize::try_from(size).unwrap_or(usize::MAX));
    Ok(())
}

/// A function attribute, asked of the host once (they never change).
pub(crate) fn function_attribute(f: &Function, attribute: c_int) -> Result<c_int, u32> {
    let mut cache = f.attributes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if let Some(v) = cache.get(&attribute) {
        return Ok(*v);
    }
    let payload = f.context.call(&Command::FuncGetAttribute {
        function: f.handle,
        attribute,
    })?;
    let bytes: [u8; 4] = payload
        .as_slice()
        .try_into()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let v = i32::from_le_bytes(bytes);
    cache.insert(attribute, v);
    Ok(v)
}

/// Checks what the guest can of a `cuFuncSetAttribute` (the attributes
/// cuda.h lets one set, and their ranges), so a bad value fails now rather
/// than at the next synchronising call.
fn check_settable(f: &Function, attribute: c_int, value: c_int) -> Result<(), u32> {
    let valid = match attribute {
        FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            let static_shared = function_attribute(f, FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
            let optin = crate::api::device::attribute(
                f.context.device,
                DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?;
            value >= 0 && i64::from(value) + i64::from(static_shared) <= i64::from(optin)
        }
        FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => (-1..=100).contains(&value),
        FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH..=FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH => value >= 0,
        FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => (0..=1).contains(&value),
        FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE => (0..=2).contains(&value),
        _ => false,
    };
    if valid {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Sets an attribute of a function on the host, without waiting (a later
/// launch needs it there), and updates what is cached about the function.
pub(crate) fn set_function_attribute(
    f: &Function,
    attribute: c_int,
    value: c_int,
) -> Result<(), u32> {
    check_settable(f, attribute, value)?;
    f.context.send(&Command::FuncSetAttribute {
        function: f.handle,
        attribute,
        value,
    })?;
    // The driver reads the dynamic shared-memory size back as set (and
    // `check_settable` checked it as the driver would); the other settable
    // attributes are asked again.
    let read_back = (attribute == FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).then_some(value);
    f.attribute_set(attribute, read_back);
    Ok(())
}

/// `CUfunc_cache`: PREFER_NONE, _SHARED, _L1 or _EQUAL.
pub(crate) fn check_cache_config(config: c_int) -> Result<(), u32> {
    if (0..=3).contains(&config) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// `CUsharedconfig`: DEFAULT, FOUR_BYTE or EIGHT_BYTE bank size.
pub(crate) fn check_shared_mem_config(config: c_int) -> Result<(), u32> {
    if (0..=2).contains(&config) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Offset and size of parameter `index` (`CUDA_ERROR_INVALID_VALUE` past
/// the last one).
pub(crate) fn param_info(
    info: &FunctionInfo,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), u32> {
    let slot = info.params.get(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_optional(offset, slot.offset as usize);
    write_optional(size, slot.size as usize);
    Ok(())
}

pub(crate) fn func_get_param_info(
    function: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), u32> {
    driver()?;
    let f = FUNCTIONS.get(function).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    param_info(&f.info, index, offset, size)
}

pub(crate) fn func_get_name(name: *mut *const c_char, function: CUfunction) -> Result<(), u32> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let f = FUNCTIONS.get(function).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // The name lives as long as the function is registered.
    write_out(name, f.name.as_ptr())
}

/// Whether libraries load their modules into the current context when they
/// are loaded (`CUDA_MODULE_LOADING=EAGER`) rather than on first use in each
/// context, NVIDIA's default since CUDA 12.2.
pub(crate) fn eager_loading() -> bool {
    std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"))
}

pub(crate) fn get_loading_mode(mode: *mut c_int) -> Result<(), u32> {
    let mode_value = if eager_loading() {
        CU_MODULE_EAGER_LOADING
    } else {
        CU_MODULE_LAZY_LOADING
    };
    write_out(mode, mode_value)
}

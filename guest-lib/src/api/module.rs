//! Modules (PTX, cubin, fatbin shipped whole to the host, which picks SASS
//! or JITs), their functions (parameter layouts come back with the lookup,
//! cached per module and name) and globals.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::{decode_u64s, FunctionInfo};
use rgpu_proto::Command;

use crate::abi::{c_str, write_optional, write_out, CUdeviceptr, CUfunction, CUmodule};
use crate::image::image_bytes;
use crate::state::{current, driver, Function, Module, FUNCTIONS, MODULES};

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
    let handle = ctx.new_handle()?;
    log::debug!(
        "rgpu: loading a {}-byte module image as module {handle}",
        bytes.len()
    );
    let reply = ctx.with_channel(|c| {
        c.call_with_data(bytes, &|range| Command::ModuleLoad {
            module: handle,
            image: range,
        })
    })?;
    if reply.result != CUDA_SUCCESS {
        return Err(reply.result);
    }
    let object = Arc::new(Module {
        context: ctx,
        handle,
        functions: Mutex::new(HashMap::new()),
    });
    write_out(module, MODULES.insert(object))
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
    object
        .context
        .call(&Command::ModuleUnload {
            module: object.handle,
        })
        .map(|_| ())
}

pub(crate) fn get_function(
    hfunc: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> Result<(), u32> {
    if hfunc.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = c_str(name)?.to_bytes().to_vec();
    driver()?;
    let object = MODULES.get(module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let mut cache = object.functions.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if let Some(f) = cache.get(&name) {
        return write_out(hfunc, *f as CUfunction);
    }
    let ctx = &object.context;
    let handle = ctx.new_handle()?;
    let payload = ctx.call(&Command::ModuleGetFunction {
        module: object.handle,
        function: handle,
        name: name.clone(),
    })?;
    let info = FunctionInfo::decode(&payload).map_err(|e| {
        log::error!("rgpu: bad function reply: {e}");
        CUDA_ERROR_UNKNOWN
    })?;
    let function = FUNCTIONS.insert(Arc::new(Function {
        context: ctx.clone(),
        module: object.handle,
        handle,
        info,
        attributes: Mutex::new(HashMap::new()),
    }));
    cache.insert(name, function as usize);
    write_out(hfunc, function)
}

pub(crate) fn get_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> Result<(), u32> {
    let name = c_str(name)?.to_bytes().to_vec();
    driver()?;
    let object = MODULES.get(module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let payload = object.context.call(&Command::ModuleGetGlobal {
        module: object.handle,
        name,
    })?;
    let [ptr, size] = decode_u64s::<2>(&payload).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_optional(dptr, ptr);
    write_optional(bytes, usize::try_from(size).unwrap_or(usize::MAX));
    Ok(())
}

pub(crate) fn func_get_attribute(
    value: *mut c_int,
    attribute: c_int,
    function: CUfunction,
) -> Result<(), u32> {
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?;
    let f = FUNCTIONS.get(function).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let mut cache = f.attributes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if let Some(v) = cache.get(&attribute) {
        return write_out(value, *v);
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
    write_out(value, v)
}

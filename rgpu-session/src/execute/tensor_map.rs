//! Tensor maps (TMA descriptors).

use super::*;

/// `TensorMapEncode`.
pub(super) fn tensor_map_encode(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::TensorMapEncode { spec } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    ctx.tensor_map_encode(spec).map(|map| map.to_vec())
}

/// `TensorMapReplaceAddress`.
pub(super) fn tensor_map_replace_address(
    env: &mut Env<'_>,
    command: &Command,
) -> CuResult<Vec<u8>> {
    let Command::TensorMapReplaceAddress { map, address } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    ctx.tensor_map_replace_address(map, *address)
        .map(|map| map.to_vec())
}

//! Context commands: synchronize, limits.

use super::*;

/// `CtxSynchronize`.
pub(super) fn ctx_synchronize(env: &mut Env<'_>, _command: &Command) -> CuResult<Vec<u8>> {
    let ctx = &mut *env.ctx;
    ctx.synchronize().map(empty)
}

/// `CtxGetLimit`.
pub(super) fn ctx_get_limit(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::CtxGetLimit { limit } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let ctx = &mut *env.ctx;
    ctx.get_limit(*limit).map(|v| u64_payload(&[v]))
}

/// `CtxSetLimit`.
pub(super) fn ctx_set_limit(env: &mut Env<'_>, command: &Command) -> CuResult<Vec<u8>> {
    let Command::CtxSetLimit { limit, value } = command else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let tenant = env.tenant;
    let executor = env.executor;
    let ctx = &mut *env.ctx;
    let counters = env.counters;
    // A heap or stack size takes device memory: past the
    // tenant's limit, the old size comes back.
    let before = ctx.get_limit(*limit).ok();
    ctx.set_limit(*limit, *value)?;
    if let Err(code) = tenant.account_driver_memory(Refresh::Strict, executor, counters) {
        if let Some(before) = before {
            let _ = ctx.set_limit(*limit, before);
        }
        let _ = tenant.account_driver_memory(Refresh::Settle, executor, counters);
        return Err(code);
    }
    Ok(Vec::new())
}

//! `RGPU_LOG=info|debug|trace` (trace: one line per CUDA call), initialised
//! once by the first entry point that runs.

use std::sync::Once;

static INIT: Once = Once::new();

pub(crate) fn init() {
    INIT.call_once(|| {
        let env = env_logger::Env::new().filter_or("RGPU_LOG", "warn");
        // The application may have installed a logger of its own: keep it.
        // Unit tests capture what they log (shown when one fails).
        let _ = env_logger::Builder::from_env(env)
            .is_test(cfg!(test))
            .try_init();
    });
}

//! A transport failure as the CUDA error the application sees (below the
//! state and the API modules: the pinned-memory registry needs it too).

use rgpu_proto::cuda_result::{
    CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN,
};
use rgpu_transport::CarrierError;

/// Maps a transport failure to a CUDA result (and says why in the log).
pub(crate) fn carrier_error(error: CarrierError) -> u32 {
    log::error!("rgpu: transport failure: {error}");
    match error {
        CarrierError::OutOfMemory(_) => CUDA_ERROR_OUT_OF_MEMORY,
        CarrierError::ContextLost(_) => CUDA_ERROR_CONTEXT_IS_DESTROYED,
        _ => CUDA_ERROR_UNKNOWN,
    }
}

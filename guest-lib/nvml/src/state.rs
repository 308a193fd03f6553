//! Process-wide NVML state: the reference count of `nvmlInit`, and the
//! connection to the host opened by the first `nvmlInit` and closed by the
//! last `nvmlShutdown`: a carrier of its own (as libcuda's is its own) and a
//! small channel whose session never creates a device context. Device
//! status goes through rgpu's libcuda instead when it is loaded in the
//! process with a session ([`crate::libcuda`]).
//!
//! Device handles are addresses inside [`HANDLES`]: stable across init and
//! shutdown (as NVIDIA's are), and checked against the device count.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rgpu_proto::capset::{Capset, DeviceInfo, MAX_DEVICES};
use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS};
use rgpu_proto::reply::DeviceStatus;
use rgpu_proto::Command;
use rgpu_transport::channel::ChannelConfig;
use rgpu_transport::{carrier, ContextChannel};

use crate::abi::*;
use crate::libcuda;

/// One byte per possible device: a handle is the address of its byte.
static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

/// The channel of NVML's session: tiny, as its commands and replies are.
const CHANNEL: ChannelConfig = ChannelConfig {
    ring_size: rgpu_proto::channel::MIN_RING_SIZE,
    reply_size: rgpu_proto::channel::MIN_REPLY_SIZE,
    bounce_size: 0,
    spin: Duration::from_micros(50),
    wake_spin: rgpu_transport::channel::DEFAULT_WAKE_SPIN,
    copy_threads: 1,
    wake_word: true,
};

/// An initialised NVML: the capset and the channel to the host.
pub(crate) struct Connection {
    capset: Capset,
    channel: ContextChannel,
}

impl Connection {
    fn open() -> Result<Self, u32> {
        let carrier = carrier::open_from_env().map_err(|e| {
            log::warn!("rgpu NVML: {e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        let capset = carrier.capset().clone();
        let config = ChannelConfig {
            spin: ChannelConfig::from_env().spin,
            ..CHANNEL
        };
        // A small ring locally; over the network, a connection like any
        // context's.
        let opened = ContextChannel::open_with_config(carrier, "nvml", config);
        let channel = opened.map_err(|e| {
            log::warn!("rgpu NVML: cannot open a channel to the host: {e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        log::debug!(
            "rgpu NVML: connected ({} device(s), executor {})",
            capset.devices.len(),
            capset.executor
        );
        Ok(Self { capset, channel })
    }

    pub fn capset(&self) -> &Capset {
        &self.capset
    }

    pub fn device_count(&self) -> usize {
        self.capset.devices.len().min(MAX_DEVICES)
    }

    /// The handle of device `index`.
    pub fn handle(&self, index: usize) -> Result<NvmlDevice, u32> {
        if index >= self.device_count() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let base: *const u8 = HANDLES.as_ptr();
        // Handles are only compared and turned back into indices, never
        // dereferenced: no provenance is needed.
        Ok(base.wrapping_add(index).cast::<c_void>().cast_mut())
    }

    /// The index of a handle this library gave out.
    pub fn index(&self, handle: NvmlDevice) -> Result<usize, u32> {
        let base = HANDLES.as_ptr() as usize;
        (handle as usize)
            .checked_sub(base)
            .filter(|i| *i < self.device_count())
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    }

    pub fn device(&self, handle: NvmlDevice) -> Result<(usize, &DeviceInfo), u32> {
        let index = self.index(handle)?;
        let info = self
            .capset
            .devices
            .get(index)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        Ok((index, info))
    }

    /// Asks the host for the live state of device `index`: through rgpu's
    /// libcuda when it has a session in this process (so that the sessions
    /// listed are this process's contexts), else on NVML's own channel.
    pub fn status(&self, index: usize) -> Result<DeviceStatus, u32> {
        let device = u32::try_from(index).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        let (result, payload) = match libcuda::device_status(device) {
            Some(answer) => answer,
            None => {
                let reply = self
                    .channel
                    .call(&Command::DeviceStatus { device })
                    .map_err(|e| {
                        log::error!("rgpu NVML: the host connection failed: {e}");
                        NVML_ERROR_GPU_IS_LOST
                    })?;
                (reply.result, reply.payload)
            }
        };
        match result {
            CUDA_SUCCESS => DeviceStatus::decode(&payload).map_err(|e| {
                log::error!("rgpu NVML: bad DeviceStatus reply: {e}");
                NVML_ERROR_UNKNOWN
            }),
            CUDA_ERROR_NOT_SUPPORTED => Err(NVML_ERROR_NOT_SUPPORTED),
            CUDA_ERROR_INVALID_DEVICE => Err(NVML_ERROR_INVALID_ARGUMENT),
            code => {
                log::warn!("rgpu NVML: DeviceStatus failed on the host with CUDA error {code}");
                Err(NVML_ERROR_UNKNOWN)
            }
        }
    }

    fn close(self) {
        if let Err(e) = self.channel.close() {
            log::debug!("rgpu NVML: closing the channel: {e}");
        }
    }
}

#[derive(Default)]
struct State {
    /// `nvmlInit` calls not yet matched by `nvmlShutdown`.
    references: u32,
    connection: Option<Arc<Connection>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    references: 0,
    connection: None,
});

fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `nvmlInit*`: the first call connects; later ones only count.
pub(crate) fn init(flags: u32) -> Result<(), u32> {
    let mut state = lock();
    if state.connection.is_none() {
        let connection = Connection::open()?;
        if connection.device_count() == 0 && flags & NVML_INIT_FLAG_NO_GPUS == 0 {
            connection.close();
            return Err(NVML_ERROR_DRIVER_NOT_LOADED);
        }
        state.connection = Some(Arc::new(connection));
        libcuda::lookup();
    }
    state.references = state.references.saturating_add(1);
    Ok(())
}

/// `nvmlShutdown`: the last one closes the connection.
pub(crate) fn shutdown() -> Result<(), u32> {
    let mut state = lock();
    if state.references == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    state.references -= 1;
    if state.references == 0 {
        if let Some(connection) = state.connection.take() {
            // A call still running on another thread keeps its reference;
            // the channel then goes with the last one.
            if let Ok(connection) = Arc::try_unwrap(connection) {
                connection.close();
            }
        }
    }
    Ok(())
}

/// The connection, or `NVML_ERROR_UNINITIALIZED` outside init/shutdown.
pub(crate) fn connection() -> Result<Arc<Connection>, u32> {
    lock().connection.clone().ok_or(NVML_ERROR_UNINITIALIZED)
}

//! The vhost-user side of the device: features, config space, queues, and
//! the epoll worker's events.

use std::io;

use log::{debug, error, info, warn};
use rgpu_proto::virtio_gpu::{
    GpuConfig, VIRTIO_GPU_F_CONTEXT_INIT, VIRTIO_GPU_F_RESOURCE_BLOB, VIRTIO_GPU_F_VIRGL,
};
use rgpu_session::AtomicGuestMemory;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::GpuBackend as VhostUserGpuSocket;
use vhost_user_backend::{VhostUserBackendMut, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::device::{DaemonShared, GpuDevice};
use super::response::{ReturnError, Vring};

pub const CONTROL_QUEUE: u16 = 0;
pub const CURSOR_QUEUE: u16 = 1;
pub const NUM_QUEUES: usize = 2;
pub const MAX_QUEUE_SIZE: usize = 1024;

/// How to attach this daemon to QEMU, for the error that explains why
/// `vhost-user-gpu-pci` does not work.
pub const QEMU_DEVICE_HINT: &str = "-device vhost-user-test-device-pci,chardev=CHR,virtio-id=16,\
num_vqs=2,vq_size=256,config_size=16";

/// The backend of one vhost-user connection.
pub struct GpuBackend {
    device: GpuDevice,
    event_idx: bool,
    exit: (EventConsumer, EventNotifier),
}

impl GpuBackend {
    pub fn new(shared: DaemonShared, memory: AtomicGuestMemory) -> io::Result<Self> {
        Ok(Self {
            device: GpuDevice::new(shared, memory),
            event_idx: false,
            exit: new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?,
        })
    }

    /// Ends every session of the connection (the frontend has gone).
    pub fn shutdown(&mut self) {
        self.device.shutdown();
    }

    pub fn device(&self) -> &GpuDevice {
        &self.device
    }

    /// Runs `process` over a queue. With EVENT_IDX the guest kicks only past
    /// the `avail_event` we publish when re-enabling notifications, so:
    /// process with notifications off, re-enable, and go round again if
    /// requests arrived in between, so none is missed.
    fn serve_queue(
        &mut self,
        vring: &Vring,
        process: fn(&mut GpuDevice, &Vring) -> Result<(), ReturnError>,
    ) -> io::Result<()> {
        // A queue the guest reset and has not made ready again holds
        // nothing to serve, though its avail index may still differ from
        // ours: going round on it would spin (and log) without end.
        if !queue_ready(vring) {
            return Ok(());
        }
        if !self.event_idx {
            return process(&mut self.device, vring).map_err(io::Error::other);
        }
        loop {
            if !queue_ready(vring) {
                return Ok(());
            }
            vring.disable_notification().map_err(io::Error::other)?;
            process(&mut self.device, vring).map_err(io::Error::other)?;
            if !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(());
            }
        }
    }
}

impl VhostUserBackendMut for GpuBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_GPU_F_VIRGL)
            | (1 << VIRTIO_GPU_F_RESOURCE_BLOB)
            | (1 << VIRTIO_GPU_F_CONTEXT_INIT)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // RESET_DEVICE: a guest driver reset (reboot, unbind) reaches us as
        // such, not only as stopped rings.
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::RESET_DEVICE
    }

    fn acked_features(&mut self, features: u64) {
        let missing = missing_gpu_features(features);
        if !missing.is_empty() {
            error!(
                "the frontend acknowledged the device without {}: the guest cannot create rgpu \
                 contexts. The VMM is hiding these features from the guest (QEMU's \
                 vhost-user-gpu-pci and cloud-hypervisor's generic vhost-user device do); attach \
                 with -device vhost-user-test-device-pci,chardev=CHR,virtio-id=16,num_vqs=2,\
                 vq_size=256,config_size=16 (QEMU 10.2+) instead",
                missing.join(", ")
            );
        }
    }

    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    fn reset_device(&mut self) {
        info!("device reset: ending every context");
        self.device.shutdown();
    }

    /// GET_VRING_BASE: the frontend stops the ring (a VM reset or stop, a
    /// guest reboot, a driver unbind). Contexts and resources do not survive
    /// the control queue's stop: the guest that starts it again creates
    /// them afresh, possibly with the same ids.
    fn stop_vring(&mut self, queue_index: u32) -> io::Result<()> {
        if queue_index == u32::from(CONTROL_QUEUE) {
            info!("control queue stopped: ending every context");
            self.device.shutdown();
        }
        Ok(())
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let config = GpuConfig {
            num_scanouts: 0,
            num_capsets: 1,
            ..GpuConfig::default()
        }
        .to_bytes();
        let start = offset as usize;
        // An empty answer tells the frontend the read failed.
        start
            .checked_add(size as usize)
            .and_then(|end| config.get(start..end))
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    fn set_config(&mut self, offset: u32, buf: &[u8]) -> io::Result<()> {
        // Only `events_clear` is writable, and no event is ever raised.
        debug!("config write of {} bytes at {offset} ignored", buf.len());
        Ok(())
    }

    fn update_memory(&mut self, memory: AtomicGuestMemory) -> io::Result<()> {
        self.device.set_memory(memory);
        Ok(())
    }

    fn set_gpu_socket(&mut self, _socket: VhostUserGpuSocket) -> io::Result<()> {
        error!(
            "this daemon was attached as QEMU's vhost-user-gpu-pci, which hides RESOURCE_BLOB \
             and CONTEXT_INIT from the guest; attach it with `{QEMU_DEVICE_HINT}` instead"
        );
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "vhost-user-gpu display socket refused: use vhost-user-test-device-pci",
        ))
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match (self.exit.0.try_clone(), self.exit.1.try_clone()) {
            (Ok(consumer), Ok(notifier)) => Some((consumer, notifier)),
            (Err(e), _) | (_, Err(e)) => {
                warn!("cannot clone the exit event: {e}");
                None
            }
        }
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        if !evset.contains(EventSet::IN) {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        match device_event {
            CONTROL_QUEUE => {
                let vring = vrings
                    .get(usize::from(CONTROL_QUEUE))
                    .ok_or_else(no_vring)?;
                self.serve_queue(vring, GpuDevice::process_control_queue)
            }
            CURSOR_QUEUE => {
                let vring = vrings.get(usize::from(CURSOR_QUEUE)).ok_or_else(no_vring)?;
                self.serve_queue(vring, GpuDevice::process_cursor_queue)
            }
            other => Err(io::Error::other(format!("unexpected device event {other}"))),
        }
    }
}

fn queue_ready(vring: &Vring) -> bool {
    vring.get_ref().get_queue().ready()
}

fn no_vring() -> io::Error {
    io::Error::other("vring missing")
}

/// The virtio-gpu features rgpu needs that `acked` lacks.
fn missing_gpu_features(acked: u64) -> Vec<&'static str> {
    [
        (VIRTIO_GPU_F_VIRGL, "VIRGL"),
        (VIRTIO_GPU_F_RESOURCE_BLOB, "RESOURCE_BLOB"),
        (VIRTIO_GPU_F_CONTEXT_INIT, "CONTEXT_INIT"),
    ]
    .into_iter()
    .filter(|(bit, _)| acked & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_gpu_features_a_frontend_left_out() {
        let all = (1 << VIRTIO_GPU_F_VIRGL)
            | (1 << VIRTIO_GPU_F_RESOURCE_BLOB)
            | (1 << VIRTIO_GPU_F_CONTEXT_INIT);
        assert!(missing_gpu_features(all).is_empty());
        assert_eq!(
            missing_gpu_features(1 << VIRTIO_GPU_F_VIRGL),
            vec!["RESOURCE_BLOB", "CONTEXT_INIT"]
        );
    }
}

// rgpu's probe of cloud-hypervisor's generic vhost-user device, without KVM:
// built as an example of cloud-hypervisor's virtio-devices crate by
// qemu-configs/cloud-hypervisor/build.sh (it is rgpu's code, not part of the
// patch). It creates the device exactly as the VMM does for
// `--generic-vhost-user socket=SOCKET,device_type=16,queue_sizes=[256,256]`,
// which connects to the backend and negotiates features, then prints the
// features the device would offer the guest and checks that a virtio-gpu
// backend's VIRGL, RESOURCE_BLOB and CONTEXT_INIT are among them.
//
//   cargo run -p virtio-devices --example rgpu_feature_probe -- SOCKET
//
// Exit 0 when all three are offered, 1 when one is missing, 2 on a usage or
// connection error.

use seccompiler::SeccompAction;
use virtio_devices::VirtioDevice;
use virtio_devices::vhost_user::GenericVhostUser;
use vmm_sys_util::eventfd::EventFd;

const VIRTIO_ID_GPU: u32 = 16;
const WANTED: [(&str, u32); 3] = [("VIRGL", 0), ("RESOURCE_BLOB", 3), ("CONTEXT_INIT", 4)];

fn main() {
    let Some(socket) = std::env::args().nth(1) else {
        eprintln!("usage: rgpu_feature_probe SOCKET");
        std::process::exit(2);
    };
    let exit_evt = match EventFd::new(0) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("rgpu_feature_probe: eventfd: {e}");
            std::process::exit(2);
        }
    };
    let device = match GenericVhostUser::new(
        "rgpu".to_owned(),
        &socket,
        vec![256, 256],
        VIRTIO_ID_GPU,
        None,
        SeccompAction::Allow,
        exit_evt,
        false,
        None,
    ) {
        Ok(device) => device,
        Err(e) => {
            eprintln!("rgpu_feature_probe: cannot create the device on {socket}: {e:?}");
            std::process::exit(2);
        }
    };
    let features = device.features();
    println!("rgpu_feature_probe: device type {}, features offered to the guest {features:#018x}", device.device_type());
    let mut missing = 0;
    for (name, bit) in WANTED {
        let offered = features & (1 << bit) != 0;
        println!("rgpu_feature_probe: {name} (bit {bit}) {}", if offered { "offered" } else { "MISSING" });
        if !offered {
            missing += 1;
        }
    }
    std::process::exit(if missing == 0 { 0 } else { 1 });
}

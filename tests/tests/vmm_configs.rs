//! The VMM examples in qemu-configs/ that no test can boot here (libvirt and
//! cloud-hypervisor need KVM, which nested virtualisation lacks) must at
//! least attach the device exactly as the QEMU script that the VM test does
//! boot: same device, same queues, shared guest memory.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("qemu-configs")
}

/// The `-device` argument of the QEMU script the VM test runs, as it prints
/// it (`PRINT=1`), with the shell quoting of commas removed.
fn qemu_script_device() -> String {
    let output = Command::new("bash")
        .arg(configs().join("qemu-vhost-user-test-device.sh"))
        .env("PRINT", "1")
        .env("RGPU_SOCKET", "/run/rgpu/rgpu.sock")
        .env("KERNEL", "/boot/vmlinuz")
        .output()
        .expect("run the QEMU script");
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8_lossy(&output.stdout).replace("\\,", ",");
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "-device")
        .expect("a -device argument");
    words
        .get(at + 1)
        .expect("the device after -device")
        .to_string()
}

#[test]
fn libvirt_domain_passes_the_same_device_and_shares_memory() {
    let device = qemu_script_device();
    assert!(
        device.starts_with("vhost-user-test-device-pci,chardev=rgpu,virtio-id=16,num_vqs=2,"),
        "{device}"
    );
    let xml = std::fs::read_to_string(configs().join("libvirt-domain.xml")).expect("read XML");
    assert!(
        xml.contains(&format!("<qemu:arg value='{device}'/>")),
        "libvirt-domain.xml does not pass {device}"
    );
    assert!(xml.contains("xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'"));
    assert!(xml.contains("<source type='memfd'/>") && xml.contains("<access mode='shared'/>"));
    // Well-formed, where xmllint is installed (tests/vm/setup-host.sh does not
    // need it; skip only this check without it).
    if let Ok(out) = Command::new("xmllint")
        .arg("--noout")
        .arg(configs().join("libvirt-domain.xml"))
        .output()
    {
        assert!(out.status.success(), "{out:?}");
    }
}

#[test]
fn cloud_hypervisor_script_uses_the_generic_device_with_shared_memory() {
    let script =
        std::fs::read_to_string(configs().join("cloud-hypervisor-rgpu.sh")).expect("read script");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(configs().join("cloud-hypervisor-rgpu.sh"))
        .status()
        .expect("bash -n");
    assert!(syntax.success());
    assert!(script.contains("--generic-vhost-user"));
    assert!(script.contains("=16,queue_sizes=[256,256]"));
    assert!(script.contains("shared=on"));
}

/// rgpu's cloud-hypervisor patch (qemu-configs/cloud-hypervisor/) is a
/// format-patch touching only the generic vhost-user device, with crosvm's
/// device-type mask and its own tests; its build script parses. Applying
/// and building it needs cloud-hypervisor's source, which CI cannot fetch:
/// guest-driver-notes/VMMS.md says what was run by hand.
#[test]
fn cloud_hypervisor_patch_is_in_upstreamable_form() {
    let dir = configs().join("cloud-hypervisor");
    let patch = std::fs::read_to_string(
        dir.join("0001-generic-vhost-user-offer-device-type-features.patch"),
    )
    .expect("read the patch");
    assert!(patch.starts_with("From "), "not a format-patch");
    assert!(patch.contains("Signed-off-by: "));
    let touched: Vec<&str> = patch
        .lines()
        .filter_map(|l| l.strip_prefix("diff --git a/"))
        .collect();
    assert_eq!(
        touched,
        ["virtio-devices/src/vhost_user/generic_vhost_user.rs b/virtio-devices/src/vhost_user/generic_vhost_user.rs"]
    );
    assert!(patch.contains("+const DEVICE_TYPE_FEATURES: u64 = 0xfffc_0000_00ff_ffff;"));
    assert!(patch.contains("+    fn device_type_features_of_the_backend_are_offered() {"));
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(dir.join("build.sh"))
        .status()
        .expect("bash -n");
    assert!(syntax.success());
}

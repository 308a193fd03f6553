//! NVML through the sim executor: the C program `nvml_test.c`, linked
//! against guest-lib's `libnvidia-ml.so.1`, runs through a real daemon; it
//! checks the protocol itself and prints every value it read, which must be
//! what the sim executor reports.

// A test fails by panicking: unwrap and expect are how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use rgpu_executor::sim::{
    SimExecutor, SIM_DEVICE_NAME, SIM_DRIVER_VERSION, SIM_DRIVER_VERSION_STRING,
    SIM_GPU_UTILIZATION, SIM_MEMORY_UTILIZATION, SIM_TOTAL_MEM,
};
use rgpu_executor::Executor;
use rgpu_proto::capset::device_attribute;
use rgpu_tests::{Daemon, GuestLib, GuestProcess};

const RUN_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn nvml_reports_what_the_sim_executor_reports() {
    let guest = GuestLib::new();
    let program = guest.build_c(
        &rgpu_tests::programs_dir().join("nvml_test.c"),
        &["-lnvidia-ml"],
    );
    let mut daemon = Daemon::start("sim");
    let outcome = GuestProcess::spawn(guest.command(&program, &daemon)).finish(RUN_TIMEOUT);
    outcome.assert_passed("nvml_test");
    let values: HashMap<&str, &str> = outcome
        .stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .collect();
    let value = |key: &str| {
        *values
            .get(key)
            .unwrap_or_else(|| panic!("nvml_test printed no {key}:\n{}", outcome.stdout))
    };

    let sim = SimExecutor::new().devices().remove(0);
    let attribute = |a: i32| sim.attribute(a).expect("the H200 attribute table has it");
    assert_eq!(value("count"), "1");
    assert_eq!(value("name"), SIM_DEVICE_NAME);
    assert_eq!(value("uuid"), sim.uuid_string());
    assert_eq!(value("index"), "0");
    assert_eq!(value("minor"), "0");
    // H200: compute capability 9.0.
    assert_eq!(
        value("compute_capability"),
        format!(
            "{}.{}",
            attribute(device_attribute::COMPUTE_CAPABILITY_MAJOR),
            attribute(device_attribute::COMPUTE_CAPABILITY_MINOR)
        )
    );
    assert_eq!(value("compute_capability"), "9.0");
    let (domain, bus, device) = (
        attribute(device_attribute::PCI_DOMAIN_ID),
        attribute(device_attribute::PCI_BUS_ID),
        attribute(device_attribute::PCI_DEVICE_ID),
    );
    assert_eq!(
        value("pci_bus_id"),
        format!("{domain:08X}:{bus:02X}:{device:02X}.0")
    );
    assert_eq!(
        value("pci_bus_id_legacy"),
        format!("{domain:04X}:{bus:02X}:{device:02X}.0")
    );
    assert_eq!(value("pci_location"), format!("{domain}:{bus}:{device}"));
    // Nothing else uses this daemon: all of the device's memory is free.
    assert_eq!(
        value("memory"),
        format!("{SIM_TOTAL_MEM}/{SIM_TOTAL_MEM}/0")
    );
    assert_eq!(
        value("memory_v2"),
        format!("{SIM_TOTAL_MEM}/0/{SIM_TOTAL_MEM}/0")
    );
    assert_eq!(
        value("utilization"),
        format!("{SIM_GPU_UTILIZATION}/{SIM_MEMORY_UTILIZATION}")
    );
    assert_eq!(value("driver_version"), SIM_DRIVER_VERSION_STRING);
    assert_eq!(
        value("nvml_version"),
        format!("{}.{SIM_DRIVER_VERSION_STRING}", SIM_DRIVER_VERSION / 1000)
    );
    assert_eq!(value("cuda_driver_version"), SIM_DRIVER_VERSION.to_string());
    assert_eq!(
        value("cuda_driver_version_v2"),
        SIM_DRIVER_VERSION.to_string()
    );
    assert_eq!(value("processes"), "0");
    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
}

/// NVML and libcuda in one process (local mode: NVML's own connection is a
/// tenant without contexts): the process is listed, with its memory, only
/// while it holds a CUDA context, because NVML asks through libcuda's
/// channel.
#[test]
fn nvml_lists_this_process_while_it_holds_a_cuda_context() {
    let guest = GuestLib::new();
    let program = guest.build_c(
        &rgpu_tests::programs_dir().join("nvml_processes_test.c"),
        &["-lcuda", "-lnvidia-ml"],
    );
    let mut daemon = Daemon::start("sim");
    let process = GuestProcess::spawn(guest.command(&program, &daemon));
    let pid = process.id();
    let outcome = process.finish(RUN_TIMEOUT);
    outcome.assert_passed("nvml_processes_test");
    assert!(
        outcome
            .stdout
            .lines()
            .any(|l| l == format!("self_pid={pid}")),
        "the program is not process {pid}:\n{}",
        outcome.stdout
    );
    // Both ways of asking (current context, primary context) listed this
    // pid with at least the 64 MiB allocation.
    for when in ["current", "primary"] {
        let line = outcome
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{when}: ")))
            .unwrap_or_else(|| panic!("no {when} line:\n{}", outcome.stdout));
        let fields: HashMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .collect();
        assert_eq!(fields.get("pid"), Some(&pid.to_string().as_str()), "{line}");
        let used: u64 = fields
            .get("used")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no used= in {line}"));
        assert!(used >= 64 << 20, "{line}");
    }
    assert!(daemon.is_alive(), "the daemon died:\n{}", daemon.log());
}

/// `nvidia-smi` in a guest (NVML alone, no context of its own) lists every
/// process of its tenant that holds a context, by the guest's pids, with
/// what each holds (the context's own memory included), and nothing of
/// another tenant; a process that ended is no longer listed.
#[test]
fn nvml_lists_every_process_of_the_tenant_and_no_other() {
    let guest = GuestLib::new();
    let holder = guest.build_program("memory_limit_test.c");
    let lister = guest.build_c(
        &rgpu_tests::programs_dir().join("nvml_list.c"),
        &["-lnvidia-ml"],
    );
    let config = "[[tenant]]\nname = \"a\"\nsocket = \"a.sock\"\n\n\
                  [[tenant]]\nname = \"b\"\nsocket = \"b.sock\"\n";
    let overhead = (8u64 << 20).to_string();
    let daemon = Daemon::start_with_config(
        "sim",
        config,
        &[],
        &[("RGPU_SIM_CONTEXT_OVERHEAD", &overhead)],
    );
    let socket = |name: &str| daemon.dir().join(name);
    let release = daemon.dir().join("release");
    let hold = |mb: &str| {
        let mut command = guest.command(&holder, &daemon);
        command.env("RGPU_SOCKET", socket("a.sock")).args([
            "--max-mb",
            mb,
            "--hold-file",
            &release.to_string_lossy(),
        ]);
        let mut process = GuestProcess::spawn(command);
        process.wait_for_line("holding", RUN_TIMEOUT);
        process
    };
    let list = |tenant: &str| -> Vec<(u32, u64)> {
        let mut command = guest.command(&lister, &daemon);
        command.env("RGPU_SOCKET", socket(tenant));
        let outcome = GuestProcess::spawn(command).finish(RUN_TIMEOUT);
        assert!(
            outcome.status.success(),
            "nvml_list failed:\n{}\n{}",
            outcome.stdout,
            outcome.stderr
        );
        outcome
            .stdout
            .lines()
            .filter_map(|l| {
                let (pid, used) = l.strip_prefix("pid=")?.split_once(" used=")?;
                Some((pid.parse().ok()?, used.parse().ok()?))
            })
            .collect()
    };

    let first = hold("32");
    let second = hold("64");
    let mut listed = list("a.sock");
    listed.sort_unstable();
    let mut expected = vec![(first.id(), 40u64 << 20), (second.id(), 72u64 << 20)];
    expected.sort_unstable();
    assert_eq!(listed, expected, "tenant a's list");
    assert!(
        list("b.sock").is_empty(),
        "tenant b sees tenant a's processes"
    );

    std::fs::write(&release, b"").unwrap();
    first.finish(RUN_TIMEOUT);
    second.finish(RUN_TIMEOUT);
    daemon.wait_until_idle(Duration::from_secs(15));
    assert!(list("a.sock").is_empty(), "processes that ended are listed");
}

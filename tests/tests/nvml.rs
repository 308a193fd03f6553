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
        format!("{}.{}", attribute(75), attribute(76))
    );
    assert_eq!(value("compute_capability"), "9.0");
    let (domain, bus, device) = (attribute(50), attribute(33), attribute(34));
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

//! CUDA graphs built node by node through a sim daemon (issue 10): memset,
//! kernel, device-to-device memcpy, event record, empty and child graph
//! nodes with their dependencies, instantiated, launched, cloned; kernel
//! and memset node parameters read back and set in graphs and executable
//! graphs, executable graphs updated from graphs (and refused an update
//! from another topology or node type), uploaded, dependencies read back;
//! event nodes given other events, a child graph node of an executable
//! graph another child, nodes of an executable graph disabled and enabled,
//! kernel node attributes set, read back and copied;
//! a memory-allocation node's memory filled, copied out and freed by the
//! graph's nodes;
//! a node of another graph as a dependency, a destroyed graph, a
//! host-memory copy, a set on a node of another kind or graph and a
//! memset node set to memory of no allocation are refused, and a kernel
//! node whose pointer argument is no memory of the process fails its
//! launch as a forged-pointer launch does (tests/programs/graph_api_test.c).

use std::time::Duration;

use rgpu_tests::{Daemon, GuestLib, GuestProcess};

#[test]
fn graphs_built_node_by_node_run_on_the_host_and_are_checked() {
    let guest = GuestLib::new();
    let program = guest.build_program("graph_api_test.c");
    let mut daemon = Daemon::start("sim");
    let mut command = guest.command(&program, &daemon);
    command.arg("--ptx").arg(rgpu_tests::reference_ptx());
    let outcome = GuestProcess::spawn(command).finish(Duration::from_secs(120));
    print!("{}", outcome.stdout);
    outcome.assert_passed("graph_api_test");
    // The dependency on another graph's node is the daemon's refusal.
    let log = daemon.log();
    assert!(
        log.contains("depends on a node that is none of that graph's"),
        "{log}"
    );
    // The memset node set to memory of no allocation, the free node of
    // memory that is no graph allocation: the daemon's refusals.
    assert!(log.contains("a memset node names device memory"), "{log}");
    assert!(
        log.contains("which is no graph allocation of this session"),
        "{log}"
    );
    // Host nodes ran through their gates, and event attributes of a
    // kernel node are refused as the driver refuses them: nothing was
    // refused as not supported.
    assert!(
        !outcome.stderr.contains("not supported"),
        "{}",
        outcome.stderr
    );
    assert!(daemon.is_alive());
    // Every allocation, graph allocations too, went back with the process.
    let after = daemon.wait_until_idle(Duration::from_secs(20));
    assert_eq!(after.get("device_memory_bytes"), 0, "{after:?}");
}

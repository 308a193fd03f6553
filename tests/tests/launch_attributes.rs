//! cuLaunchKernelEx's launch attributes through a sim daemon (issue 10):
//! every attribute the driver accepts reaches the executor instead of being
//! dropped, events named by attributes are recorded and answer queries, and
//! an access window over memory the process does not own, an event pointer
//! that is no event, and a graph node's attribute are refused
//! (tests/programs/launch_attributes_test.c).

use std::time::Duration;

use rgpu_tests::{Daemon, GuestLib, GuestProcess};

#[test]
fn launch_attributes_reach_the_host_and_are_checked() {
    let guest = GuestLib::new();
    let program = guest.build_program("launch_attributes_test.c");
    let mut daemon = Daemon::start("sim");
    let mut command = guest.command(&program, &daemon);
    command.arg("--ptx").arg(rgpu_tests::reference_ptx());
    let outcome = GuestProcess::spawn(command).finish(Duration::from_secs(120));
    outcome.assert_passed("launch_attributes_test");
    for name in [
        "priority",
        "memory sync domain",
        "cluster scheduling policy",
        "programmatic stream serialization",
        "shared memory carveout",
    ] {
        assert!(
            outcome
                .stdout
                .lines()
                .any(|l| l == format!("{name}: rc 0 CUDA_SUCCESS")),
            "{name}:\n{}",
            outcome.stdout
        );
    }
    // A node's attribute on a launch is refused as the driver refuses it,
    // not as unsupported.
    assert!(
        !outcome.stderr.contains("not supported"),
        "{}",
        outcome.stderr
    );
    // The refusals are the daemon's, said once each in its log.
    let log = daemon.log();
    assert!(
        log.contains("an access policy window names device memory"),
        "{log}"
    );
    assert!(daemon.is_alive());
}

#!/usr/bin/env bash
# The one test command (CI runs it through .ci/run): checks formatting and
# the workspace's lints (clippy, warnings denied; rustdoc's through a
# documentation build), builds the whole
# workspace, so that the daemon binary and guest-lib's libcuda.so exist for
# the end-to-end tests, runs every test, then builds the Debian packages and
# checks them. Fails on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# The end-to-end tests compile C programs.
if ! command -v cc >/dev/null; then
    echo "tests/run.sh: no C compiler; installing gcc"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev
fi

# The VM-mode test boots QEMU 11.1 from a Debian 13 chroot: install it (once;
# reruns take a second). Its test fails, never skips, when this is missing.
bash tests/vm/setup-host.sh

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo doc --workspace --no-deps --quiet
cargo build --workspace
cargo test --workspace

# The Debian packages build, hold what they must, and their units start the
# daemon (issue 12).
bash scripts/package.sh target/packages
RGPU_SIM_DAEMON=target/debug/vhost-device-rgpu bash tests/packaging/check-packages.sh target/packages

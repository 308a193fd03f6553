#!/usr/bin/env bash
# Builds one revision's daemon and guest library (release) for an A/B of
# two builds (issue 9): sim_ab.sh on the sim executor, make-bundle.sh with
# RGPU_AB_OLD for the GPU host.
#
#   build_ref.sh REF OUT_DIR TARGET_DIR [CARGO_ARGS...]
#
# REF is checked out in a temporary worktree (empty: the working tree as
# it is); the build goes to TARGET_DIR, kept for the next run, with
# CARGO_ARGS added (features); vhost-device-rgpu and libcuda.so.1 are
# copied into OUT_DIR.
set -euo pipefail
ref=${1?usage: build_ref.sh REF OUT_DIR TARGET_DIR [CARGO_ARGS...]}
out=${2:?usage: build_ref.sh REF OUT_DIR TARGET_DIR [CARGO_ARGS...]}
target=${3:?usage: build_ref.sh REF OUT_DIR TARGET_DIR [CARGO_ARGS...]}
shift 3
repo=$(cd "$(dirname "$0")/../.." && pwd)
tree=$repo
if [ -n "$ref" ]; then
    tree=$target.tree
    git -C "$repo" worktree remove --force "$tree" 2>/dev/null || true
    git -C "$repo" worktree add --force --detach "$tree" "$ref" >/dev/null 2>&1
    trap 'git -C "$repo" worktree remove --force "$tree"' EXIT
fi
(cd "$tree" && cargo build --quiet --release -p vhost-device-rgpu -p guest-lib "$@" --target-dir "$target")
mkdir -p "$out"
cp "$target/release/vhost-device-rgpu" "$out/"
cp "$target/release/libcuda.so" "$out/libcuda.so.1"

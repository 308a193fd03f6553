# Sourced by the benchmarks that call the driver from one CPU on both
# sides (perf_bench.sh, thread_cpu_time.sh, check-all.sh part 7):
# PINNED_CPUS=K,M (default 2,0) gives driver_cpu=K (rgpu's launch thread
# and the native side), caller_cpu=M (rgpu's caller) and others, every
# other CPU of the machine, comma-separated (the daemon's).
# shellcheck shell=bash disable=SC2034 # the sourcing script reads them
IFS=, read -r driver_cpu caller_cpu <<<"${PINNED_CPUS:-2,0}"
others=$(seq 0 $(($(nproc) - 1)) | grep -vxE "$driver_cpu|$caller_cpu" | paste -sd,)

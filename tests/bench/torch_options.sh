#!/usr/bin/env bash
# Which daemon placement or option explains PyTorch's slow single runs
# through rgpu (issue 9: some rgpu runs of torch_train.py reached 0.7-0.85
# of the native run beside them, others matched it), on the GPU host:
#
#   torch_options.sh BUNDLE [ROUNDS] [LABEL:APP_CPUS:DAEMON_CPUS:DAEMON_ARGS[:native] ...]
#
# Starts one daemon per layout (under `taskset -c DAEMON_CPUS` when given,
# with DAEMON_ARGS), then ROUNDS times (default 3) runs, for each layout in
# turn, torch_train.py natively and through that layout's daemon, both
# under `taskset -c APP_CPUS` when given. Prints every pair (steps per
# second, loss, slowest and fastest window) and, per layout, the ratios and
# their median. Default layouts: nothing pinned; trainer on CPUs 0-7 and
# daemon on 8-15; --host-spin-us 10; --launch-thread off. A daemon given
# --profile-launches has its profile lines printed at the end. BUNDLE is a
# folder from tests/gpu/make-bundle.sh; logs go to $OUT when set;
# RGPU_EXECUTOR picks the daemons' executor (default cuda).
set -uo pipefail
bundle=$(cd "${1:?usage: torch_options.sh BUNDLE [ROUNDS] [LAYOUT ...]}" && pwd)
rounds=${2:-3}
shift $(($# < 2 ? $# : 2))
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(default::: apart:0-7:8-15: "spin10:::--host-spin-us 10"
    "no-launch-thread:::--launch-thread off")
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
work=$(mktemp -d /tmp/rgpu-torch-options.XXXXXX)
logs=${OUT:-$work}
daemons=()
stop_daemons() {
    for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap stop_daemons EXIT
mkdir -p "$work/lib" "$logs"
ln -s "$bundle/libcuda.so" "$work/lib/libcuda.so.1"
ln -s "$bundle/libnvidia_ml.so" "$work/lib/libnvidia-ml.so.1"

# taskset's words for CPUS, none when empty.
pinned() { [ -n "$1" ] && printf '%s\n' taskset -c "$1"; }

for layout in "${layouts[@]}"; do
    IFS=: read -r label _ daemon_cpus daemon_args build <<<"$layout"
    [ "$build" = native ] && continue
    # shellcheck disable=SC2046,SC2086 # taskset's and the options' words
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" $(pinned "$daemon_cpus") \
        "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$work/$label.sock" \
        $daemon_args >"$logs/daemon-$label.log" 2>&1 &
    daemons+=($!)
done
for layout in "${layouts[@]}"; do
    label=${layout%%:*}
    [ "${layout##*:}" = native ] && continue
    for _ in $(seq 600); do [ -S "$work/$label.sock" ] && continue 2; sleep 0.05; done
    echo "FAIL daemon $label (see $logs/daemon-$label.log)"
    exit 1
done

declare -A ratios
for round in $(seq "$rounds"); do
    for layout in "${layouts[@]}"; do
        IFS=: read -r label app_cpus _ _ build <<<"$layout"
        second_lib=$work/lib
        [ "$build" = native ] && second_lib=$native_dir
        # shellcheck disable=SC2046
        n=$(env LD_LIBRARY_PATH="$native_dir" $(pinned "$app_cpus") python3 "$bundle/torch_train.py" \
            2>>"$logs/torch-native.err")
        # shellcheck disable=SC2046
        r=$(env RGPU_SOCKET="$work/$label.sock" LD_LIBRARY_PATH="$second_lib" $(pinned "$app_cpus") \
            python3 "$bundle/torch_train.py" 2>>"$logs/torch-$label.err")
        ratio=$(awk -v n="$n" -v r="$r" 'BEGIN { split(n, a, " "); split(r, b, " ");
            if (a[2] > 0) printf "%.3f", b[2] / a[2]; else printf "-" }')
        ratios[$label]="${ratios[$label]:-} $ratio"
        echo "round $round $label: native ${n#steps_per_s } | second ${r#steps_per_s } | ratio $ratio"
    done
done
for layout in "${layouts[@]}"; do
    label=${layout%%:*}
    # shellcheck disable=SC2086 # the ratios are words
    printf '%s\n' ${ratios[$label]} | sort -n | awk -v label="$label" '{ r[NR] = $1; all = all " " $1 }
        END { printf "%s: median %s (ratios%s)\n", label, r[int((NR + 1) / 2)], all }'
done
# A daemon started with --profile-launches logs, as each run's process
# ends, where its sessions' and launch threads' time went.
for layout in "${layouts[@]}"; do
    label=${layout%%:*}
    [ -f "$logs/daemon-$label.log" ] || continue
    grep -oE '(ctx [0-9]+: profile|launch thread): .*' "$logs/daemon-$label.log" | sed "s/^/profile $label: /"
done

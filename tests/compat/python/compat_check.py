"""The small harness both Python checks share: each check prints
"NAME PASS" or "NAME FAIL" on stdout (a traceback on stderr), and finish()
prints "PROGRAM: N passed, N failed" and gives the exit status. Stdout holds
only machine-independent text; run-compat.sh compares it with
expected/PROGRAM.out."""

import sys
import traceback

_counts = {"passed": 0, "failed": 0}


def check(name, fn):
    try:
        ok = bool(fn())
    except Exception:  # noqa: BLE001 - any failure of the library under test is a FAIL
        traceback.print_exc()
        ok = False
    print(f"{name} {'PASS' if ok else 'FAIL'}", flush=True)
    _counts["passed" if ok else "failed"] += 1
    return ok


def loaded_libcuda():
    """The libcuda.so.1 this process mapped (for the log, on stderr)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "libcuda.so" in line}
    except OSError:
        return "unknown"
    return ", ".join(sorted(paths)) or "none"


def finish(program):
    print(f"libcuda mapped: {loaded_libcuda()}", file=sys.stderr)
    print(f"{program}: {_counts['passed']} passed, {_counts['failed']} failed", flush=True)
    return 0 if _counts["failed"] == 0 else 1

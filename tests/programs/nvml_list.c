/* nvml_list: what `nvidia-smi` shows of the running processes, through
 * NVML alone (no CUDA context of its own).
 *
 * Prints "self_pid=P", "processes N", then "pid=P used=BYTES" per process
 * (nvmlDeviceGetComputeRunningProcesses_v3 on device 0). With --hold FILE,
 * then prints "holding" and waits for FILE to exist (so the host can be
 * looked at while this process is alive). Exit 0, 1 on an NVML error. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rgpu_nvml.h"
#include "wait_for_file.h"

int main(int argc, char **argv) {
    nvmlDevice_t device;
    nvmlProcessInfo_t infos[64];
    unsigned int count = 64;
    printf("self_pid=%d\n", (int)getpid());
    if (nvmlInit_v2() != 0 || nvmlDeviceGetHandleByIndex_v2(0, &device) != 0) {
        printf("FAIL: nvmlInit_v2 and nvmlDeviceGetHandleByIndex_v2(0)\n");
        return 1;
    }
    nvmlReturn_t rc = nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos);
    if (rc != 0) {
        printf("FAIL: nvmlDeviceGetComputeRunningProcesses_v3: %d\n", rc);
        return 1;
    }
    printf("processes %u\n", count);
    for (unsigned int i = 0; i < count; i++)
        printf("pid=%u used=%llu\n", infos[i].pid, infos[i].usedGpuMemory);
    if (argc == 3 && !strcmp(argv[1], "--hold")) {
        printf("holding\n");
        fflush(stdout);
        wait_for_file(argv[2], 100000L);
    }
    nvmlShutdown();
    return 0;
}

/* nvml_list: what `nvidia-smi` shows of the running processes, through
 * NVML alone (no CUDA context of its own).
 *
 * Prints "self_pid=P", "processes N", then "pid=P used=BYTES" per process
 * (nvmlDeviceGetComputeRunningProcesses_v3 on device 0). Exit 0, 1 on an
 * NVML error. */
#include <stdio.h>
#include <unistd.h>

#include "rgpu_nvml.h"

int main(void) {
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
    nvmlShutdown();
    return 0;
}

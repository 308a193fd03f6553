/* nvml_list: what `nvidia-smi` shows of the running processes, through
 * NVML alone (no CUDA context of its own).
 *
 * Prints "self_pid=P", "processes N", then "pid=P used=BYTES" per process
 * (nvmlDeviceGetComputeRunningProcesses_v3 on device 0). Exit 0, 1 on an
 * NVML error. NVML declarations written from NVIDIA's public NVML API
 * reference (no nvml.h on CI). */
#include <stdio.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos);

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

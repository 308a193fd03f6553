/* nvml_processes_test: rgpu's NVML and libcuda in one process.
 *
 * nvmlDeviceGetComputeRunningProcesses must list this process while it holds
 * a CUDA context with device memory, and nothing while it holds none. In
 * local mode NVML's own connection is a tenant without contexts, so this
 * checks that NVML asks through libcuda's channel (rgpu_device_status).
 * Prints "self_pid=", "pid=" and "used=" lines and ends with
 * "nvml_processes_test: N checks passed" (exit 0) or its failures (exit 1).
 *
 * The NVML declarations are written for rgpu from NVIDIA's public NVML API
 * reference (no nvml.h on CI). */
#include <stdio.h>
#include <unistd.h>

#include "rgpu_cuda.h"
#include "checks.h"

#include "rgpu_nvml.h"

#define ALLOCATION ((size_t)64 << 20)

/* The number of processes NVML lists for `device` (-1 on an error). */
static int process_count(nvmlDevice_t device) {
    nvmlProcessInfo_t infos[4];
    unsigned int count = 4;
    nvmlReturn_t rc = nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos);
    CHECK_EQ_INT(rc, 0);
    return rc == 0 ? (int)count : -1;
}

/* With the context and its allocation: exactly this process, holding at
 * least the allocation. */
static void expect_self(nvmlDevice_t device, const char *when) {
    nvmlProcessInfo_t infos[4];
    unsigned int count = 4;
    CHECK_EQ_INT(nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos), 0);
    CHECK_EQ_INT(count, 1);
    if (count >= 1) {
        CHECK_EQ_INT(infos[0].pid, getpid());
        CHECK_TRUE(infos[0].usedGpuMemory >= ALLOCATION);
        printf("%s: pid=%u used=%llu\n", when, infos[0].pid, infos[0].usedGpuMemory);
    }
    nvmlProcessInfo_v1_t v1[2];
    count = 2;
    CHECK_EQ_INT(nvmlDeviceGetComputeRunningProcesses(device, &count, v1), 0);
    CHECK_EQ_INT(count, 1);
    if (count >= 1) {
        CHECK_EQ_INT(v1[0].pid, getpid());
        CHECK_TRUE(v1[0].usedGpuMemory >= ALLOCATION);
    }
}

static int run(void) {
    nvmlDevice_t device;
    if (nvmlInit_v2() != 0 || nvmlDeviceGetHandleByIndex_v2(0, &device) != 0) {
        fail(__LINE__, "nvmlInit_v2 and nvmlDeviceGetHandleByIndex_v2(0)");
        return -1;
    }
    printf("self_pid=%d\n", (int)getpid());

    /* libcuda loaded but not initialised, then initialised without a
     * context: nothing of this process runs on the GPU. */
    CHECK_EQ_INT(process_count(device), 0);
    REQUIRE_CU(cuInit(0));
    CUdevice dev;
    REQUIRE_CU(cuDeviceGet(&dev, 0));
    CHECK_EQ_INT(process_count(device), 0);

    CUcontext ctx;
    REQUIRE_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    CUdeviceptr ptr;
    REQUIRE_CU(cuMemAlloc(&ptr, ALLOCATION));
    expect_self(device, "current");

    /* No current context on this thread: the active primary context's
     * channel answers. */
    REQUIRE_CU(cuCtxSetCurrent(NULL));
    expect_self(device, "primary");

    /* Context released: its session is gone, and so is the process. */
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    CHECK_CU(cuMemFree(ptr));
    CHECK_CU(cuDevicePrimaryCtxRelease(dev));
    CHECK_EQ_INT(process_count(device), 0);

    CHECK_EQ_INT(nvmlShutdown(), 0);
    return 0;
}

int main(void) {
    run();
    if (checks_failed) {
        printf("nvml_processes_test: %ld checks FAILED, %ld passed\n", checks_failed,
               checks_passed);
        return 1;
    }
    printf("nvml_processes_test: %ld checks passed\n", checks_passed);
    return 0;
}

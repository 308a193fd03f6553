/* nvml_test: exercises rgpu's libnvidia-ml.so.1 through a daemon.
 *
 * Checks the protocol by itself (error codes, error strings, calls before
 * nvmlInit, handles out of range, buffer sizes, init/shutdown counting) and
 * prints every value it reads as "key=value" lines, which the Rust test
 * compares with what the sim executor reports. Ends with
 * "nvml_test: N checks passed" (exit 0) or every failed check (exit 1).
 *
 * With NVML_TEST_NATIVE set (the GPU suite's run against NVIDIA's library,
 * for the values), the forged-handle check is left out: NVIDIA's library
 * reads whatever a forged handle points to.
 *
 * The NVML declarations below are written for rgpu from NVIDIA's public NVML
 * API reference (no nvml.h on CI). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rgpu_nvml.h"

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
const char *nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version);
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates);

static long checks_passed;
static long checks_failed;

#define CHECK_EQ(actual, expected)                                                       \
    do {                                                                                 \
        long long a_ = (long long)(actual), e_ = (long long)(expected);                  \
        if (a_ != e_) {                                                                  \
            printf("FAILED %s:%d: %s == %lld, expected %lld\n", __FILE__, __LINE__,      \
                   #actual, a_, e_);                                                     \
            checks_failed++;                                                             \
        } else {                                                                         \
            checks_passed++;                                                             \
        }                                                                                \
    } while (0)

#define CHECK_OK(call) CHECK_EQ(call, NVML_SUCCESS)

#define CHECK_STR(actual, expected)                                                      \
    do {                                                                                 \
        const char *a_ = (actual), *e_ = (expected);                                     \
        if (a_ == NULL || strcmp(a_, e_) != 0) {                                         \
            printf("FAILED %s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, \
                   #actual, a_ ? a_ : "(null)", e_);                                     \
            checks_failed++;                                                             \
        } else {                                                                         \
            checks_passed++;                                                             \
        }                                                                                \
    } while (0)

/* "GPU-" then 8-4-4-4-12 lower-case hex digits. */
static int uuid_format_ok(const char *uuid) {
    static const int groups[] = {8, 4, 4, 4, 12};
    if (strncmp(uuid, "GPU-", 4) != 0) return 0;
    const char *p = uuid + 4;
    for (int g = 0; g < 5; g++) {
        for (int i = 0; i < groups[g]; i++, p++) {
            if (!isxdigit((unsigned char)*p) || isupper((unsigned char)*p)) return 0;
        }
        if (g < 4 && *p++ != '-') return 0;
    }
    return *p == '\0';
}

int main(void) {
    const int native = getenv("NVML_TEST_NATIVE") != NULL;
    unsigned int count = 0;
    nvmlDevice_t device = NULL, other = NULL;
    int version = 0;

    /* Before nvmlInit. */
    CHECK_EQ(nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_ERROR_UNINITIALIZED);
    CHECK_EQ(nvmlSystemGetCudaDriverVersion(&version), NVML_ERROR_UNINITIALIZED);
    CHECK_EQ(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    CHECK_STR(nvmlErrorString(NVML_SUCCESS), "Success");
    CHECK_STR(nvmlErrorString(NVML_ERROR_UNINITIALIZED), "Uninitialized");
    CHECK_STR(nvmlErrorString(NVML_ERROR_INVALID_ARGUMENT), "Invalid Argument");
    CHECK_STR(nvmlErrorString(NVML_ERROR_NOT_SUPPORTED), "Not Supported");
    CHECK_STR(nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE), "Insufficient Size");
    CHECK_STR(nvmlErrorString(NVML_ERROR_UNKNOWN), "Unknown Error");
    CHECK_STR(nvmlErrorString(123456), "Unknown Error");

    CHECK_OK(nvmlInit_v2());
    CHECK_OK(nvmlDeviceGetCount_v2(&count));
    CHECK_EQ(count, 1);
    printf("count=%u\n", count);
    CHECK_OK(nvmlDeviceGetHandleByIndex_v2(0, &device));
    CHECK_EQ(device != NULL, 1);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(1, &other), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);

    CHECK_OK(nvmlSystemGetCudaDriverVersion(&version));
    printf("cuda_driver_version=%d\n", version);
    CHECK_OK(nvmlSystemGetCudaDriverVersion_v2(&version));
    printf("cuda_driver_version_v2=%d\n", version);
    char text[96];
    CHECK_OK(nvmlSystemGetDriverVersion(text, sizeof text));
    printf("driver_version=%s\n", text);
    CHECK_EQ(nvmlSystemGetDriverVersion(text, 2), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_OK(nvmlSystemGetNVMLVersion(text, sizeof text));
    printf("nvml_version=%s\n", text);

    char name[96];
    CHECK_OK(nvmlDeviceGetName(device, name, sizeof name));
    printf("name=%s\n", name);
    CHECK_EQ(nvmlDeviceGetName(device, name, 4), NVML_ERROR_INSUFFICIENT_SIZE);
    if (!native) {
        CHECK_EQ(nvmlDeviceGetName((nvmlDevice_t)(void *)name, name, sizeof name),
                 NVML_ERROR_INVALID_ARGUMENT);
    }
    CHECK_EQ(nvmlDeviceGetName(NULL, name, sizeof name), NVML_ERROR_INVALID_ARGUMENT);

    char uuid[80];
    CHECK_OK(nvmlDeviceGetUUID(device, uuid, sizeof uuid));
    printf("uuid=%s\n", uuid);
    CHECK_EQ(uuid_format_ok(uuid), 1);
    CHECK_OK(nvmlDeviceGetHandleByUUID(uuid, &other));
    CHECK_EQ(other == device, 1);
    CHECK_EQ(nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &other),
             NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetHandleByUUID(NULL, &other), NVML_ERROR_INVALID_ARGUMENT);

    unsigned int index = 99, minor = 99;
    CHECK_OK(nvmlDeviceGetIndex(device, &index));
    printf("index=%u\n", index);
    CHECK_OK(nvmlDeviceGetMinorNumber(device, &minor));
    printf("minor=%u\n", minor);

    nvmlPciInfo_t pci;
    memset(&pci, 0xff, sizeof pci);
    CHECK_OK(nvmlDeviceGetPciInfo_v3(device, &pci));
    printf("pci_bus_id=%s\n", pci.busId);
    printf("pci_bus_id_legacy=%s\n", pci.busIdLegacy);
    printf("pci_location=%u:%u:%u\n", pci.domain, pci.bus, pci.device);
    CHECK_EQ(pci.pciDeviceId & 0xffff, 0x10de);
    CHECK_OK(nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &other));
    CHECK_EQ(other == device, 1);
    CHECK_OK(nvmlDeviceGetHandleByPciBusId_v2(pci.busIdLegacy, &other));
    CHECK_EQ(other == device, 1);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2("0000:ff:1f.0", &other), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2("not a bus id", &other),
             NVML_ERROR_INVALID_ARGUMENT);

    int major = -1, minor_cc = -1;
    CHECK_OK(nvmlDeviceGetCudaComputeCapability(device, &major, &minor_cc));
    printf("compute_capability=%d.%d\n", major, minor_cc);

    nvmlMemory_t memory;
    CHECK_OK(nvmlDeviceGetMemoryInfo(device, &memory));
    CHECK_EQ(memory.used + memory.free, memory.total);
    printf("memory=%llu/%llu/%llu\n", memory.total, memory.free, memory.used);
    nvmlMemory_v2_t memory2;
    memset(&memory2, 0, sizeof memory2);
    memory2.version = nvmlMemory_v2;
    CHECK_OK(nvmlDeviceGetMemoryInfo_v2(device, &memory2));
    CHECK_EQ(memory2.version, nvmlMemory_v2);
    printf("memory_v2=%llu/%llu/%llu/%llu\n", memory2.total, memory2.reserved, memory2.free,
           memory2.used);
    memory2.version = 1;
    CHECK_EQ(nvmlDeviceGetMemoryInfo_v2(device, &memory2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

    nvmlUtilization_t rates = {999, 999};
    CHECK_OK(nvmlDeviceGetUtilizationRates(device, &rates));
    printf("utilization=%u/%u\n", rates.gpu, rates.memory);

    /* This process holds no CUDA context: nothing of this tenant runs. */
    nvmlProcessInfo_t infos[4];
    unsigned int processes = sizeof infos / sizeof infos[0];
    CHECK_OK(nvmlDeviceGetComputeRunningProcesses_v3(device, &processes, infos));
    printf("processes=%u\n", processes);
    processes = 0;
    CHECK_OK(nvmlDeviceGetComputeRunningProcesses_v3(device, &processes, NULL));
    CHECK_EQ(processes, 0);
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(device, NULL, infos),
             NVML_ERROR_INVALID_ARGUMENT);

    /* A stub of the export list. */
    CHECK_EQ(nvmlDeviceGetHandleBySerial("0", &other), NVML_ERROR_NOT_SUPPORTED);

    /* Init and shutdown are counted; handles stay valid across them. */
    CHECK_OK(nvmlInitWithFlags(0));
    CHECK_OK(nvmlShutdown());
    CHECK_OK(nvmlDeviceGetName(device, name, sizeof name));
    CHECK_OK(nvmlShutdown());
    CHECK_EQ(nvmlDeviceGetName(device, name, sizeof name), NVML_ERROR_UNINITIALIZED);
    CHECK_EQ(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    CHECK_OK(nvmlInit_v2());
    CHECK_OK(nvmlDeviceGetHandleByIndex_v2(0, &other));
    CHECK_EQ(other == device, 1);
    CHECK_OK(nvmlShutdown());

    if (checks_failed) {
        printf("nvml_test: %ld checks FAILED, %ld passed\n", checks_failed, checks_passed);
        return 1;
    }
    printf("nvml_test: %ld checks passed\n", checks_passed);
    return 0;
}

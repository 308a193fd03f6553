/* device_query: what applications ask about the device, printed only as
 * machine-independent facts (an H200 through rgpu or natively gives the same
 * lines): device count and properties, attributes, versions, PCI bus id
 * round trip, limits, kernel attributes and occupancy, and
 * cudaDeviceReset followed by fresh work. */
#include "compat.h"

#include <stdlib.h>
#include <string.h>

__global__ void small_kernel(int *out) { out[threadIdx.x] = (int)threadIdx.x * 2; }

static bool device_count_and_set(void) {
    int count = 0, current = -1;
    CK(cudaGetDeviceCount(&count));
    EXPECT(count >= 1);
    CK(cudaSetDevice(0));
    CK(cudaGetDevice(&current));
    EXPECT(current == 0);
    return true;
}

/* Whether device 0 is reached over the network: the first RGPU_DEVICES
 * entry is tls:// or tcp://, or, with no list, RGPU_SERVER is set. */
static bool device0_remote(void) {
    const char *list = getenv("RGPU_DEVICES");
    if (list && *list) return strncmp(list, "tls://", 6) == 0 || strncmp(list, "tcp://", 6) == 0;
    return getenv("RGPU_SERVER") != NULL;
}

static bool properties(void) {
    cudaDeviceProp p;
    memset(&p, 0, sizeof p);
    CK(cudaGetDeviceProperties(&p, 0));
    EXPECT(p.major >= 9 && p.minor >= 0);
    EXPECT(p.warpSize == 32 && p.maxThreadsPerBlock == 1024);
    EXPECT(p.maxThreadsDim[0] == 1024 && p.maxGridSize[0] == 2147483647);
    EXPECT(p.sharedMemPerBlock == 49152 && p.sharedMemPerBlockOptin >= 49152);
    EXPECT(p.totalGlobalMem >= (1ull << 30) && p.multiProcessorCount > 0);
    /* Through rgpu's network carrier the GPU cannot reach this process's
     * memory, and says so. */
    EXPECT(p.name[0] != '\0' && p.unifiedAddressing == (device0_remote() ? 0 : 1));
    int uuid_nonzero = 0;
    for (int k = 0; k < 16; k++) uuid_nonzero |= p.uuid.bytes[k];
    EXPECT(uuid_nonzero != 0);
    return true;
}

static bool attributes_match_properties(void) {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int major = 0, minor = -1, sms = 0, warp = 0, l2 = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, 0));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    EXPECT(major == p.major && minor == p.minor && sms == p.multiProcessorCount);
    EXPECT(warp == 32 && l2 == p.l2CacheSize && l2 > 0);
    return true;
}

static bool versions(void) {
    int driver = 0, runtime = 0;
    CK(cudaDriverGetVersion(&driver));
    CK(cudaRuntimeGetVersion(&runtime));
    EXPECT(runtime == CUDART_VERSION && driver >= 13000 && driver >= runtime);
    return true;
}

static bool pci_bus_id_round_trip(void) {
    char bus_id[32] = {0};
    CK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0));
    EXPECT(strlen(bus_id) >= 12 && bus_id[4] == ':');
    int device = -1;
    CK(cudaDeviceGetByPCIBusId(&device, bus_id));
    EXPECT(device == 0);
    return true;
}

static bool limits(void) {
    size_t stack = 0, heap = 0;
    CK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
    EXPECT(stack > 0);
    CK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16u << 20));
    CK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
    EXPECT(heap >= (16u << 20));
    CK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
    return true;
}

static bool kernel_attributes_and_occupancy(void) {
    cudaFuncAttributes a;
    memset(&a, 0, sizeof a);
    CK(cudaFuncGetAttributes(&a, small_kernel));
    EXPECT(a.maxThreadsPerBlock >= 32 && a.binaryVersion == 90);
    int blocks = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, small_kernel, 256, 0));
    EXPECT(blocks >= 1);
    int min_grid = 0, block = 0;
    CK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, small_kernel, 0, 0));
    EXPECT(min_grid >= 1 && block >= 32 && block <= 1024);
    return true;
}

static bool run_small_kernel(void) {
    int *d, out[64];
    CK(cudaMalloc(&d, sizeof out));
    small_kernel<<<1, 64>>>(d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    for (int i = 0; i < 64; i++) EXPECT(out[i] == 2 * i);
    return true;
}

static bool device_reset_then_work(void) {
    EXPECT(run_small_kernel());
    CK(cudaDeviceSynchronize());
    CK(cudaDeviceReset());
    EXPECT(run_small_kernel());
    return true;
}

int main(void) {
    compat_start();
    check("device: count >= 1, cudaSetDevice/cudaGetDevice", device_count_and_set);
    check("device: properties (sm >= 9.0, warp 32, 1024 threads, 48 KiB shared)", properties);
    check("device: cudaDeviceGetAttribute agrees with the properties",
          attributes_match_properties);
    check("device: driver >= 13.0 and runtime versions", versions);
    check("device: PCI bus id round trip", pci_bus_id_round_trip);
    check("device: stack and heap limits, cache config", limits);
    check("device: kernel attributes (sm_90 binary) and occupancy",
          kernel_attributes_and_occupancy);
    check("device: cudaDeviceReset, then new work", device_reset_then_work);
    return finish("device_query");
}

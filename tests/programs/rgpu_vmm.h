/* The virtual-memory management API for rgpu's C test programs, written
 * from NVIDIA's public driver API reference (no cuda.h on CI): the
 * allocation, location and access structs, the calls, and the values the
 * tests use. Include after the CUDA declarations (rgpu_cuda.h). */
#ifndef RGPU_VMM_H
#define RGPU_VMM_H

#include <stddef.h>
#include <string.h>

typedef unsigned long long MemHandle;
typedef struct {
    unsigned int type;
    int id;
} MemLocation;
typedef struct {
    unsigned int type;
    unsigned int requested_handle_types;
    MemLocation location;
    void *win32_handle_metadata;
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
} AllocationProp;
typedef struct {
    MemLocation location;
    unsigned int flags;
} AccessDesc;

CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const AllocationProp *prop, int option);
CUresult cuMemCreate(MemHandle *handle, size_t size, const AllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(MemHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, MemHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const AccessDesc *desc, size_t count);
CUresult cuMemGetAccess(unsigned long long *flags, const MemLocation *location, CUdeviceptr ptr);
CUresult cuMemRetainAllocationHandle(MemHandle *handle, void *addr);
CUresult cuMemGetAllocationPropertiesFromHandle(AllocationProp *prop, MemHandle handle);
CUresult cuMemExportToShareableHandle(void *shareable, MemHandle handle, unsigned int type,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(MemHandle *handle, void *os_handle, unsigned int type);

/* CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
 * CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_HANDLE_TYPE_*. */
#define PINNED 1
#define DEVICE 1
#define READ_WRITE 3
#define HANDLE_POSIX_FD 1
#define HANDLE_FABRIC 8

/* Pinned memory of `device`, shareable as `handle_types` (0: not). */
static inline AllocationProp device_prop(int device, unsigned int handle_types) {
    AllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = PINNED;
    prop.requested_handle_types = handle_types;
    prop.location.type = DEVICE;
    prop.location.id = device;
    return prop;
}

#endif

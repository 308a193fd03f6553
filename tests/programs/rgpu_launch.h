/* cuLaunchKernelEx's configuration and launch attributes for rgpu's C test
 * programs, written from NVIDIA's public driver API reference (no cuda.h on
 * CI). Include after the CUDA declarations (rgpu_cuda.h). */
#ifndef RGPU_LAUNCH_H
#define RGPU_LAUNCH_H

#include <stddef.h>

/* CUlaunchAttributeID values. */
#define LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW 1
#define LAUNCH_ATTRIBUTE_COOPERATIVE 2
#define LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4
#define LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE 5
#define LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
#define LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT 7
#define LAUNCH_ATTRIBUTE_PRIORITY 8
#define LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP 9
#define LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN 10
#define LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT 12
#define LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE 13
#define LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT 14

/* CUlaunchAttribute: an id, then a 64-byte value union at offset 8. */
typedef struct {
    unsigned int id;
    unsigned int pad;
    union {
        unsigned char bytes[64];
        unsigned int dims[3];
        int number; /* priority, flags, enumerations */
        unsigned char map[2];
        struct {
            void *base;
            size_t bytes;
            float hit_ratio;
            int hit_property;
            int miss_property;
        } window;
        struct {
            CUevent event;
            int flags;
            int trigger_at_block_start;
        } programmatic;
        struct {
            CUevent event;
            int flags;
        } completion;
    } value;
} LaunchAttribute;

/* CUlaunchConfig. */
typedef struct {
    unsigned int grid_x, grid_y, grid_z;
    unsigned int block_x, block_y, block_z;
    unsigned int shared_mem_bytes;
    CUstream stream;
    LaunchAttribute *attrs;
    unsigned int num_attrs;
} LaunchConfig;

CUresult cuLaunchKernelEx(const LaunchConfig *config, CUfunction f, void **params, void **extra);

#endif

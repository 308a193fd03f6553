/* params: kernel parameter shapes as nvcc lays them out — structs by value
 * with mixed types and padding, arrays inside structs, scalars of every
 * width, many parameters, a parameter block just under 4 KiB and one of
 * 32000 bytes (CUDA 12.1+ allows up to 32764), templates, 3-D launch
 * geometry, and the same kernel launched through <<<>>>, cudaLaunchKernel and
 * cudaLaunchKernelEx. */
#include "compat.h"

#include <string.h>

struct Mixed {
    char c;
    double d;
    short s;
    int i;
    long long ll;
    float f;
    unsigned char tail[3];
};

__global__ void echo_mixed(Mixed m, Mixed *out, long long *sum) {
    *out = m;
    *sum = m.c + m.s + m.i + m.ll + (long long)(m.d * 2.0) + (long long)(m.f * 4.0f) + m.tail[0] +
           m.tail[1] + m.tail[2];
}

static bool mixed_struct(void) {
    Mixed m;
    memset(&m, 0, sizeof m);
    m.c = -5;
    m.d = 12345.5;
    m.s = -300;
    m.i = 100000;
    m.ll = 1LL << 40;
    m.f = 2.25f;
    m.tail[0] = 1;
    m.tail[1] = 2;
    m.tail[2] = 250;
    Mixed *d_out;
    long long *d_sum;
    CK(cudaMalloc(&d_out, sizeof(Mixed)));
    CK(cudaMalloc(&d_sum, sizeof(long long)));
    echo_mixed<<<1, 1>>>(m, d_out, d_sum);
    CK(cudaGetLastError());
    Mixed got;
    long long sum;
    CK(cudaMemcpy(&got, d_out, sizeof got, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    CK(cudaFree(d_sum));
    EXPECT(got.c == m.c && got.d == m.d && got.s == m.s && got.i == m.i && got.ll == m.ll);
    EXPECT(got.f == m.f && memcmp(got.tail, m.tail, 3) == 0);
    EXPECT(sum == -5 - 300 + 100000 + (1LL << 40) + 24691 + 9 + 253);
    return true;
}

struct WithArray {
    int v[17];
    short n;
};

__global__ void triple_array(WithArray a, int *out) {
    unsigned t = threadIdx.x;
    if (t < 17) out[t] = a.v[t] * 3;
    if (t == 0) out[17] = a.n;
}

static bool array_in_struct(void) {
    WithArray a;
    for (int i = 0; i < 17; i++) a.v[i] = i * i - 40;
    a.n = -1234;
    int *d_out, out[18];
    CK(cudaMalloc(&d_out, sizeof out));
    triple_array<<<1, 32>>>(a, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    for (int i = 0; i < 17; i++) EXPECT(out[i] == (i * i - 40) * 3);
    EXPECT(out[17] == -1234);
    return true;
}

__global__ void echo_scalars(char c, short s, int i, long long ll, float f, double d,
                             unsigned char uc, unsigned short us, unsigned u,
                             unsigned long long ull, bool b, long long *iout, double *fout) {
    iout[0] = c;
    iout[1] = s;
    iout[2] = i;
    iout[3] = ll;
    iout[4] = uc;
    iout[5] = us;
    iout[6] = u;
    iout[7] = (long long)ull;
    iout[8] = b;
    fout[0] = f;
    fout[1] = d;
}

static bool scalar_types(void) {
    long long *d_i, iout[9];
    double *d_f, fout[2];
    CK(cudaMalloc(&d_i, sizeof iout));
    CK(cudaMalloc(&d_f, sizeof fout));
    const unsigned long long ull = 0xFEDCBA9876543210ULL;
    echo_scalars<<<1, 1>>>((char)-7, (short)-32000, -2000000000, -(1LL << 50) - 3, -0.375f,
                           6.02214076e23, (unsigned char)200, (unsigned short)65000,
                           4000000000u, ull, true, d_i, d_f);
    CK(cudaGetLastError());
    CK(cudaMemcpy(iout, d_i, sizeof iout, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(fout, d_f, sizeof fout, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_i));
    CK(cudaFree(d_f));
    EXPECT(iout[0] == -7 && iout[1] == -32000 && iout[2] == -2000000000);
    EXPECT(iout[3] == -(1LL << 50) - 3 && iout[4] == 200 && iout[5] == 65000);
    EXPECT(iout[6] == 4000000000LL && (unsigned long long)iout[7] == ull && iout[8] == 1);
    EXPECT(fout[0] == -0.375 && fout[1] == 6.02214076e23);
    return true;
}

/* 24 parameters alternating 1-byte and 8-byte types: every double sits after
 * 7 bytes of padding. */
__global__ void many_params(long long *out, char c0, double d0, char c1, double d1, char c2,
                            double d2, char c3, double d3, char c4, double d4, char c5,
                            double d5, char c6, double d6, char c7, double d7, char c8,
                            double d8, char c9, double d9, char c10, double d10, int last) {
    const char cs[11] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10};
    const double ds[11] = {d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10};
    for (int k = 0; k < 11; k++) out[k] = cs[k] * 1000 + (long long)ds[k];
    out[11] = last;
}

static bool many_scalar_params(void) {
    long long *d_out, out[12];
    CK(cudaMalloc(&d_out, sizeof out));
    many_params<<<1, 1>>>(d_out, 1, 10.0, 2, 20.0, 3, 30.0, 4, 40.0, 5, 50.0, 6, 60.0, 7, 70.0,
                          8, 80.0, 9, 90.0, 10, 100.0, 11, 110.0, 424242);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    for (int k = 0; k < 11; k++) EXPECT(out[k] == (k + 1) * 1000 + (k + 1) * 10);
    EXPECT(out[11] == 424242);
    return true;
}

struct Job {
    float *dst;
    const float *src;
    unsigned n;
    float scale;
};

__global__ void run_job(Job job) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < job.n) job.dst[i] = job.src[i] * job.scale;
}

/* The same kernel through the three launch paths of the runtime. */
static bool struct_with_pointers_three_launch_paths(void) {
    const unsigned n = 1000;
    float host[n], out[n];
    for (unsigned i = 0; i < n; i++) host[i] = (float)i;
    float *src, *dst;
    CK(cudaMalloc(&src, n * sizeof(float)));
    CK(cudaMalloc(&dst, n * sizeof(float)));
    CK(cudaMemcpy(src, host, sizeof host, cudaMemcpyHostToDevice));

    Job job = {dst, src, n, 2.0f};
    run_job<<<(n + 127) / 128, 128>>>(job);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, dst, sizeof out, cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < n; i++) EXPECT(out[i] == 2.0f * i);

    job.scale = 3.0f;
    void *args[] = {&job};
    CK(cudaLaunchKernel((const void *)run_job, dim3((n + 255) / 256), dim3(256), args, 0, 0));
    CK(cudaMemcpy(out, dst, sizeof out, cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < n; i++) EXPECT(out[i] == 3.0f * i);

    job.scale = -0.5f;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((n + 63) / 64);
    config.blockDim = dim3(64);
    CK(cudaLaunchKernelEx(&config, run_job, job));
    CK(cudaMemcpy(out, dst, sizeof out, cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < n; i++) EXPECT(out[i] == -0.5f * i);

    CK(cudaFree(src));
    CK(cudaFree(dst));
    return true;
}

/* 4064 bytes of struct plus an 8-byte pointer: just under the classic 4 KiB. */
struct Block4k {
    int v[1016];
};

__global__ void from_block4k(Block4k b, int *out) {
    unsigned i = threadIdx.x;
    if (i < 1016) out[i] = b.v[i] + (int)i;
}

static bool param_block_4k(void) {
    static Block4k b;
    static int out[1016];
    for (int i = 0; i < 1016; i++) b.v[i] = 7 * i - 3000;
    int *d_out;
    CK(cudaMalloc(&d_out, sizeof out));
    from_block4k<<<1, 1024>>>(b, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    for (int i = 0; i < 1016; i++) EXPECT(out[i] == 8 * i - 3000);
    return true;
}

/* 31992 bytes of struct plus an 8-byte pointer: 32000 bytes of parameters. */
struct Block32k {
    int v[7998];
};

__global__ void from_block32k(Block32k b, int *out) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 7998) out[i] = b.v[i] * 2 - 1;
}

static bool param_block_32000(void) {
    static Block32k b;
    static int out[7998];
    for (int i = 0; i < 7998; i++) b.v[i] = i ^ 0x5555;
    int *d_out;
    CK(cudaMalloc(&d_out, sizeof out));
    from_block32k<<<8, 1024>>>(b, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    for (int i = 0; i < 7998; i++) EXPECT(out[i] == (i ^ 0x5555) * 2 - 1);
    return true;
}

template <typename T> __global__ void axpy(T a, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

template <typename T> static bool axpy_of(T a) {
    const int n = 300;
    T x[n], y[n];
    for (int i = 0; i < n; i++) {
        x[i] = (T)i;
        y[i] = (T)(2 * i);
    }
    T *dx, *dy;
    CK(cudaMalloc(&dx, sizeof x));
    CK(cudaMalloc(&dy, sizeof y));
    CK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, y, sizeof y, cudaMemcpyHostToDevice));
    axpy<T><<<3, 128>>>(a, dx, dy, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    for (int i = 0; i < n; i++) EXPECT(y[i] == (T)(a * (T)i + (T)(2 * i)));
    return true;
}

static bool template_kernels(void) {
    return axpy_of<float>(1.5f) && axpy_of<double>(-3.25) && axpy_of<long long>(1LL << 33);
}

__global__ void linear_ids(unsigned *out) {
    unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
    out[block * per_block + thread] = block * 1000 + thread;
}

static bool launch_geometry_3d(void) {
    const dim3 grid(3, 2, 2), block(4, 3, 2);
    const unsigned blocks = 12, per_block = 24, n = blocks * per_block;
    unsigned *d_out, out[n];
    CK(cudaMalloc(&d_out, sizeof out));
    CK(cudaMemset(d_out, 0xff, sizeof out));
    linear_ids<<<grid, block>>>(d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    for (unsigned b = 0; b < blocks; b++)
        for (unsigned t = 0; t < per_block; t++) EXPECT(out[b * per_block + t] == b * 1000 + t);
    return true;
}

int main(void) {
    compat_start();
    check("params: struct by value, mixed types and padding", mixed_struct);
    check("params: array inside a struct by value", array_in_struct);
    check("params: char short int int64 float double unsigned bool", scalar_types);
    check("params: 24 parameters alternating char and double", many_scalar_params);
    check("params: struct of pointers, <<<>>> cudaLaunchKernel cudaLaunchKernelEx",
          struct_with_pointers_three_launch_paths);
    check("params: 4072-byte parameter block", param_block_4k);
    check("params: 32000-byte parameter block", param_block_32000);
    check("params: template kernels float double int64", template_kernels);
    check("params: 3-D grid and block", launch_geometry_3d);
    return finish("params");
}

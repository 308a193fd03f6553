"""CuPy on the GPU: an ElementwiseKernel, reductions (cp.sum, cp.max and a
ReductionKernel) and a RawKernel, each checked exactly against NumPy (inputs
are integers or multiples of 0.25, so every result is exact in any order)."""

import sys

import numpy as np

from compat_check import check, finish

N = 1 << 20


def device():
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(0)
    return cp.cuda.runtime.getDeviceCount() >= 1 and props["major"] >= 9


def elementwise():
    import cupy as cp

    kernel = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = 2 * x + y", "compat_axpy")
    x = np.arange(N, dtype=np.float32)
    y = (np.arange(N) % 7).astype(np.float32)
    z = kernel(cp.asarray(x), cp.asarray(y))
    return np.array_equal(cp.asnumpy(z), 2 * x + y)


def elementwise_int64_scalar():
    import cupy as cp

    kernel = cp.ElementwiseKernel("int64 x, int64 k", "int64 z", "z = x * x - k", "compat_square_minus")
    x = np.arange(-5000, 5000, dtype=np.int64)
    z = kernel(cp.asarray(x), np.int64(12345))
    return np.array_equal(cp.asnumpy(z), x * x - 12345)


def reductions():
    import cupy as cp

    ints = np.arange(N, dtype=np.int64)
    quarters = ((np.arange(N) % 4) * 0.25).astype(np.float32)
    d_ints = cp.asarray(ints)
    return (
        int(cp.sum(d_ints)) == N * (N - 1) // 2
        and float(cp.sum(cp.asarray(quarters))) == float(quarters.sum(dtype=np.float64))
        and int(cp.max(d_ints * 3 % 1000003)) == int((ints * 3 % 1000003).max())
    )


def reduction_kernel():
    import cupy as cp

    kernel = cp.ReductionKernel(
        "int64 x", "int64 y", "x * x", "a + b", "y = a", "0", "compat_sum_of_squares"
    )
    x = np.arange(N, dtype=np.int64) % 1000
    return int(kernel(cp.asarray(x))) == int((x * x).sum())


def raw_kernel():
    import cupy as cp

    kernel = cp.RawKernel(
        r"""
extern "C" __global__ void compat_iota(long long *out, long long base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + 3LL * i;
}
""",
        "compat_iota",
    )
    n = 10000
    out = cp.zeros(n, dtype=cp.int64)
    kernel(((n + 255) // 256,), (256,), (out, np.int64(1 << 40), np.int32(n)))
    cp.cuda.Device().synchronize()
    return np.array_equal(cp.asnumpy(out), (1 << 40) + 3 * np.arange(n, dtype=np.int64))


def main():
    check("cupy: device count >= 1, compute capability >= 9", device)
    check("cupy: ElementwiseKernel float32 z = 2x + y", elementwise)
    check("cupy: ElementwiseKernel int64 with a scalar", elementwise_int64_scalar)
    check("cupy: cp.sum int64 and float32, cp.max", reductions)
    check("cupy: ReductionKernel sum of squares", reduction_kernel)
    check("cupy: RawKernel (NVRTC)", raw_kernel)
    return finish("cupy_check")


if __name__ == "__main__":
    sys.exit(main())

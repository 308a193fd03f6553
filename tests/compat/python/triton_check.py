"""Triton on the GPU through PyTorch: a vector-add kernel (checked exactly
against torch) and a row softmax (checked against torch.softmax within
1e-6 absolute), after a plain torch check so that a failure points at the
right layer. Inputs come from torch's seeded generator on the device."""

import sys
import traceback

from compat_check import check, finish

try:
    import torch
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported as failed checks below
    traceback.print_exc()
    torch = triton = tl = None

if triton is not None:

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        numerator = tl.exp(x)
        tl.store(out_ptr + row * out_stride + cols, numerator / tl.sum(numerator, axis=0), mask=mask)


def torch_basics():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0)[0] < 9:
        return False
    x = torch.arange(1 << 16, device="cuda", dtype=torch.int64)
    return int((x * 2 + 1).sum().item()) == (1 << 16) * (1 << 16)


def vector_add():
    torch.manual_seed(0)
    n = 98432
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    return torch.equal(out, x + y)


def softmax():
    torch.manual_seed(1)
    rows, cols = 823, 781
    x = torch.randn(rows, cols, device="cuda")
    out = torch.empty_like(x)
    softmax_kernel[(rows,)](out, x, x.stride(0), out.stride(0), cols, BLOCK=triton.next_power_of_2(cols))
    torch.cuda.synchronize()
    return torch.allclose(out, torch.softmax(x, dim=1), rtol=0, atol=1e-6)


def main():
    check("torch: CUDA available, compute capability >= 9, int64 arithmetic", torch_basics)
    check("triton: vector add equals torch", vector_add)
    check("triton: row softmax matches torch.softmax", softmax)
    return finish("triton_check")


if __name__ == "__main__":
    sys.exit(main())

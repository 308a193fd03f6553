"""PyTorch under a tenant's memory limit (the daemon started with
--memory-limit 4GiB): the device shows 4 GiB, a tensor past the limit raises
torch.cuda.OutOfMemoryError, and a training loop that fits still trains.
Run through rgpu (guest-lib's libcuda.so.1 first on LD_LIBRARY_PATH).
Prints one line per check and "memory_limit_torch: N passed, M failed"."""

import sys

import torch

GIB = 1 << 30
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{name}: {'PASS' if ok else 'FAIL'}{' (' + detail + ')' if detail else ''}")


free, total = torch.cuda.mem_get_info()
check("device shows the limit", total == 4 * GIB, f"total {total >> 20} MiB, free {free >> 20} MiB")
check(
    "torch sees the limit",
    torch.cuda.get_device_properties(0).total_memory == 4 * GIB,
    f"{torch.cuda.get_device_properties(0).total_memory >> 20} MiB",
)

# One context's own memory is charged (about 518 MiB on the H200); torch's
# NVML connection must not add a second one.
check(
    "only this process's one context is charged at the start",
    total - free < 768 << 20,
    f"{(total - free) >> 20} MiB in use",
)

held = torch.empty(free // 2, dtype=torch.uint8, device="cuda")
try:
    over = torch.empty(free - free // 4, dtype=torch.uint8, device="cuda")
    check("a tensor past the limit raises OutOfMemoryError", False, "it was allocated")
except torch.cuda.OutOfMemoryError as e:
    check("a tensor past the limit raises OutOfMemoryError", True, str(e).split(".")[0])
del held
torch.cuda.empty_cache()

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
inputs = torch.randn(1024, 512, device="cuda")
targets = torch.randint(0, 10, (1024,), device="cuda")
losses = []
for _ in range(100):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
check(
    "a training loop that fits trains",
    losses[-1] < losses[0] * 0.9,
    f"loss {losses[0]:.4f} -> {losses[-1]:.4f}",
)
print(f"memory_limit_torch: {sum(results)} passed, {len(results) - sum(results)} failed")
sys.exit(0 if all(results) else 1)

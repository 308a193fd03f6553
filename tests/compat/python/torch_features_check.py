"""PyTorch features that lean on the driver API beyond plain launches
(issue 10): CUDA graph capture and replay of a training step,
torch.compile(mode="reduce-overhead") (CUDA graphs again), the
expandable-segments allocator (the virtual-memory API) and a deterministic
cuDNN convolution net. Each check compares against eager PyTorch in the
same process, so native and rgpu runs print the same lines."""

import os
import subprocess
import sys

from compat_check import check, finish


def model_and_data(torch, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).cuda()
    inputs = torch.randn(256, 64, device="cuda")
    targets = torch.randint(0, 10, (256,), device="cuda")
    return model, inputs, targets


def graph_replay():
    """A training step captured with torch.cuda.graph and replayed gives
    the losses eager steps give."""
    import torch

    def losses(capture):
        model, inputs, targets = model_and_data(torch)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        static_in, static_tg = inputs.clone(), targets.clone()

        def step():
            optimizer.zero_grad(set_to_none=False)
            loss = torch.nn.functional.cross_entropy(model(static_in), static_tg)
            loss.backward()
            optimizer.step()
            return loss

        if not capture:
            return [step().item() for _ in range(10)]
        # Warm up on a side stream, as PyTorch's documentation asks.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            warm = [step().item() for _ in range(3)]
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()
        out = list(warm)
        for _ in range(7):
            graph.replay()
            out.append(static_loss.item())
        return out

    eager, replayed = losses(False), losses(True)
    return all(abs(a - b) < 1e-5 for a, b in zip(eager, replayed)) and replayed[-1] < replayed[0]


def compiled_reduce_overhead():
    """torch.compile(mode="reduce-overhead") gives eager's outputs."""
    import torch

    model, inputs, _ = model_and_data(torch)
    model.eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        eager = model(inputs)
        for _ in range(3):
            out = compiled(inputs)
    return torch.allclose(out, eager, atol=1e-5, rtol=1e-5)


EXPANDABLE = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(512, 1024, device="cuda")
first = last = None
for i in range(20):
    opt.zero_grad()
    loss = (model(x) ** 2).mean()
    loss.backward()
    opt.step()
    first = loss.item() if first is None else first
    last = loss.item()
held = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
del held
torch.cuda.empty_cache()
print("ok" if last < first else "no progress")
"""


def expandable_segments():
    """A training loop under PYTORCH_CUDA_ALLOC_CONF=expandable_segments
    (set before CUDA starts: a process of its own)."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    out = subprocess.run(
        [sys.executable, "-c", EXPANDABLE], env=env, capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
    return out.returncode == 0 and out.stdout.strip() == "ok"


def cudnn_conv_net():
    """A small conv net with cuDNN deterministic: 20 SGD steps twice give
    bit-identical losses, and the loss falls."""
    import torch

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False

    def run():
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(32, 10),
        ).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        x = torch.randn(64, 3, 32, 32, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    first, second = run(), run()
    return first == second and first[-1] < first[0]


if __name__ == "__main__":
    check("torch: a training step captured as a CUDA graph replays as eager", graph_replay)
    check("torch: torch.compile reduce-overhead equals eager", compiled_reduce_overhead)
    check("torch: training under expandable_segments", expandable_segments)
    check("torch: deterministic cuDNN conv net, twice the same losses", cudnn_conv_net)
    sys.exit(finish("torch_features_check"))

"""PyTorch's multiprocessing sharing of CUDA memory (issue 10): a CUDA
tensor and an interprocess CUDA event handed to a spawned child through a
torch.multiprocessing queue, as data loaders and serving workers do. Under
rgpu both processes are guest processes of one tenant, and the tensor's
memory is opened through CUDA IPC on the host. The child adds to the
tensor in place and records the event; the parent waits on the event and
reads the child's write."""

import sys

from compat_check import check, finish

N = 1 << 20


def child(queue, done):
    import torch

    tensor, event_handle = queue.get()
    event = torch.cuda.Event.from_ipc_handle(tensor.device, event_handle)
    tensor.add_(1)
    event.record()
    event.synchronize()
    done.put(int(tensor.sum().item()))


def shared():
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    tensor = torch.arange(N, dtype=torch.int64, device="cuda")
    event = torch.cuda.Event(interprocess=True)
    worker = ctx.Process(target=child, args=(queue, done))
    worker.start()
    queue.put((tensor, event.ipc_handle()))
    child_sum = done.get(timeout=120)
    worker.join(timeout=120)
    event.wait()
    torch.cuda.synchronize()
    expected = N * (N - 1) // 2 + N
    # The child saw the parent's data, and the parent sees the child's write.
    return (
        worker.exitcode == 0
        and child_sum == expected
        and int(tensor.sum().item()) == expected
        and int(tensor[0].item()) == 1
    )


if __name__ == "__main__":
    check("torch: a CUDA tensor and an event shared with a spawned process", shared)
    sys.exit(finish("torch_ipc_check"))

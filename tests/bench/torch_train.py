"""A small GPT-style model trained with AdamW for a fixed number of steps,
seeded, for issue 9's benchmark (tests/bench/perf_bench.sh): run it natively
and through rgpu and compare steps per second and the final loss.

    torch_train.py [STEPS]      prints "steps_per_s S loss L windows LOW-HIGH"
                                (S: the median of windows of 50 steps, LOW
                                and HIGH the slowest and fastest window)

With TORCH_TRAIN_CPU=K the training loop's thread runs on CPU K alone once
warmed up (threads started before stay where they were): the GPU host's
vCPUs differ in speed by up to a quarter, so whole runs landed on a slow or a
fast one.
"""

import os
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
device = "cuda"
vocab, width, heads, layers, context, batch = 512, 256, 4, 4, 64, 32


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        mask = torch.triu(torch.full((context, context), float("-inf"), device=tokens.device), 1)
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


model = Model().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
data = torch.randint(0, vocab, (batch, context + 1), device=device)


def step():
    optimizer.zero_grad(set_to_none=True)
    logits = model(data[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    return loss


for _ in range(10):
    step()
torch.cuda.synchronize()
if "TORCH_TRAIN_CPU" in os.environ:
    # Linux: pid 0 is the calling thread.
    os.sched_setaffinity(0, {int(os.environ["TORCH_TRAIN_CPU"])})
# Timed in windows, the median window's rate reported: the GPU host's CPU
# (a VM) has moments of interference that moved whole-run rates by 20%
# between back-to-back native runs.
window = 50
rates = []
for _ in range(max(1, steps // window)):
    start = time.perf_counter()
    for _ in range(window):
        loss = step()
    torch.cuda.synchronize()
    rates.append(window / (time.perf_counter() - start))
final = loss.item()
rates.sort()
print(
    f"steps_per_s {rates[len(rates) // 2]:.2f} loss {final:.6f} "
    f"windows {rates[0]:.1f}-{rates[-1]:.1f}"
)

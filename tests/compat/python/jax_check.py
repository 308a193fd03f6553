"""JAX on the GPU (issue 10): XLA's allocator and its CUDA plugin lean on
the virtual-memory API, stream-ordered memory and events. A jit + grad
training loop of a small MLP on fixed data runs on the GPU and its losses
are compared with the same loop on JAX's CPU backend. The GPU losses go to
stderr, so native and rgpu runs can be put side by side."""

import os
import sys

# A tenant's memory limit, not XLA's default of 75% of the device.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from compat_check import check, finish  # noqa: E402


def losses_on(jax, device, steps=50):
    jnp = jax.numpy
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    inputs = jax.random.normal(k1, (256, 32))
    targets = jnp.sin(inputs @ jax.random.normal(k2, (32, 1)))
    params = {
        "w1": jax.random.normal(k3, (32, 64)) * 0.1,
        "b1": jnp.zeros(64),
        "w2": jax.random.normal(k4, (64, 1)) * 0.1,
        "b2": jnp.zeros(1),
    }
    inputs, targets, params = jax.device_put((inputs, targets, params), device)

    def loss_fn(p, x, y):
        hidden = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((hidden @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), loss

    losses = []
    for _ in range(steps):
        params, loss = step(params, inputs, targets)
        losses.append(float(loss))
    return losses


def gpu_training():
    import jax

    gpus = jax.devices("gpu")
    print(f"jax {jax.__version__}: {gpus}", file=sys.stderr)
    on_gpu = losses_on(jax, gpus[0])
    on_cpu = losses_on(jax, jax.devices("cpu")[0])
    print(f"jax gpu losses: first {on_gpu[0]:.6f} last {on_gpu[-1]:.6f}", file=sys.stderr)
    print(f"jax cpu losses: first {on_cpu[0]:.6f} last {on_cpu[-1]:.6f}", file=sys.stderr)
    close = all(abs(g - c) <= 1e-4 * max(1.0, abs(c)) for g, c in zip(on_gpu, on_cpu))
    return on_gpu[-1] < on_gpu[0] and close


def main():
    check("jax: jit + grad training on the GPU matches the CPU backend", gpu_training)
    return finish("jax_check")


if __name__ == "__main__":
    sys.exit(main())

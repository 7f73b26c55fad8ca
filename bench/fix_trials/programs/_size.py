"""Sizes: the program's own on a TPU; tiny on a CPU, where only the code path is tested."""
import jax

ON_CPU = jax.default_backend() == "cpu"


def size(tpu, cpu):
    return cpu if ON_CPU else tpu

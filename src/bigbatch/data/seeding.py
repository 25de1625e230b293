"""Counter-based randomness: every random number is a hash of (seed, epoch, example index, ...).

The first principle of docs/design.md: data order and augmentation must not depend on which
process draws them or in which order, so that a run with global batch B gives the same batches
for any number of processes W and accumulation steps A. A process-local RNG stream cannot give
that (its state depends on what that process drew before); a hash of the example's coordinates
can.

The hash is the splitmix64 finaliser (Steele, Lea & Flood 2014, the seeding function of
java.util.SplittableRandom and of xoshiro), chained over the values of the tuple. Each chaining
step is a bijection of the running state for a fixed input value, so two tuples that differ in one
value never collide through that value alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_START = 0x243F6A8885A308D3  # digits of pi: an arbitrary non-zero starting state

# A 53-bit mantissa gives uniformly spaced doubles in [0, 1) (the usual float64 construction).
_UNIFORM_SHIFT = 11
_UNIFORM_SCALE = 2.0**-53


def _finalize(z: int) -> int:
    """splitmix64's output function on a Python int (a bijection of 64-bit words)."""
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    return z ^ (z >> 31)


def _finalize_array(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 arrays (numpy multiplication wraps modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MUL1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MUL2)
    return z ^ (z >> np.uint64(31))


def _start_state(length: int) -> int:
    # The tuple length enters the starting state so that (a, b) and (a, b, 0) differ.
    return _finalize((_START + length * _GOLDEN_GAMMA) & _MASK64)


def _absorb(state: int, value: int) -> int:
    return _finalize(((state ^ (value & _MASK64)) + _GOLDEN_GAMMA) & _MASK64)


def mix64(*values: int) -> int:
    """A 64-bit hash of a tuple of integers (splitmix64 finaliser chained over the values).

    Negative values are taken modulo 2**64. The result is an int in [0, 2**64).
    """
    state = _start_state(len(values))
    for value in values:
        state = _absorb(state, int(value))
    return state


def mix64_array(prefix: Sequence[int], *arrays: np.ndarray) -> np.ndarray:
    """``mix64(*prefix, *elements)`` evaluated elementwise over broadcast integer arrays.

    The scalar prefix is hashed once in Python; only the array part runs vectorised, so hashing
    a batch costs a few numpy passes whatever the prefix length.
    """
    state = _start_state(len(prefix) + len(arrays))
    for value in prefix:
        state = _absorb(state, int(value))
    hashed = np.asarray(np.uint64(state))
    with np.errstate(over="ignore"):
        for values in arrays:
            words = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
            hashed = _finalize_array((hashed ^ words) + np.uint64(_GOLDEN_GAMMA))
    return hashed


def uniforms_from_hashes(hashes: np.ndarray) -> np.ndarray:
    """Map uint64 hashes to float64 in [0, 1) using their top 53 bits."""
    return (hashes >> np.uint64(_UNIFORM_SHIFT)).astype(np.float64) * _UNIFORM_SCALE


def example_uniforms(seed: int, epoch: int, indices: np.ndarray, count: int) -> np.ndarray:
    """Uniform [0, 1) numbers ``u[n, j]`` that depend only on (seed, epoch, indices[n], j).

    Shape (len(indices), count), float64. ``u[n, j]`` equals
    ``(mix64(seed, epoch, indices[n], j) >> 11) * 2**-53``, whatever else is in the batch.
    """
    rows = np.asarray(indices, dtype=np.int64).reshape(-1, 1)
    cols = np.arange(count, dtype=np.int64).reshape(1, -1)
    hashes = mix64_array((seed, epoch), rows, cols)
    return uniforms_from_hashes(np.broadcast_to(hashes, (rows.shape[0], count)))


def example_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A torch.Generator seeded by ``mix64(seed, epoch, index)`` for one example's augmentation."""
    generator = torch.Generator()
    generator.manual_seed(mix64(seed, epoch, index))
    return generator

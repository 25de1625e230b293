"""Compiles the optional CPU LARS and LAMB kernels at install time; the rest is in pyproject.toml.

The kernels are plain C loaded through ctypes (bigbatch/optim/lars_kernel.py, lamb_kernel.py), so
building them needs only a C compiler. Where none works the build goes on without them
(``optional=True``) and LARS and LAMB run their eager paths.
"""

import sys

from setuptools import Extension, setup

FLAGS = ["-O3", "-ffp-contract=off"]  # no fused multiply-add: the same bits on every CPU
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []
SHARED = ["src/bigbatch/optim/_chunked_sums.h"]


def kernel(name: str, flags: list[str]) -> Extension:
    return Extension(f"bigbatch.optim.{name}", [f"src/bigbatch/optim/{name}.c"], depends=SHARED,
                     extra_compile_args=FLAGS + flags + OPENMP, extra_link_args=OPENMP,
                     optional=True)


# -fno-math-errno lets sqrt vectorize (IEEE sqrt is correctly rounded: the same bits).
setup(ext_modules=[kernel("_lars_kernel", []), kernel("_lamb_kernel", ["-fno-math-errno"])])

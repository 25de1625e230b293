"""Compiles the optional CPU LARS kernel at install time; everything else is in pyproject.toml.

The kernel is plain C loaded through ctypes (bigbatch/optim/lars_kernel.py), so building it needs
only a C compiler. Where none works the build goes on without it (``optional=True``) and LARS runs
its eager path.
"""

import sys

from setuptools import Extension, setup

FLAGS = ["-O3", "-ffp-contract=off"]  # no fused multiply-add: the same bits on every CPU
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []

setup(ext_modules=[Extension(
    "bigbatch.optim._lars_kernel", ["src/bigbatch/optim/_lars_kernel.c"],
    extra_compile_args=FLAGS + OPENMP, extra_link_args=OPENMP, optional=True)])

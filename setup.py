"""Build of the C/Cython engine extension; all other metadata lives in pyproject.toml.

NOTE: every C file is compiled with the same portable flags. SIMD variants select their
instruction set per file (`#pragma GCC target`), and dispatch.c picks one at load time from
cpuid, so one build runs on CPUs with and without AVX2.
"""

import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = sorted(
    os.path.relpath(p, HERE)
    for p in glob.glob(os.path.join(HERE, "engine_ext", "csrc", "**", "*.c"), recursive=True)
)

extensions = [
    Extension(
        "slotserve.engine_ext._engine",
        sources=["engine_ext/_engine.pyx", *CSRC],
        include_dirs=["engine_ext/csrc", numpy.get_include()],
        extra_compile_args=["-O3", "-std=c11", "-fno-math-errno", "-Wall", "-Wno-unused-function"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        libraries=["pthread", "m"],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["engine_ext"],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False},
    )
)

# cython: language_level=3, boundscheck=False, wraparound=False
"""The C engine behind Python: `Engine` owns the C memory (weights are borrowed from the model
file's memory map, which it keeps alive); `KernelTable` exposes single kernels for tests.

Design: this module converts and forwards; the contracts (validation, records, snapshots, the
fault hook) live in pool.py. Every call into C that does real work releases the GIL. One
extension module, its parts in include files that each own one thing:

    _engine.pyx         kernel variants (selection, what this CPU runs) and the C helpers
                        benchmarks call (row bytes, peaks, the read probe, tile counters)
    _model_desc.pxi     a ModelFile -> the C model description (model_desc, layer_weights)
    _engine_class.pxi   `Engine`: the forward pass, KV and recurrent-state snapshots and copies
    _kernel_table.pxi   `KernelTable`: single kernels on NumPy arrays, and their operand checks

NOTE: include files, not modules: one extension, one copy of the kernels and their counters.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

import numpy as np

from kernels cimport *

KERNEL_NAMES = ("auto", "scalar", "avx2", "avx512vnni")


cdef const kernel_table *_select(str name) except NULL:
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel variant {name!r}; choose one of {', '.join(KERNEL_NAMES)}")
    cdef bytes raw = name.encode()
    cdef const kernel_table *kt = kernels_select(raw)
    if kt == NULL:
        raise ValueError(f"kernel variant {name!r} is not supported by this CPU; use 'auto' or 'scalar'")
    return kt


def resolve_variant(str name) -> str:
    """The kernel variant `name` ('auto', 'scalar', 'avx2', 'avx512vnni') selects on this CPU."""
    return _select(name).name.decode()


def avx2_supported() -> bool:
    return bool(kernels_avx2_supported())


def avx512vnni_supported() -> bool:
    return bool(kernels_avx512vnni_supported())


def peak_macs(str mix, long iters) -> int:
    """int8 products computed by `iters` rounds of an instruction mix ('vnni512', 'vnni256',
    'avx2'; kernels.h kernel_peak_macs), 0 if this CPU lacks it. Runs without the GIL."""
    cdef bytes raw = mix.encode()
    cdef const char *name = raw
    cdef long done
    with nogil:
        done = kernel_peak_macs(name, iters)
    return done


def read_sum(const uint8_t[::1] buf) -> int:
    """The wrapping 64-bit sum of `buf` read as little-endian words, a tail under 8 bytes byte by
    byte (kernels.h kernel_read_sum): every byte read once, in order, without the GIL (the
    memory-read probe of `bench versus --probe`)."""
    cdef size_t n = buf.shape[0]
    cdef uint64_t total
    if n == 0:
        return 0
    with nogil:
        total = kernel_read_sum(&buf[0], n)
    return total


def avx2_tile_pairs(int ggml_type) -> int:
    """(activation row, output) pairs the avx2 variant's prefill tiles (arch/x86_avx2_tiles.c)
    computed for weights of this ggml type since the process started, over all threads (0 off
    x86): a call of whole 16-row tiles on a tiled type adds rows x whole-group outputs."""
    return gemm_tiles_avx2_pairs(ggml_type)


def row_bytes(int ggml_type, int k) -> int:
    return ggml_row_bytes(ggml_type, k)




include "_model_desc.pxi"
include "_engine_class.pxi"
include "_kernel_table.pxi"

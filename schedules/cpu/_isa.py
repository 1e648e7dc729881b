"""What a CPU target offers a schedule: its vector width and vector register count.

Taken from the target's features (after its ``mattr``), never from the CPU's name or a constant:
AVX-512 has 32 registers of 512 bits, AVX/AVX2 16 of 256, SSE 16 of 128, AArch64 NEON 32 of
128 (SVE is planned at its 128-bit minimum: its length is only known at run time). A micro-kernel
sized from these stays in registers on every ISA instead of spilling on the smaller ones.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["VectorUnit", "vector_unit", "features", "register_rows"]


@dataclass(frozen=True)
class VectorUnit:
    bits: int                  # width of one vector register
    registers: int             # architectural vector registers

    def lanes(self, dtype: str) -> int:
        """Elements of ``dtype`` per vector register."""
        return max(1, self.bits // _bits(dtype))

    def vectors(self, elements: int, dtype: str) -> int:
        """Registers that ``elements`` contiguous values of ``dtype`` occupy."""
        lanes = self.lanes(dtype)
        return -(-elements // lanes)


def _bits(dtype: str) -> int:
    import tvm
    return tvm.DataType(str(dtype)).bits


def vector_unit(target) -> VectorUnit:
    """The vector unit of an LLVM ``tvm.target.Target``."""
    return _unit(str(target.attrs.get("mtriple", "") or ""), features(target))


def features(target) -> frozenset:
    """Every LLVM feature of an LLVM ``tvm.target.Target`` (its mcpu's, after its mattr)."""
    return _features(str(target))


@functools.lru_cache(maxsize=64)
def _features(text: str) -> frozenset:       # by the target's JSON: Targets hash by identity
    import tvm
    from tvm.target import codegen
    return frozenset(codegen.llvm_get_cpu_features(tvm.target.Target(text)))


@functools.lru_cache(maxsize=32)
def _unit(triple: str, features: frozenset) -> VectorUnit:
    if triple.startswith(("aarch64", "arm64")) or "neon" in features:
        return VectorUnit(128, 32)
    if "avx512f" in features:
        return VectorUnit(512, 32)
    if "avx" in features:
        return VectorUnit(256, 16)
    return VectorUnit(128, 16)


def register_rows(unit: VectorUnit, width: int, dtype: str, *, most: int, spare: int = 2) -> int:
    """The most rows (a power of two, at most ``most``, at least 1) of ``width`` accumulators each
    that fit in the vector registers together with one broadcast per row and ``spare`` registers
    for the streamed operand."""
    per_row = unit.vectors(width, dtype)
    rows = 1
    while rows * 2 <= most and (rows * 2) * (per_row + 1) + spare <= unit.registers:
        rows *= 2
    return rows

"""Debugging aids."""
import os

from . import _C


def dump_graphs(directory):
    """Writes every graph DeferAndFuse runs from now on as a StableHLO module (MLIR text) into
    `directory` (graph_00000.stablehlo.mlir, ...); None turns it off. The environment
    variable TORCH_TPU_DUMP_GRAPHS=<dir> does the same from start-up."""
    _C.set_dump_dir(None if directory is None else os.fspath(directory))

"""torch.compile(backend="tpu").

TorchDynamo captures the graph; AOTAutograd splits it into forward and backward graphs of
core ATen ops (functionalized, with input mutations such as optimizer state or BatchNorm
running statistics applied to the real tensors after the graph). Each graph is lowered by
checking that every node has a tpu kernel, then runs as ONE DeferAndFuse trace: the same
IR, fusion compiler and three-tier cache as eager DeferAndFuse (one compiler, two front
doors). Graph breaks run their eager pieces in the current eager mode.

    model = torch.compile(model, backend="tpu", options={"precision": "high"})

Options: see OPTIONS; unknown keys raise ValueError naming the valid ones.
"""
import contextlib
import os
import warnings

import torch

from . import _C, dynamic
from .modes import get_eager_mode, set_eager_mode

OPTIONS = {
    "precision": "float32 matmul precision inside compiled graphs: medium, high or highest "
                 "(default: the current torch.tpu precision)",
    "fallback_eager": "bool: allow nodes without a tpu kernel (reported with a warning) "
                      "instead of raising LoweringError",
    "dump_graphs": "directory: write each compiled graph as StableHLO-style text",
    "buckets": "increasing list of positive ints: the sizes dynamic dims pad up to (default: "
               "the next power of two); sizes above the last bound run at their exact size",
    "pad_dynamic": "bool (default True): run graphs with dynamic sizes at bucket sizes with "
                   "masking (torch_tpu/dynamic.py); False runs them at their exact sizes",
}


class LoweringError(RuntimeError):
    """A node of a compiled graph has no tpu lowering."""


_STRUCTURAL = {"placeholder", "output", "get_attr"}
_KEYS = ("PrivateUse1", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
         "CompositeImplicitAutograd")


def _has_tpu_kernel(op):
    name = op.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in _KEYS)


def unsupported_nodes(gm):
    """(node name, target) of call_function nodes that have no tpu kernel."""
    bad = []
    for node in gm.graph.nodes:
        if node.op in _STRUCTURAL or node.op != "call_function":
            continue
        t = node.target
        if isinstance(t, torch._ops.OpOverload):
            if not _has_tpu_kernel(t):
                bad.append((node.name, str(t)))
        elif isinstance(t, torch._ops.HigherOrderOperator):
            bad.append((node.name, str(t)))
        # Python callables (operator.getitem, ...) run as they are
    return bad


def _check_options(options):
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"torch.compile(backend='tpu'): unknown option(s) {unknown}; valid "
                         f"options are {sorted(OPTIONS)}")
    if "precision" in options and options["precision"] not in ("medium", "high", "highest"):
        raise ValueError(f"torch.compile(backend='tpu'): option precision="
                         f"{options['precision']!r}; expected 'medium', 'high' or 'highest'")
    if "pad_dynamic" in options and not isinstance(options["pad_dynamic"], bool):
        raise ValueError(f"torch.compile(backend='tpu'): option pad_dynamic="
                         f"{options['pad_dynamic']!r}; expected True or False")
    if "buckets" in options:
        options["buckets"] = dynamic.check_buckets(options["buckets"])
    return options


def _lower(gm, options, what):
    bad = unsupported_nodes(gm)
    if bad:
        listing = ", ".join(f"{n} ({t})" for n, t in bad[:10])
        if not options.get("fallback_eager"):
            raise LoweringError(f"torch.compile(backend='tpu'): cannot lower {len(bad)} node(s) "
                                f"of the {what} graph: {listing}; no tpu kernel. Pass "
                                f"options={{'fallback_eager': True}} to run them eagerly.")
        warnings.warn(f"torch.compile(backend='tpu'): {len(bad)} node(s) of the {what} graph "
                      f"run eagerly outside the fused graph: {listing}")
    return gm


@contextlib.contextmanager
def _as_one_graph(options):
    """Runs the body as one DeferAndFuse trace, materialized at the end."""
    prev = get_eager_mode()
    if prev != "defer_and_fuse":
        set_eager_mode("defer_and_fuse")
    if options.get("dump_graphs"):
        _C.set_dump_dir(os.fspath(options["dump_graphs"]))
    prec = contextlib.nullcontext()
    if options.get("precision"):
        prec = torch.tpu.precision(options["precision"])
    _C.set_whole_graph(True)
    try:
        with prec:
            yield
    finally:
        _C.set_whole_graph(False)
        try:
            _C.materialize()
        finally:
            if options.get("dump_graphs"):
                _C.set_dump_dir(None)
            if prev != "defer_and_fuse":
                set_eager_mode(prev)


def _make_compiler(options, what, layouts):
    def compiler(gm, example_inputs):
        _lower(gm, options, what)
        dynamic._count("aot_graphs")

        def run(*args):
            with _as_one_graph(options):
                return gm(*args)

        run._boxed_call = False
        if options.get("pad_dynamic", True) and dynamic.has_symbolic_sizes(gm):
            dynamic._count("dynamic_graphs")

            def run_bucket(bucket_gm, *args):
                with _as_one_graph(options):
                    return bucket_gm(*args)
            bucketed = dynamic.BucketedGraph(gm, options, what, layouts, run, run_bucket)
            bucketed._boxed_call = False
            return bucketed
        return run
    return compiler


def tpu_backend(gm, example_inputs, options=None, **kwargs):
    """The torch.compile backend "tpu" (registered through the torch_dynamo_backends entry
    point and at import)."""
    if kwargs:
        raise ValueError(f"torch.compile(backend='tpu'): unexpected arguments {sorted(kwargs)}")
    options = _check_options(options)
    from torch._dynamo.backends.common import aot_autograd
    from torch._decomp import core_aten_decompositions
    layouts = {}  # forward outputs' padded layouts, read by the backward (dynamic.py)
    backend = aot_autograd(fw_compiler=_make_compiler(options, "forward", layouts),
                           bw_compiler=_make_compiler(options, "backward", layouts),
                           inference_compiler=_make_compiler(options, "inference", layouts),
                           decompositions=core_aten_decompositions(),
                           keep_inference_input_mutations=True)
    compiled = backend(gm, example_inputs)
    dynamic._count("dynamo_graphs")  # after: Dynamo may restart an analysis by raising
    return compiled


def _register():
    try:
        from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    except Exception:  # dynamo unavailable: torch.compile is not usable anyway
        return
    if "tpu" not in _COMPILER_FNS:
        register_backend(tpu_backend, name="tpu")


def export_stablehlo(fn, *example_args):
    """Runs fn once on the example arguments as one DeferAndFuse graph and returns the
    StableHLO-style text of the graph that ran (the forward computation)."""
    import tempfile
    torch.tpu.synchronize()
    with tempfile.TemporaryDirectory() as d:
        with _as_one_graph({"dump_graphs": d}):
            with torch.no_grad():
                out = fn(*example_args)  # alive at the flush: its graph is kept
        del out
        texts = [open(os.path.join(d, f)).read() for f in sorted(os.listdir(d))]
    return "\n".join(texts)

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

from . import _C, attention_pattern, dynamic

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


def _functionalized_op_ok(node):
    """A custom op that mutates arguments (torch_tpu.kernels, torch.library) appears in
    AOTAutograd's graphs wrapped in auto_functionalized(_v2): running the node clones the
    mutated inputs and calls the op, which is fine when the op has a tpu kernel."""
    if getattr(node.target, "__name__", "") not in ("auto_functionalized", "auto_functionalized_v2"):
        return False
    op = node.args[0] if node.args else None
    return isinstance(op, torch._ops.OpOverload) and _has_tpu_kernel(op)


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
            if not _functionalized_op_ok(node):
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
    # the calling thread's mode only: other threads keep theirs
    prev = _C.set_thread_eager_mode("defer_and_fuse")
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
            _C.set_thread_eager_mode(prev)


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


# Ops that core ATen decompositions split into pieces although the host target runs each as
# one kernel (the ones Strict runs): layer norm's backward (row and column sums), the softmax
# backwards, embedding's backward (an accumulating index_put when decomposed), the NLL loss,
# and the activations and their backwards that the element-wise inventory computes in one
# step (gelu_backward alone decomposes into 11 nodes, each a fused-kernel operand).
# Graphs of static sizes on the host target keep them whole; graphs with symbolic sizes take
# the pieces, whose padding rules dynamic.py knows. TORCH_TPU_COMPILE_DECOMPOSE=all takes the
# pieces everywhere (comparisons, bisecting).
HOST_KEPT_OPS = ("native_layer_norm_backward", "_softmax_backward_data",
                 "_log_softmax_backward_data", "embedding_dense_backward", "nll_loss_forward",
                 "nll_loss_backward", "gelu_backward", "silu", "silu_backward",
                 "sigmoid_backward", "tanh_backward", "hardtanh_backward", "hardsigmoid_backward")


def _dynamo_graph_is_static(gm):
    """Whether no input of Dynamo's graph has a symbolic size (its placeholders carry
    example_value where AOTAutograd's carry val)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(v, torch.SymInt):
            return False
        if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape):
            return False
    return True


def _decompositions(gm):
    from torch._decomp import core_aten_decompositions
    table = core_aten_decompositions()
    if (_C.target() != "host" or not _dynamo_graph_is_static(gm) or
            os.environ.get("TORCH_TPU_COMPILE_DECOMPOSE") == "all"):
        return table
    kept = {getattr(torch.ops.aten, n) for n in HOST_KEPT_OPS}
    return {op: fn for op, fn in table.items() if op.overloadpacket not in kept}


# torch.compile's `mode` names Inductor's presets; the tpu backend has one way to compile, so
# each accepted name runs the same pipeline ("reduce-overhead" replays whole graphs already:
# a compiled graph is one cached executable, the role CUDA graphs play for Inductor).
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def tpu_backend(gm, example_inputs, options=None, mode=None, **kwargs):
    """The torch.compile backend "tpu" (registered through the torch_dynamo_backends entry
    point and at import)."""
    if kwargs:
        raise ValueError(f"torch.compile(backend='tpu'): unexpected arguments {sorted(kwargs)}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"torch.compile(backend='tpu'): mode={mode!r}; expected one of "
                         f"{list(MODES)}")
    options = _check_options(options)
    from torch._dynamo.backends.common import aot_autograd
    layouts = {}  # forward outputs' padded layouts, read by the backward (dynamic.py)
    backend = aot_autograd(fw_compiler=_make_compiler(options, "forward", layouts),
                           bw_compiler=_make_compiler(options, "backward", layouts),
                           inference_compiler=_make_compiler(options, "inference", layouts),
                           decompositions=_decompositions(gm),
                           keep_inference_input_mutations=True)
    if _C.target() == "host" and _dynamo_graph_is_static(gm):
        # hand-written attention becomes sdpa, which the host target runs fused
        n = attention_pattern.rewrite(gm)
        if n:
            dynamic._count("attention_patterns", n)
    # attention traces as the fused ops (one node per direction; attention.cpp), on the host
    # target for static sizes; the runtime runs each as one kernel call
    prev = _C.set_sdpa_traced(True)
    try:
        compiled = backend(gm, example_inputs)
    finally:
        _C.set_sdpa_traced(prev)
    dynamic._count("dynamo_graphs")  # after: Dynamo may restart an analysis by raising
    return compiled


def _register():
    try:
        from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    except Exception:  # dynamo unavailable: torch.compile is not usable anyway
        return
    if "tpu" not in _COMPILER_FNS:
        register_backend(tpu_backend, name="tpu")


class ExportedStableHLO(str):
    """The StableHLO text of one graph (a ``str``), with what a caller needs to run it:

    - ``parameters``: for each ``%argK`` of ``@main``, the tpu tensor (a view of live device
      memory) whose values it takes, or None where no live tensor holds that memory;
    - ``outputs``: for each tensor fn returned (flattened), the index of the result of
      ``@main`` that holds it;
    - ``custom_calls``: the ops emitted as ``stablehlo.custom_call`` (no StableHLO mapping
      yet), e.g. ``["aten.sort.stable"]``; empty when the module is pure StableHLO.
    """
    parameters: list
    outputs: list
    custom_calls: list


_ATTR_RE = r'\{tpu\.buffer = "(0x[0-9a-fA-F]+)"(?:, tpu\.strides = array<i64(?:: ([-0-9, ]+))?>)?\}'
_TYPE_RE = r"tensor<((?:\d+x)*)(\w+)>"
_MLIR_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
                "bf16": torch.bfloat16, "i64": torch.int64, "i32": torch.int32,
                "i16": torch.int16, "i8": torch.int8, "ui8": torch.uint8, "i1": torch.bool}


def _signature(text):
    """[(sizes, dtype, address, strides)] of @main's arguments and of its results."""
    import re
    head = text[text.index("func.func @main("):]
    head = head[:head.index(") {\n")]
    args, _, res = head.partition(") -> (")
    out = []
    for part in (args, res):
        items = []
        for m in re.finditer(_TYPE_RE + " " + _ATTR_RE, part):
            sizes = [int(x) for x in m.group(1).split("x") if x]
            strides = [int(x) for x in m.group(4).split(",")] if m.group(4) else None
            if strides is None:
                strides, acc = [], 1
                for n in reversed(sizes):
                    strides.insert(0, acc)
                    acc *= n
            items.append((sizes, _MLIR_DTYPES.get(m.group(2)), int(m.group(3), 16), strides))
        out.append(items)
    return out


def _tensor_at(address, dtype, sizes, strides, candidates):
    """A view (sizes, strides) of the live tpu tensor whose storage holds `address`."""
    for t in candidates:
        if t.dtype != dtype:
            continue
        st = t.untyped_storage()
        try:
            base = st.data_ptr()
        except RuntimeError:
            continue  # a fake or functional tensor left alive by some trace: it holds no memory
        if base <= address < base + st.nbytes():
            off = address - base
            if off % t.element_size() == 0:
                return t.detach().as_strided(sizes, strides, off // t.element_size())
    return None


def export_stablehlo(fn, *example_args):
    """Runs fn once on the example arguments as one DeferAndFuse graph and returns the StableHLO
    module of that graph (the forward computation) as an ExportedStableHLO (a str).

    Parameters of ``@main`` are the device memory the graph reads (inputs and weights, never
    folded into constants); results are the values it leaves in live memory: fn's outputs,
    and any tensor it mutated in place. Ops without a StableHLO mapping are emitted as
    ``stablehlo.custom_call @aten.<op>`` with their types (the text still parses) and are
    listed in ``.custom_calls`` and reported with a warning."""
    import gc
    import tempfile
    from torch.utils._pytree import tree_flatten

    def whole(t):
        # an output that is part of a larger buffer gets its own, so that it is one result
        if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
            return t
        if (t.is_contiguous() and t.storage_offset() == 0 and
                t.numel() * t.element_size() == t.untyped_storage().nbytes()):
            return t
        return t.clone()

    torch.tpu.synchronize()
    with tempfile.TemporaryDirectory() as d:
        with _as_one_graph({"dump_graphs": d}):
            with torch.no_grad():
                flat = [whole(t) for t in tree_flatten(fn(*example_args))[0]]
        texts = []
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name)) as f:
                texts.append(f.read())
    if len(texts) != 1:
        raise RuntimeError(f"export_stablehlo: fn ran as {len(texts)} graphs; it must run as one "
                           f"(no .item(), printing or data-dependent ops inside it)")
    text = ExportedStableHLO(texts[0])
    params, results = _signature(text)
    candidates = [t for t in tree_flatten(example_args)[0] if isinstance(t, torch.Tensor)]
    # weights and other tensors fn reads: any live tpu tensor (type(), not isinstance: no
    # attribute lookups on arbitrary objects)
    candidates += [o for o in gc.get_objects()
                   if issubclass(type(o), torch.Tensor) and o.device.type == "tpu"]
    candidates = [t for t in candidates if t.device.type == "tpu"]
    text.parameters = [_tensor_at(a, dt, sz, st, candidates) for sz, dt, a, st in params]
    addr = {r[2]: i for i, r in enumerate(results)}
    text.outputs = [addr.get(t.data_ptr()) if isinstance(t, torch.Tensor) else None for t in flat]
    import re
    m = re.search(r"tpu\.custom_calls = \[([^\]]*)\]", text)
    text.custom_calls = re.findall(r'"([^"]+)"', m.group(1)) if m else []
    if text.custom_calls:
        warnings.warn(f"export_stablehlo: {len(text.custom_calls)} op(s) have no StableHLO mapping "
                      f"yet and were emitted as stablehlo.custom_call: {text.custom_calls}")
    return text

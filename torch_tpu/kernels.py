"""Custom kernels as PyTorch ops (``torch_tpu.kernels``).

A kernel written for the device becomes a real ``torch.library.custom_op``:
callable eagerly, traced as one node in DeferAndFuse graphs and in
``torch.compile(backend="tpu")`` graphs, differentiable through
``register_autograd``.

* Host target: C source against the kernel ABI (``header_text()``,
  ``header_path()``), compiled once by the system C compiler through the
  runtime's three-tier compilation cache (keyed by the source): ``c_op``.
* pjrt target: StableHLO text (``stablehlo_op``), or a JAX function lowered to
  StableHLO for each input signature (``jax_op``; jax is imported only then).

The decorated function gives the op its schema (from its annotations, as
``torch.library.custom_op`` infers it) and allocates its outputs: it receives
the op's arguments and returns fresh, empty tensors of the outputs' shapes and
dtypes (or None). It runs on the real inputs before each call and on fake
tensors under ``torch.compile``, so it must not read tensor data::

    SRC = r'''
    static void body(void* ctx, int64_t b, int64_t e) { ... }
    int scaled_add(const tpuk_call_t* call) {
      ...
      call->parallel_for(n, 4096, body, &args);
      return 0;
    }
    '''

    @torch_tpu.kernels.c_op("mylib::scaled_add", SRC, entry="scaled_add")
    def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.empty_like(x)

    z = scaled_add(x, y, 0.5)            # x, y on tpu
"""
import functools
import hashlib
import inspect
import os
import re

import torch

__all__ = ["c_op", "stablehlo_op", "jax_op", "header_text", "header_path", "KernelCompileError",
           "KernelInfo"]

_C_LANG, _HLO_LANG = 0, 1


class KernelCompileError(RuntimeError):
    """A custom kernel's source did not compile; the message holds the compiler's output
    (with the kernel source's own line numbers)."""


class KernelInfo:
    """How a kernel definition got its executable: ``cache_tier`` 0 when it was compiled
    now, 1/2/3 when it came from that compilation-cache tier (-1: not compiled at
    definition, StableHLO), ``compile_seconds``, ``key`` (the cache key)."""

    def __init__(self, d):
        self.cache_tier = d["cache_tier"]
        self.compile_seconds = d["compile_seconds"]
        self.key = d["key"]

    def __repr__(self):
        return (f"KernelInfo(cache_tier={self.cache_tier}, "
                f"compile_seconds={self.compile_seconds:.3f}, key={self.key!r})")


def _C():
    from torch_tpu import _C as c
    return c


def header_text():
    """The kernel ABI header's text (``torch_tpu_kernel.h``; every C kernel includes it
    implicitly)."""
    return _C()._kernel_header()[1]


def header_path(directory=None):
    """Writes the kernel ABI header into ``directory`` (default: ``include`` under the
    persistent compilation cache root, ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` or
    ``~/.cache/torch_tpu``) when it is missing or differs, and returns the file's path,
    for editors and for compiling kernels outside torch_tpu."""
    name, text = _C()._kernel_header()
    if directory is None:
        root = os.environ.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")
        if not root or root == "disabled":
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            root = os.path.join(base, "torch_tpu")
        directory = os.path.join(root, "include")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _define(name, lang, source, entry, cflags=""):
    try:
        return _C()._kernel_define(name, lang, source, entry, cflags)
    except RuntimeError as e:
        if "compilation failed" in str(e) or "defines no exported function" in str(e):
            raise KernelCompileError(str(e)) from None
        raise


def _flat_outputs(outs, name):
    if outs is None:
        return []
    if isinstance(outs, torch.Tensor):
        return [outs]
    if isinstance(outs, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in outs):
        return list(outs)
    raise TypeError(f"{name}: the decorated function must return a tensor, a tuple of tensors "
                    f"or None (the outputs to fill), got {type(outs).__name__}")


def _mutated_mask(sig, mutates_args, name):
    params = list(sig.parameters)
    if mutates_args == "unknown":
        raise ValueError(f"{name}: name the mutated arguments (mutates_args=(...)); "
                         "'unknown' is not supported for kernels")
    mask = 0
    for a in mutates_args:
        if a not in params:
            raise ValueError(f"{name}: mutates_args names {a!r}, which is not an argument "
                             f"(arguments: {params})")
        mask |= 1 << params.index(a)
    return mask


def _register(name, outputs_fn, call, mutates_args, schema, backward, setup_context, info):
    """The custom op: its tpu implementation allocates with outputs_fn and calls
    call(arguments in schema order, flat outputs); outputs_fn is also the fake."""
    sig = inspect.signature(outputs_fn)
    mask = _mutated_mask(sig, mutates_args, name)

    @functools.wraps(outputs_fn)
    def tpu_impl(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        outs = outputs_fn(*args, **kwargs)
        call(list(bound.arguments.values()), _flat_outputs(outs, name), mask)
        return outs

    op = torch.library.custom_op(name, tpu_impl, mutates_args=tuple(mutates_args),
                                 device_types="tpu", schema=schema)
    op.register_fake(outputs_fn)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    op.kernel_info = info
    return op


def _kernel_call(handle):
    c = _C()

    def call(args, outs, mask):
        c._kernel_call(handle, args, outs, mask)
    return call


def c_op(name, source, *, entry=None, mutates_args=(), schema=None, cflags=(), backward=None,
         setup_context=None):
    """Decorator: a C kernel for the host target as the custom op ``name``
    ("namespace::op").

    ``source`` is a C translation unit written against the kernel ABI (see
    ``header_text()``: ``tpuk_call_t`` with the tensor arguments ``in[]`` in schema
    order, the outputs ``out[]``, the number arguments ``num[]`` / ``inum[]``, and
    ``parallel_for``); ``entry`` names its function ``int entry(const tpuk_call_t*)``
    (default: the op's name after ``::``). It is compiled now with the system C
    compiler (``TORCH_TPU_CC``; ``cflags`` adds flags) through the compilation cache,
    so defining it again with the same source loads the cached library. A compile
    error raises ``KernelCompileError`` with the compiler's messages.

    The decorated function declares the schema and allocates the outputs (see the
    module's documentation). ``mutates_args`` names the arguments the kernel writes
    (it may write only those and its outputs; Debug mode checks both and the outputs'
    bounds). ``backward`` / ``setup_context`` are passed to ``register_autograd``.
    Returns the ``torch.library.CustomOpDef``; ``.kernel_info`` tells whether the
    library was compiled or came from the cache."""
    if entry is None:
        entry = name.split("::")[-1]
    flags = " ".join(cflags) if not isinstance(cflags, str) else cflags

    def deco(outputs_fn):
        d = _define(name, _C_LANG, source, entry, flags)
        return _register(name, outputs_fn, _kernel_call(d["op"]), mutates_args, schema,
                         backward, setup_context, KernelInfo(d))
    return deco


# ---- StableHLO ----
_FUNC_RE = re.compile(r"func\.func\s+(?:(?:public|private|nested)\s+)?@(\"[^\"]+\"|[\w$.]+)")


def _match_brace(text, j):
    """The index of the '}' closing the '{' at j (strings skipped)."""
    depth = 0
    while j < len(text):
        ch = text[j]
        if ch == '"':
            j = text.index('"', j + 1)
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise ValueError("unbalanced braces in the StableHLO text")


def _functions(text):
    """(symbol, definition text) of each func.func of a module's text (or of bare
    definitions)."""
    out = []
    for m in _FUNC_RE.finditer(text):
        j, paren = m.end(), 0
        # the body: the first '{' outside parentheses that does not open the
        # function's `attributes {...}` dictionary
        while j < len(text):
            ch = text[j]
            if ch == '"':
                j = text.index('"', j + 1)
            elif ch == "(":
                paren += 1
            elif ch == ")":
                paren -= 1
            elif ch == "{" and paren == 0:
                if not text[m.end():j].rstrip().endswith("attributes"):
                    break
                j = _match_brace(text, j)
            j += 1
        out.append((m.group(1).strip('"'), text[m.start():_match_brace(text, j) + 1]))
    return out


def _prepare_stablehlo(name, text, entry):
    """Private definitions with symbols unique to this kernel, and the entry's new name."""
    fns = _functions(text)
    if not fns:
        raise ValueError(f"{name}: the StableHLO text defines no func.func")
    names = [n for n, _ in fns]
    if entry is None:
        entry = "main" if "main" in names else names[0]
    if entry not in names:
        raise ValueError(f"{name}: the StableHLO text defines no function @{entry} "
                         f"(functions: {names})")
    tag = "tpuk_" + hashlib.sha256(f"{name}\0{text}".encode()).hexdigest()[:12]
    renamed = {n: f"{tag}_{re.sub(r'[^0-9A-Za-z_]', '_', n)}" for n in names}
    pieces = []
    for n, body in fns:
        body = re.sub(r"func\.func\s+(?:(?:public|private|nested)\s+)?@", "func.func private @",
                      body, count=1)
        for old, new in renamed.items():
            body = re.sub(r"@(?:\"%s\"|%s)(?![\w$.])" % (re.escape(old), re.escape(old)), "@" + new, body)
        pieces.append(body)
    return "\n".join(pieces) + "\n", renamed[entry]


def _tensor_args_only(sig, name):
    for p in sig.parameters.values():
        ann = p.annotation
        if ann is not inspect.Parameter.empty and ann not in (torch.Tensor, "Tensor", "torch.Tensor"):
            raise TypeError(f"{name}: StableHLO kernels take tensor arguments only (argument "
                            f"{p.name!r} is {ann}); use jax_op for static number arguments")


def stablehlo_op(name, text, *, entry=None, mutates_args=(), schema=None, backward=None,
                 setup_context=None):
    """Decorator: a StableHLO kernel for the pjrt target as the custom op ``name``.

    ``text`` holds one or more ``func.func`` definitions (a whole module, e.g. from
    ``jax.jit(f).lower(...).as_text()``, or bare functions); ``entry`` names the one
    to call (default ``main``, else the first). It takes the op's tensor arguments in
    schema order and returns the outputs, then the new values of the arguments named
    in ``mutates_args``, with exactly the shapes and dtypes the calls use. Each call
    lowers to a ``func.call`` inside the program of its graph (one program per Strict
    call, one per DeferAndFuse or compiled graph), compiled and cached by the pjrt
    target with the rest of it. The decorated function declares the schema and
    allocates the outputs, as for ``c_op``."""
    funcs, symbol = _prepare_stablehlo(name, text, entry)

    def deco(outputs_fn):
        _tensor_args_only(inspect.signature(outputs_fn), name)
        d = _define(name, _HLO_LANG, funcs, symbol)
        return _register(name, outputs_fn, _kernel_call(d["op"]), mutates_args, schema,
                         backward, setup_context, KernelInfo(d))
    return deco


_JAX_DTYPES = {
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
    torch.float64: "float64", torch.int32: "int32", torch.int64: "int64", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}


def _lower_jax(fn, tensors, statics, order):
    """StableHLO text of fn at these tensor shapes/dtypes, with the number arguments
    (`statics`, by position) fixed."""
    import jax

    specs = []
    for t in tensors:
        if t.dtype not in _JAX_DTYPES:
            raise TypeError(f"jax_op: dtype {t.dtype} has no JAX equivalent")
        specs.append(jax.ShapeDtypeStruct(tuple(t.shape), _JAX_DTYPES[t.dtype]))

    def wrapped(*xs):
        it = iter(xs)
        args = [statics[i] if i in statics else next(it) for i in range(order)]
        return fn(*args)
    return jax.jit(wrapped).lower(*specs).as_text()


def jax_op(name, fn, *, mutates_args=(), schema=None, backward=None, setup_context=None):
    """Decorator: a JAX function as the custom op ``name`` on the pjrt target.

    ``fn`` takes the op's arguments (tensors as ``jax.Array``; numbers as Python
    numbers, fixed when lowering) and returns the outputs, then the new values of the
    arguments named in ``mutates_args``. It is lowered to StableHLO with ``jax.jit``
    (jax is imported at the first lowering) for each distinct signature of tensor
    shapes, dtypes and number values the op is called with; each lowering is a
    StableHLO kernel (see ``stablehlo_op``). The decorated function declares the schema
    and allocates the outputs, as for ``c_op``."""
    variants = {}
    c = _C()

    def call_for(args, outs, mask):
        tensors, statics, key = [], {}, []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                tensors.append(a)
                key.append((tuple(a.shape), a.dtype))
            else:
                statics[i] = a
                key.append(("static", a))
        key = tuple(key)
        handle = variants.get(key)
        if handle is None:
            text = _lower_jax(fn, tensors, statics, len(args))
            variant = f"{name}.v{len(variants)}"
            funcs, symbol = _prepare_stablehlo(variant, text, "main")
            handle = _define(variant, _HLO_LANG, funcs, symbol)["op"]
            variants[key] = handle
        tensor_args = [a if isinstance(a, torch.Tensor) else None for a in args]
        c._kernel_call(handle, tensor_args, outs, mask)

    def deco(outputs_fn):
        op = _register(name, outputs_fn, call_for, mutates_args, schema, backward,
                       setup_context, None)
        op.jax_variants = variants
        return op
    return deco

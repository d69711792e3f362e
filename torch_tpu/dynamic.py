"""Bounded dynamism for torch.compile(backend="tpu"): shape buckets with masking.

Dynamo with dynamic shapes (``dynamic=True``, ``torch._dynamo.mark_dynamic`` or its automatic
dynamic recompile) hands the backend graphs whose sizes are symbols. Each such graph runs
here at bucket sizes instead of its exact sizes: every symbol is rounded up to its bucket
(the next power of two, or the next bound of ``options["buckets"]``), the inputs are padded
with zeros to the bucket, the graph specialized to those sizes runs, and the outputs are
sliced back. One specialized graph is built per bucket, so a run over many lengths builds
at most one graph per bucket.

Padded elements hold arbitrary values (log(0), 0/0, ...), so the specializing pass tracks,
for every tensor dim, how it is made of symbols (a flattened ``B*T`` dim is the factors
``(B, T)``; valid elements of a factor are a prefix of it) and makes every op that mixes
elements along a padded dim see only valid ones:

- reductions (sum, amax, any, prod, argmax, ...) and softmax/log_softmax get padded
  elements replaced by the neutral value (0, -inf, False, 1, ...); mean and var divide
  by the real count;
- contractions (mm, bmm, addmm) zero both operands along a padded contraction dim;
- gathers/scatters/embeddings clamp padded index entries to 0, nll_loss gives padded
  targets the ignore_index, accumulating index_put adds zeros;
- size arguments (view, expand, full, arange, slice ends) get the bucket size while
  sizes used as values (the divisor of a mean, a select index) get the real size.

An op the pass cannot prove correct under padding (random ops, sorts and cumulative
ops over a padded dim, slices from the end, cat along a padded dim, mutations of padded
inputs, ops it does not know) makes that graph run at its exact size, counted in
``stats()["pad_fallbacks"]`` with the reason. Results never depend on the bucket.
"""
import math
import operator
import threading

import sympy
import torch

aten = torch.ops.aten

_lock = threading.Lock()
_STATS = {}


def _reset():
    with _lock:
        _STATS.clear()
        _STATS.update(dynamo_graphs=0, aot_graphs=0, dynamic_graphs=0, bucket_graphs=0,
                      padded_runs=0, exact_runs=0, pad_fallbacks={}, graphs_per_bucket={},
                      attention_patterns=0)


_reset()


def _count(key, n=1):
    with _lock:
        _STATS[key] += n


def _count_in(key, sub):
    with _lock:
        d = _STATS[key]
        d[sub] = d.get(sub, 0) + 1


def stats():
    """dynamo_graphs: graphs Dynamo handed to the backend (first compiles and recompiles);
    aot_graphs: forward/backward/inference graphs lowered; dynamic_graphs: those with
    symbolic sizes; bucket_graphs: graphs specialized to one bucket (at most one per
    graph and bucket); graphs_per_bucket: that count by bucket ("s0=2,s1=64");
    padded_runs / exact_runs: calls run at bucket sizes / at their exact sizes;
    pad_fallbacks: why graphs ran at exact sizes; attention_patterns: hand-written
    attentions replaced by one sdpa call (torch_tpu/attention_pattern.py)."""
    with _lock:
        out = dict(_STATS)
        out["pad_fallbacks"] = dict(_STATS["pad_fallbacks"])
        out["graphs_per_bucket"] = dict(_STATS["graphs_per_bucket"])
    return out


def reset_stats():
    _reset()


# ---- buckets ----

def check_buckets(value):
    """Validates options["buckets"]: a non-empty increasing list of positive ints."""
    ok = (isinstance(value, (list, tuple)) and len(value) > 0
          and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in value)
          and all(a < b for a, b in zip(value, value[1:])))
    if not ok:
        raise ValueError(f"torch.compile(backend='tpu'): option buckets={value!r}; expected a "
                         f"non-empty strictly increasing list of positive ints, e.g. "
                         f"[64, 128, 256, 512]")
    return tuple(value)


def bucket_of(n, buckets=None):
    """(bucket, lower) for size n: the bucket it pads to and the smallest size that pads to
    the same bucket; (None, None) when n is above the largest explicit bound."""
    if buckets is None:
        if n <= 2:
            return n, n
        b = 1 << (n - 1).bit_length()
        return b, b // 2 + 1
    prev = 0
    for b in buckets:
        if n <= b:
            return b, prev + 1
        prev = b
    return None, None


class _Unsupported(Exception):
    pass


# ---- symbolic helpers ----

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _is_sym_node(node):
    v = node.meta.get("val") if hasattr(node, "meta") else None
    return isinstance(v, _SYM_TYPES) or (isinstance(v, (int, float, bool))
                                         and node.op != "get_attr")


def _sym_expr(v):
    if isinstance(v, _SYM_TYPES):
        return v.node.expr
    return sympy.sympify(v)


def _is_tensor_node(node):
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def _evaluate(expr, values):
    r = expr.xreplace(values)
    if r.is_Integer:
        return int(r)
    if r.is_Boolean or r in (sympy.true, sympy.false):
        return bool(r)
    if r.is_number:
        return float(r)
    raise _Unsupported(f"cannot evaluate {expr}")


class _RealValue:
    """Callable node target: a symbolic expression at the real sizes of this call."""

    def __init__(self, expr, kind):
        self.expr, self.kind = expr, kind
        self.__name__ = "real_size"

    def __call__(self, ctx):
        v = self.expr.xreplace(ctx["reals"])
        return self.kind(v)


class _Bound:
    """Callable node target carrying constant data (layouts with sympy expressions) that
    FX code generation cannot print: fn(*node args, *consts)."""

    def __init__(self, fn, *consts):
        self.fn, self.consts = fn, consts
        self.__name__ = fn.__name__.lstrip("_")

    def __call__(self, *args):
        return self.fn(*args, *self.consts)


def _dim_mask(ctx, device, ndim, dim, facs):
    """Bool mask, broadcastable over an ndim tensor, of the valid positions of dim `dim`
    made of factors facs ((padded size, real-size expr or None), outer first)."""
    key = (str(device), ndim, dim, facs)
    m = ctx["masks"].get(key)
    if m is not None:
        return m
    n = math.prod(p for p, _ in facs)
    i = torch.arange(n, device=device)
    stride = 1
    for p, e in reversed(facs):
        if e is not None:
            r = int(e.xreplace(ctx["reals"]))
            digit = i if stride == 1 else torch.div(i, stride, rounding_mode="floor")
            if stride * p != n:
                digit = torch.remainder(digit, p)
            c = digit < r
            m = c if m is None else torch.logical_and(m, c)
        stride *= p
    shape = [1] * ndim
    shape[dim] = n
    m = m.view(shape)
    ctx["masks"][key] = m
    return m


def _neutral(kind, dtype):
    if dtype == torch.bool:
        return {"zero": False, "one": True, "ninf": False, "pinf": True, "false": False,
                "true": True}[kind]
    if dtype.is_floating_point:
        return {"zero": 0.0, "one": 1.0, "ninf": float("-inf"), "pinf": float("inf")}[kind]
    info = torch.iinfo(dtype)
    return {"zero": 0, "one": 1, "ninf": info.min, "pinf": info.max}[kind]


def _apply_mask(x, ctx, dims, kind):
    """x with the padded positions of dims ((dim, facs) pairs) replaced by `kind`'s
    neutral value (or by an int when kind is an int)."""
    m = None
    for d, facs in dims:
        md = _dim_mask(ctx, x.device, x.dim(), d, facs)
        m = md if m is None else torch.logical_and(m, md)
    v = kind if isinstance(kind, int) and not isinstance(kind, bool) else _neutral(kind, x.dtype)
    return torch.where(m, x, v)


def _pad_input(x, ctx, facs_per_dim):
    """Real-size tensor -> zero-padded bucket-size tensor (facs as in _dim_mask)."""
    reals = ctx["reals"]
    real_f, pad_f = [], []
    for facs in facs_per_dim:
        for p, e in facs:
            pad_f.append(p)
            real_f.append(p if e is None else int(e.xreplace(reals)))
    out = x.new_zeros(pad_f)
    out[tuple(slice(0, r) for r in real_f)] = x.reshape(real_f)
    return out.view([math.prod(p for p, _ in facs) for facs in facs_per_dim])


def _unpad_output(x, ctx, facs_per_dim):
    reals = ctx["reals"]
    real_f, pad_f, real_dims = [], [], []
    for facs in facs_per_dim:
        rd = 1
        for p, e in facs:
            r = p if e is None else int(e.xreplace(reals))
            pad_f.append(p)
            real_f.append(r)
            rd *= r
        real_dims.append(rd)
    if all(len(f) <= 1 for f in facs_per_dim):
        for d, facs in enumerate(facs_per_dim):
            if facs and facs[0][1] is not None:
                x = x.narrow(d, 0, real_dims[d])
        return x
    return x.reshape(pad_f)[tuple(slice(0, r) for r in real_f)].reshape(real_dims)


# ---- layouts ----
# A layout is a tuple (one entry per dim) of tuples of factors, outer first. A factor is an
# int (a size constant within this bucket) or a sympy expression holding at least one
# padded symbol (its padded size is the expression at the bucket sizes; its valid
# elements are the prefix as long as the expression at the real sizes).


def _norm(factors):
    out = []
    for f in factors:
        if isinstance(f, int):
            if f == 1:
                continue
            if out and isinstance(out[-1], int):
                out[-1] *= f
                continue
        out.append(f)
    return tuple(out)


class _Spec:
    """Specialization of one graph to one bucket assignment."""

    def __init__(self, bucket_vals, padded):
        self.B = {s: sympy.Integer(v) for s, v in bucket_vals.items()}
        self.padded = padded  # set of sympy symbols that are padded

    def factor(self, expr):
        """int if expr holds no padded symbol, else the expression."""
        expr = sympy.sympify(expr)
        if expr.free_symbols & self.padded:
            fixed = {s: v for s, v in self.B.items() if s not in self.padded}
            return expr.xreplace(fixed) if fixed else expr
        v = expr.xreplace(self.B)
        if not v.is_Integer:
            raise _Unsupported(f"size {expr} is not an integer")
        return int(v)

    def pad(self, f):
        if isinstance(f, int):
            return f
        v = f.xreplace(self.B)
        if not v.is_Integer:
            raise _Unsupported(f"size {f} is not an integer at the bucket")
        return int(v)

    def dim_size(self, dim):
        return math.prod(self.pad(f) for f in dim)

    def from_shape(self, shape):
        dims = []
        for s in shape:
            f = self.factor(_sym_expr(s))
            if not isinstance(f, int) and not (f.is_Symbol or len(f.free_symbols) == 1
                                               and f.is_Add):
                raise _Unsupported(f"size {f} has no known factor order")
            dims.append(_norm((f,)))
        return tuple(dims)

    def facs(self, dim):
        """Runtime description of a dim: ((padded, real expr or None), ...)."""
        return tuple((self.pad(f), None if isinstance(f, int) else f) for f in dim) or ((1, None),)


def _is_padded_dim(dim):
    return any(not isinstance(f, int) for f in dim)


def _layout_padded(lay):
    return any(_is_padded_dim(d) for d in lay)


def _view_layout(spec, in_lay, out_shape):
    flat = [f for d in in_lay for f in d]
    i = 0
    out = []
    for s in out_shape:
        rem = spec.factor(_sym_expr(s))
        rem = sympy.Integer(rem) if isinstance(rem, int) else rem
        dim = []
        while rem != 1:
            if i >= len(flat):
                raise _Unsupported("view: sizes do not match")
            f = flat[i]
            if isinstance(f, int):
                coeff, rest = rem.as_coeff_Mul()
                coeff = int(coeff) if coeff.is_Integer else 0
                if coeff and coeff % f == 0:
                    dim.append(f)
                    rem = rem / f
                    i += 1
                elif coeff > 1 and f % coeff == 0:
                    dim.append(coeff)
                    flat[i] = f // coeff
                    rem = rem / coeff
                else:
                    raise _Unsupported("view splits a padded dim")
            else:
                q = sympy.cancel(rem / f)
                if sympy.fraction(q)[1] != 1:
                    raise _Unsupported("view regroups a padded dim")
                dim.append(f)
                rem = q
                i += 1
        out.append(_norm(dim))
    if any(f != 1 for f in flat[i:]):
        raise _Unsupported("view: sizes do not match")
    return tuple(out)


def _broadcast(spec, lays, out_ndim):
    out = []
    for k in range(out_ndim):
        chosen = None
        for lay in lays:
            j = len(lay) - out_ndim + k
            if j < 0 or lay[j] == ():
                continue
            if chosen is None:
                chosen = lay[j]
            elif lay[j] != chosen:
                raise _Unsupported(f"broadcast of dims {chosen} and {lay[j]}")
        out.append(chosen if chosen is not None else ())
    return tuple(out)


# ---- the specializing pass ----

_POINTWISE_EXTRA = {
    "where", "_to_copy", "clone", "alias", "detach", "lift_fresh_copy", "contiguous",
    "full_like", "zeros_like", "ones_like", "empty_like", "clamp", "clamp_min", "clamp_max",
    "masked_fill", "type_as", "_conj", "fill", "copy",
}
_CREATION = {"full", "zeros", "ones", "empty", "new_zeros", "new_ones", "new_full",
             "new_empty", "empty_permuted", "arange", "scalar_tensor"}
_VIEW_OPS = {"view", "_unsafe_view", "reshape", "slice", "select", "permute", "transpose", "t",
             "unsqueeze", "squeeze", "expand", "alias", "as_strided", "diagonal", "unfold",
             "narrow", "split", "split_with_sizes", "unbind", "detach", "unflatten", "movedim",
             "view_as_real", "view_as_complex", "real", "imag", "chunk"}
_REDUCE = {  # name -> neutral kind
    "sum": "zero", "prod": "one", "amax": "ninf", "amin": "pinf", "any": "false",
    "all": "true", "argmax": "ninf", "argmin": "pinf", "max": "ninf", "min": "pinf",
    "logsumexp": "ninf", "nansum": "zero",
}
_DROP = {"_assert_scalar", "_assert_async", "sym_constrain_range", "sym_constrain_range_for_size",
         "_assert_tensor_metadata"}


def _name(target):
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return None


class _Pass:
    def __init__(self, gm, spec, placeholder_layouts, n_visible=None):
        self.gm, self.spec, self.ph_lay = gm, spec, placeholder_layouts
        self.n_visible = n_visible  # leading outputs the user sees (None: all)
        self.g = torch.fx.Graph()
        self.env = {}
        self.lay = {}
        self.sym = {}  # old sym node -> expr
        self.sizes_ok = False  # set by handlers whose int arguments are sizes

    # -- args --
    def value_of(self, node):
        expr = self.sym[node]
        val = node.meta["val"]
        kind = float if isinstance(val, (torch.SymFloat, float)) else (
            bool if isinstance(val, (torch.SymBool, bool)) else int)
        if not (expr.free_symbols & self.spec.padded):
            return kind(_evaluate(expr, self.spec.B))
        return self.g.call_function(_RealValue(expr, kind), (self.ctx,))

    def shape_of(self, node):
        expr = self.sym[node]
        if expr.free_symbols & self.spec.padded and not self.sizes_ok:
            # an int argument that is not a size (a shift, an offset, k of topk): the
            # bucket size would change its meaning
            raise _Unsupported(f"size {expr} passed as an int argument")
        return _evaluate(expr, self.spec.B)

    def map_arg(self, a, use):
        if isinstance(a, torch.fx.Node):
            if a in self.sym:
                return self.shape_of(a) if use == "shape" else self.value_of(a)
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.map_arg(x, use) for x in a)
        if isinstance(a, dict):
            return {k: self.map_arg(v, use) for k, v in a.items()}
        return a

    def map_call(self, node, overrides=None):
        """args/kwargs of node mapped, sym args by schema use; overrides: {index or name: value}."""
        t = node.target
        overrides = overrides or {}
        schema = t._schema if isinstance(t, torch._ops.OpOverload) else None
        args, kwargs = [], {}
        for i, a in enumerate(node.args):
            if i in overrides:
                args.append(overrides[i])
                continue
            args.append(self.map_arg(a, self.use(schema, t, i, None)))
        for k, a in node.kwargs.items():
            if k in overrides:
                kwargs[k] = overrides[k]
                continue
            kwargs[k] = self.map_arg(a, self.use(schema, t, None, k))
        return tuple(args), kwargs

    @staticmethod
    def use(schema, target, i, name):
        if schema is None:
            return "value"
        arg = None
        if i is not None and i < len(schema.arguments):
            arg = schema.arguments[i]
        elif name is not None:
            arg = next((a for a in schema.arguments if a.name == name), None)
        if arg is None:
            return "value"
        ty = str(arg.type)
        if _name(target) == "select" and arg.name == "index":
            return "value"
        if "int" in ty and "ScalarType" not in str(arg.real_type):  # SymInt, SymInt[]
            return "shape"
        if _name(target) == "arange" and arg.name in ("start", "end", "step"):
            return "shape"
        return "value"

    def emit(self, node, args=None, kwargs=None, target=None):
        if args is None:
            args, kwargs = self.map_call(node)
        n = self.g.call_function(target or node.target, args, kwargs or {})
        n.meta = dict(node.meta)
        return n

    def L(self, a):
        return self.lay[a]

    def tensor_args(self, node):
        out = []
        for a in list(node.args) + list(node.kwargs.values()):
            if isinstance(a, (list, tuple)):
                out.extend(x for x in a if _is_tensor_node(x))
            elif _is_tensor_node(a):
                out.append(a)
        return out

    def masked(self, new_node, lay, dims, kind):
        """new_node with padded positions along dims (indices into lay) set to kind."""
        pd = tuple((d, self.spec.facs(lay[d])) for d in dims if _is_padded_dim(lay[d]))
        if not pd:
            return new_node
        return self.g.call_function(_Bound(_apply_mask, pd, kind), (new_node, self.ctx))

    def out_lay_from_meta(self, node):
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor):
            return self.spec.from_shape(v.shape)
        if isinstance(v, (list, tuple)):
            return [self.spec.from_shape(x.shape) if isinstance(x, torch.Tensor) else None
                    for x in v]
        return None

    # -- driver --
    def run(self):
        self.ctx = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                n = self.g.placeholder(node.name)
                n.meta = dict(node.meta)
                self.env[node] = n
                if _is_sym_node(node):
                    self.sym[node] = _sym_expr(node.meta["val"])
                elif _is_tensor_node(node):
                    self.lay[node] = self.ph_lay(node, self.spec)
        self.real_env = dict(self.env)
        self.ctx = self.g.placeholder("_tpu_bucket_ctx")
        # pad inputs right after the placeholders
        for node in list(self.env):
            if node in self.lay and _layout_padded(self.lay[node]):
                facs = tuple(self.spec.facs(d) for d in self.lay[node])
                self.env[node] = self.g.call_function(_Bound(_pad_input, facs),
                                                     (self.env[node], self.ctx))
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                self.output(node)
                continue
            if node.op == "get_attr":
                n = self.g.get_attr(node.target)
                n.meta = dict(node.meta)
                self.env[node] = n
                self.lay[node] = self.out_lay_from_meta(node)
                continue
            if node.op != "call_function":
                raise _Unsupported(f"{node.op} node")
            name = _name(node.target)
            if name in _DROP:
                continue
            if _is_sym_node(node):
                expr = _sym_expr(node.meta["val"])
                if expr.free_symbols - set(self.spec.B):
                    raise _Unsupported(f"data-dependent size {expr}")
                self.sym[node] = expr
                continue
            self.call(node, name)
        return self.g

    def _views_input(self, a):
        """Whether a is a graph input or a chain of views of one."""
        while isinstance(a, torch.fx.Node):
            if a.op == "placeholder":
                return _is_tensor_node(a)
            if a.op != "call_function" or not (a.target is operator.getitem
                                                or _name(a.target) in _VIEW_OPS):
                return False
            a = a.args[0]
        return False

    def _replay_real(self, a):
        """a (a view chain of an input) rebuilt on the real, unpadded input with real sizes:
        AOTAutograd regenerates outputs that alias inputs from their view metadata, which
        must describe the user's tensor, not the padded copy."""
        if a.op == "placeholder":
            return self.real_env[a]
        src = self._replay_real(a.args[0])
        args = (src,) + tuple(self.map_arg(x, "value") for x in a.args[1:])
        kwargs = {k: self.map_arg(v, "value") for k, v in a.kwargs.items()}
        return self.g.call_function(a.target, args, kwargs)

    def _view_root(self, a):
        while (isinstance(a, torch.fx.Node) and a.op == "call_function"
               and (a.target is operator.getitem or _name(a.target) in _VIEW_OPS)):
            a = a.args[0]
        return a

    def _check_aliasing_outputs(self, outs):
        """Outputs that are views of one intermediate (AOTAutograd regenerates them from
        the intermediate with as_strided) must stay views of one storage after slicing
        back, which holds when every padded dim is a single factor (narrow)."""
        roots = {}
        for a in outs:
            if isinstance(a, torch.fx.Node) and _is_tensor_node(a) and not self._views_input(a):
                roots.setdefault(self._view_root(a), []).append(a)
        for group in roots.values():
            if len(group) > 1 and any(isinstance(self.lay.get(a), tuple) and any(
                    _is_padded_dim(d) and len(d) > 1 for d in self.lay[a]) for a in group):
                raise _Unsupported("aliasing outputs with a flattened padded dim")

    def output(self, node):
        outs = []
        self._check_aliasing_outputs(node.args[0][:self.n_visible])
        for a in node.args[0]:
            if isinstance(a, torch.fx.Node) and self._views_input(a):
                outs.append(self._replay_real(a))
            elif isinstance(a, torch.fx.Node) and a in self.sym:
                outs.append(self.value_of(a))
            elif isinstance(a, torch.fx.Node) and a in self.lay and isinstance(self.lay[a], tuple):
                n = self.env[a]
                if _layout_padded(self.lay[a]):
                    facs = tuple(self.spec.facs(d) for d in self.lay[a])
                    n = self.g.call_function(_Bound(_unpad_output, facs), (n, self.ctx))
                outs.append(n)
            elif _is_tensor_node(a):
                raise _Unsupported(f"unknown layout of output {a.name}")
            elif isinstance(a, torch.fx.Node):
                outs.append(self.env[a])
            else:
                outs.append(a)
        self.g.output(tuple(outs))

    def call(self, node, name):
        t = node.target
        targs = self.tensor_args(node)
        for a in targs:
            if not isinstance(self.lay.get(a), tuple):
                raise _Unsupported(f"unknown layout of {a.name}")
        in_padded = any(_layout_padded(self.L(a)) for a in targs)
        if node.target is operator.getitem:
            src, idx = node.args
            self.env[node] = self.emit(node)
            self.lay[node] = self.lay[src][idx] if isinstance(self.lay[src], list) else None
            return
        if not isinstance(t, torch._ops.OpOverload):
            if in_padded:
                raise _Unsupported(f"python call {t}")
            self.env[node] = self.emit(node)
            self.lay[node] = self.out_lay_from_meta(node)
            return
        meta_lay = None
        try:
            meta_lay = self.out_lay_from_meta(node)
            out_padded = meta_lay is not None and (
                _layout_padded(meta_lay) if isinstance(meta_lay, tuple)
                else any(x is not None and _layout_padded(x) for x in meta_lay))
        except _Unsupported:
            out_padded = True
        if not in_padded and not out_padded:
            self.env[node] = self.emit(node)
            self.lay[node] = meta_lay
            return
        if t._schema.is_mutable:
            raise _Unsupported(f"mutation {t} of a padded tensor")
        if torch.Tag.nondeterministic_seeded in t.tags:
            raise _Unsupported(f"random op {t} over a padded tensor")
        h = getattr(self, "op_" + name, None)
        if h is None and (torch.Tag.pointwise in t.tags or name in _POINTWISE_EXTRA):
            h = self.pointwise
        elif h is None and name in _REDUCE:
            h = self.reduce
        elif h is None and name in _CREATION:
            h = self.creation
        if h is None:
            raise _Unsupported(f"{t} over a padded dim")
        h(node, name)

    # -- handlers --
    def pointwise(self, node, name):
        lays = [self.L(a) for a in self.tensor_args(node)]
        ndim = node.meta["val"].dim()
        self.env[node] = self.emit(node)
        self.lay[node] = _broadcast(self.spec, lays, ndim)

    def creation(self, node, name):
        if name == "arange" and node.target is not aten.arange.default:
            start = node.args[0] if node.args else node.kwargs.get("start", 0)
            step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
            if isinstance(start, torch.fx.Node) or isinstance(step, torch.fx.Node) or step != 1:
                raise _Unsupported("arange with a symbolic start or a step")
        self.sizes_ok = True
        self.env[node] = self.emit(node)
        self.sizes_ok = False
        self.lay[node] = self.spec.from_shape(node.meta["val"].shape)

    def _view(self, node, name):
        x = node.args[0]
        out = _view_layout(self.spec, self.L(x), node.meta["val"].shape)
        size = [self.spec.dim_size(d) for d in out]
        self.env[node] = self.emit(node, *self.map_call(node, {1: size}))
        self.lay[node] = out

    op_view = op__unsafe_view = op_reshape = _view

    def op_permute(self, node, name):
        lay = self.L(node.args[0])
        dims = [d % len(lay) for d in node.args[1]]
        self.env[node] = self.emit(node)
        self.lay[node] = tuple(lay[d] for d in dims)

    def op_transpose(self, node, name):
        lay = list(self.L(node.args[0]))
        a, b = node.args[1] % len(lay), node.args[2] % len(lay)
        lay[a], lay[b] = lay[b], lay[a]
        self.env[node] = self.emit(node)
        self.lay[node] = tuple(lay)

    def op_t(self, node, name):
        self.env[node] = self.emit(node)
        self.lay[node] = tuple(reversed(self.L(node.args[0])))

    def op_unsqueeze(self, node, name):
        lay = list(self.L(node.args[0]))
        d = node.args[1] % (len(lay) + 1)
        lay.insert(d, ())
        self.env[node] = self.emit(node)
        self.lay[node] = tuple(lay)

    def op_squeeze(self, node, name):
        lay = self.L(node.args[0])
        shape = node.args[0].meta["val"].shape
        if len(node.args) > 1:
            ds = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
            ds = {d % max(len(lay), 1) for d in ds}
        else:
            ds = set(range(len(lay)))
        keep = [lay[i] for i in range(len(lay)) if not (i in ds and _sym_expr(shape[i]) == 1)]
        self.env[node] = self.emit(node)
        self.lay[node] = tuple(keep)

    def op_expand(self, node, name):
        lay = self.L(node.args[0])
        meta = self.spec.from_shape(node.meta["val"].shape)
        k = len(meta) - len(lay)
        out = list(meta[:k]) + [lay[i] if lay[i] != () else meta[k + i] for i in range(len(lay))]
        size = [self.spec.dim_size(d) for d in out]
        self.env[node] = self.emit(node, *self.map_call(node, {1: size}))
        self.lay[node] = tuple(out)

    def op_slice(self, node, name):
        x = node.args[0]
        lay = list(self.L(x))
        dim = (node.args[1] if len(node.args) > 1 else 0) % len(lay)
        start = node.args[2] if len(node.args) > 2 else None
        end = node.args[3] if len(node.args) > 3 else None
        step = node.args[4] if len(node.args) > 4 else 1
        out = self.spec.factor(_sym_expr(node.meta["val"].shape[dim]))
        if step != 1:
            if _is_padded_dim(lay[dim]) or not isinstance(out, int):
                raise _Unsupported("slice with a step over a padded dim")
        elif _is_padded_dim(lay[dim]):
            if len(lay[dim]) != 1:
                raise _Unsupported("slice of a flattened padded dim")
            if isinstance(out, int):
                # a fixed-size window (x[:, -4:], x[:, t-3:t]): take it at the real
                # positions, counting from the real end
                real = lay[dim][0]

                def bound(b, default):
                    if b is None or (isinstance(b, int) and b >= 2 ** 62):
                        return self._real(default)
                    if isinstance(b, int):
                        return b if b >= 0 else self._real(real + b)
                    return self.value_of(b)
                args = (self.env[x], dim, bound(start, 0), bound(end, real), 1)
                self.env[node] = self.g.call_function(aten.slice.Tensor, args)
                lay[dim] = _norm((out,))
                self.lay[node] = tuple(lay)
                return
            if isinstance(start, torch.fx.Node) or (start or 0) < 0:
                raise _Unsupported("slice of a padded dim from the end")
            # a prefix-aligned slice x[:, a:end]: valid elements stay a prefix
        elif not isinstance(out, int):
            # a static dim cut to a padded size (mask_buffer[:T]): the bucket size must fit
            if isinstance(start, torch.fx.Node) or (start or 0) < 0 or not isinstance(
                    self.spec.factor(_sym_expr(x.meta["val"].shape[dim])), int):
                raise _Unsupported("slice of a static dim to a padded size")
            if (start or 0) + self.spec.pad(out) > self.spec.dim_size(lay[dim]):
                raise _Unsupported("bucket larger than the sliced dim")
        lay[dim] = _norm((out,))
        self.sizes_ok = True  # the ends of the slice are sizes here
        self.env[node] = self.emit(node)
        self.sizes_ok = False
        self.lay[node] = tuple(lay)

    def op_select(self, node, name):
        x, dim, index = node.args[:3]
        lay = list(self.L(x))
        dim = dim % len(lay)
        over = {}
        if _is_padded_dim(lay[dim]):
            if len(lay[dim]) != 1:
                raise _Unsupported("select on a flattened padded dim")
            if isinstance(index, int) and index < 0:
                over[2] = self.g.call_function(_RealValue(lay[dim][0] + index, int), (self.ctx,))
        self.env[node] = self.emit(node, *self.map_call(node, over))
        del lay[dim]
        self.lay[node] = tuple(lay)

    def _split(self, node, name):
        x = node.args[0]
        lay = self.L(x)
        dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(lay)
        if _is_padded_dim(lay[dim]):
            raise _Unsupported("split along a padded dim")
        self.env[node] = self.emit(node)
        self.lay[node] = [lay[:dim] + self.spec.from_shape([o.shape[dim]]) + lay[dim + 1:]
                          for o in node.meta["val"]]

    op_split_with_sizes = op_split = _split

    def op_cat(self, node, name):
        xs = node.args[0]
        nd = node.meta["val"].dim()
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % nd
        lays = [self.L(x) for x in xs if x.meta["val"].dim() == nd]
        for lay in lays:
            if _is_padded_dim(lay[dim]):
                raise _Unsupported("cat along a padded dim")
        rest = [tuple(d for i, d in enumerate(lay) if i != dim) for lay in lays]
        if any(r != rest[0] for r in rest):
            raise _Unsupported("cat of differently padded tensors")
        out = list(lays[0])
        out[dim] = self.spec.from_shape([node.meta["val"].shape[dim]])[0]
        self.env[node] = self.emit(node)
        self.lay[node] = tuple(out)

    def _index_masked(self, idx_node):
        """An index tensor with its padded entries set to 0 (always in range)."""
        lay = self.L(idx_node)
        return self.masked(self.env[idx_node], lay, range(len(lay)), 0)

    def op_embedding(self, node, name):
        w, idx = node.args[:2]
        if _layout_padded(self.L(w)):
            raise _Unsupported("embedding with a padded table")
        args, kw = self.map_call(node, {1: self._index_masked(idx)})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = self.L(idx) + self.L(w)[1:]

    def op_index_select(self, node, name):
        x, dim, idx = node.args[:3]
        lay = list(self.L(x))
        dim = dim % len(lay)
        args, kw = self.map_call(node, {2: self._index_masked(idx)})
        self.env[node] = self.emit(node, args, kw)
        lay[dim] = self.L(idx)[0] if self.L(idx) else ()
        self.lay[node] = tuple(lay)

    def op_gather(self, node, name):
        x, dim, idx = node.args[:3]
        lx, li = self.L(x), self.L(idx)
        dim = dim % len(lx)
        for i in range(len(li)):
            if i != dim and li[i] != lx[i] and (_is_padded_dim(li[i]) or _is_padded_dim(lx[i])):
                raise _Unsupported("gather with differently padded index")
        args, kw = self.map_call(node, {2: self._index_masked(idx)})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = li

    def op_scatter(self, node, name):
        x, dim, idx = node.args[:3]
        lx, li = self.L(x), self.L(idx)
        dim = dim % len(lx)
        for i in range(len(li)):
            if li[i] != lx[i] and (_is_padded_dim(li[i]) or _is_padded_dim(lx[i])):
                raise _Unsupported("scatter with differently padded index")
        if _is_padded_dim(li[dim]):
            raise _Unsupported("scatter along a padded dim")
        if len(node.args) > 3 and _is_tensor_node(node.args[3]) and self.L(node.args[3]) != li:
            raise _Unsupported("scatter source padded differently")
        args, kw = self.map_call(node, {2: self._index_masked(idx)})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = lx

    def op_index_put(self, node, name):
        x, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        lis = [self.L(i) for i in indices if i is not None]
        if any(i is None for i in indices) or any(li != lis[0] for li in lis):
            raise _Unsupported("index_put with mixed indices")
        if _layout_padded(lis[0]) and not accumulate:
            raise _Unsupported("index_put without accumulate at padded indices")
        lv = self.L(values)
        new_idx = [self._index_masked(i) for i in indices]
        v = self.masked(self.env[values], lv, range(len(lv)), "zero")
        args, kw = self.map_call(node, {1: new_idx, 2: v})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = self.L(x)

    def op_index(self, node, name):
        x, indices = node.args[:2]
        if any(i is None for i in indices):
            raise _Unsupported("index with slices")
        lx = self.L(x)
        lis = [self.L(i) for i in indices]
        if any(li != lis[0] for li in lis):
            raise _Unsupported("index with differently padded indices")
        # index values address real positions of x, which padding does not move
        args, kw = self.map_call(node, {1: [self._index_masked(i) for i in indices]})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = lis[0] + lx[len(indices):]

    # reductions
    def _red_dims(self, node, nd):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dims is None or dims == []:
            return list(range(nd))
        if isinstance(dims, int):
            dims = [dims]
        return [d % max(nd, 1) for d in dims]

    def _keepdim(self, node, pos):
        return node.args[pos] if len(node.args) > pos else node.kwargs.get("keepdim", False)

    def _reduced_layout(self, lay, dims, keepdim):
        if keepdim:
            return tuple(() if i in dims else d for i, d in enumerate(lay))
        return tuple(d for i, d in enumerate(lay) if i not in dims)

    def reduce(self, node, name):
        x = node.args[0]
        lay = self.L(x)
        t = node.target
        if len(self.tensor_args(node)) != 1:  # max.other, min.other: not reductions
            raise _Unsupported(f"{t} over a padded dim")
        if t in (aten.max.default, aten.min.default):
            dims = list(range(len(lay)))
        else:
            dims = self._red_dims(node, len(lay))
        if name in ("argmax", "argmin", "max", "min") and isinstance(node.meta["val"], (
                tuple, list)) or name in ("argmax", "argmin"):
            # indices count padded positions: right only along a single-factor dim
            if any(_is_padded_dim(lay[d]) for d in dims) and (
                    len(dims) > 1 or len(lay[dims[0]]) > 1):
                raise _Unsupported(f"{name} indices over a flattened padded dim")
        xm = self.masked(self.env[x], lay, dims, _REDUCE[name])
        args, kw = self.map_call(node, {0: xm})
        self.env[node] = self.emit(node, args, kw)
        schema_args = t._schema.arguments
        kpos = next((i for i, a in enumerate(schema_args) if a.name == "keepdim"),
                    len(schema_args))
        out = self._reduced_layout(lay, dims, self._keepdim(node, kpos))
        val = node.meta["val"]
        if isinstance(val, (tuple, list)):  # max.dim, min.dim: (values, indices)
            self.lay[node] = [out for _ in val]
        else:
            self.lay[node] = out if val.dim() == len(out) else self.spec.from_shape(val.shape)

    def _count(self, lay, dims):
        expr = sympy.Integer(1)
        for d in dims:
            for f in lay[d]:
                expr = expr * f
        return expr

    def _real(self, expr, kind=int):
        if not (sympy.sympify(expr).free_symbols & self.spec.padded):
            return kind(_evaluate(sympy.sympify(expr), self.spec.B))
        return self.g.call_function(_RealValue(sympy.sympify(expr), kind), (self.ctx,))

    def op_mean(self, node, name):
        x = node.args[0]
        lay = self.L(x)
        dims = self._red_dims(node, len(lay)) if node.target is not aten.mean.default \
            else list(range(len(lay)))
        if not any(_is_padded_dim(lay[d]) for d in dims):
            self.env[node] = self.emit(node)
            keep = self._keepdim(node, 2) if node.target is not aten.mean.default else False
            self.lay[node] = self._reduced_layout(lay, dims, keep)
            return
        keep = self._keepdim(node, 2) if node.target is not aten.mean.default else False
        dpos = 1 if node.target is aten.mean.default else 3
        dtype = node.kwargs.get("dtype") or (node.args[dpos] if len(node.args) > dpos else None)
        xm = self.masked(self.env[x], lay, dims, "zero")
        s = self.g.call_function(aten.sum.dim_IntList, (xm, dims, keep), {"dtype": dtype})
        n = self._real(self._count(lay, dims))
        self.env[node] = self.g.call_function(aten.div.Tensor, (s, n))
        self.lay[node] = self._reduced_layout(lay, dims, keep)

    def _var_parts(self, node):
        x = node.args[0]
        lay = self.L(x)
        dims = self._red_dims(node, len(lay))
        corr = node.kwargs.get("correction", node.args[2] if len(node.args) > 2 else None)
        corr = 1 if corr is None else corr
        keep = node.kwargs.get("keepdim", node.args[3] if len(node.args) > 3 else False)
        xm = self.masked(self.env[x], lay, dims, "zero")
        n = self._real(self._count(lay, dims))
        total = self.g.call_function(aten.sum.dim_IntList, (xm, dims, True))
        mean = self.g.call_function(aten.div.Tensor, (total, n))
        dev = self.g.call_function(aten.sub.Tensor, (self.env[x], mean))
        dev = self.masked(dev, lay, dims, "zero")
        sq = self.g.call_function(aten.mul.Tensor, (dev, dev))
        ssum = self.g.call_function(aten.sum.dim_IntList, (sq, dims, keep))
        denom = self.g.call_function(_clamp_sub, (n, corr)) if isinstance(n, torch.fx.Node) \
            else max(n - corr, 0)
        var = self.g.call_function(aten.div.Tensor, (ssum, denom))
        if not keep:
            mean = self.g.call_function(aten.squeeze.dims, (mean, dims))
        return var, mean, self._reduced_layout(lay, dims, keep)

    def op_var(self, node, name):
        if node.target is not aten.var.correction:
            raise _Unsupported(f"{node.target} over a padded dim")
        var, _, lay = self._var_parts(node)
        self.env[node], self.lay[node] = var, lay

    def op_std(self, node, name):
        if node.target is not aten.std.correction:
            raise _Unsupported(f"{node.target} over a padded dim")
        var, _, lay = self._var_parts(node)
        self.env[node] = self.g.call_function(aten.sqrt.default, (var,))
        self.lay[node] = lay

    def op_var_mean(self, node, name):
        if node.target is not aten.var_mean.correction:
            raise _Unsupported(f"{node.target} over a padded dim")
        var, mean, lay = self._var_parts(node)
        self.env[node] = self.g.call_function(_pair, (var, mean))
        self.lay[node] = [lay, lay]

    def _softmax(self, node, name):
        x, dim = node.args[:2]
        lay = self.L(x)
        dim = dim % len(lay)
        xm = self.masked(self.env[x], lay, [dim], "ninf")
        args, kw = self.map_call(node, {0: xm})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = lay

    op__softmax = op__log_softmax = _softmax

    def _softmax_bw(self, node, name):
        g, out, dim = node.args[:3]
        lay = self.L(g)
        if self.L(out) != lay:
            raise _Unsupported("softmax backward with differently padded operands")
        dim = dim % len(lay)
        gm = self.masked(self.env[g], lay, [dim], "zero")
        om = self.masked(self.env[out], lay, [dim], "zero")
        if name == "_log_softmax_backward_data":
            om = self.masked(self.env[out], lay, [dim], "ninf")
        args, kw = self.map_call(node, {0: gm, 1: om})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = lay

    op__softmax_backward_data = op__log_softmax_backward_data = _softmax_bw

    def op_cumsum(self, node, name):
        # the prefix of a cumulative sum only reads the prefix: valid stays valid
        x, dim = node.args[:2]
        lay = self.L(x)
        if len(lay[dim % len(lay)]) > 1:
            raise _Unsupported("cumsum over a flattened padded dim")
        self.env[node] = self.emit(node)
        self.lay[node] = lay

    def _contract(self, a, b, da, db):
        la, lb = self.L(a), self.L(b)
        if la[da] != lb[db]:
            raise _Unsupported("contraction of differently padded dims")
        am = self.masked(self.env[a], la, [da], "zero")
        bm = self.masked(self.env[b], lb, [db], "zero")
        return am, bm, la, lb

    def op_mm(self, node, name):
        a, b = node.args[:2]
        am, bm, la, lb = self._contract(a, b, 1, 0)
        self.env[node] = self.emit(node, (am, bm), {})
        self.lay[node] = (la[0], lb[1])

    def op_bmm(self, node, name):
        a, b = node.args[:2]
        am, bm, la, lb = self._contract(a, b, 2, 1)
        if la[0] != lb[0]:
            raise _Unsupported("bmm of differently padded batches")
        self.env[node] = self.emit(node, (am, bm), {})
        self.lay[node] = (la[0], la[1], lb[2])

    def op_addmm(self, node, name):
        bias, a, b = node.args[:3]
        am, bm, la, lb = self._contract(a, b, 1, 0)
        out = (la[0], lb[1])
        _broadcast(self.spec, [self.L(bias), out], 2)
        args, kw = self.map_call(node, {1: am, 2: bm})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = out

    def op_baddbmm(self, node, name):
        bias, a, b = node.args[:3]
        am, bm, la, lb = self._contract(a, b, 2, 1)
        out = (la[0], la[1], lb[2])
        _broadcast(self.spec, [self.L(bias), out], 3)
        args, kw = self.map_call(node, {1: am, 2: bm})
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = out

    def op_native_layer_norm(self, node, name):
        x, shape = node.args[:2]
        lay = self.L(x)
        k = len(shape)
        if any(_is_padded_dim(d) for d in lay[len(lay) - k:]):
            raise _Unsupported("layer_norm over a padded dim")
        self.env[node] = self.emit(node)
        stat = lay[:len(lay) - k] + ((),) * k
        self.lay[node] = [lay, stat, stat]

    def op_native_layer_norm_backward(self, node, name):
        g, x, shape, mean, rstd = node.args[:5]
        lay = self.L(x)
        k = len(shape)
        if any(_is_padded_dim(d) for d in lay[len(lay) - k:]):
            raise _Unsupported("layer_norm over a padded dim")
        outer = range(len(lay) - k)
        over = {0: self.masked(self.env[g], self.L(g), outer, "zero"),
                1: self.masked(self.env[x], lay, outer, "zero"),
                3: self.masked(self.env[mean], self.L(mean), outer, "zero"),
                4: self.masked(self.env[rstd], self.L(rstd), outer, "zero")}
        args, kw = self.map_call(node, over)
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = [lay, self.L(node.args[5]) if node.args[5] is not None else None,
                          self.L(node.args[6]) if node.args[6] is not None else None]

    def _nll_target(self, target, ignore_index):
        lt = self.L(target)
        return self.masked(self.env[target], lt, range(len(lt)), int(ignore_index))

    def op_nll_loss_forward(self, node, name):
        x, target, weight, reduction, ignore_index = node.args[:5]
        lx = self.L(x)
        if len(lx) == 2 and _is_padded_dim(lx[1]) or len(lx) == 1 and _is_padded_dim(lx[0]):
            raise _Unsupported("nll_loss over padded classes")
        if len(lx) == 2 and lx[0] != self.L(target)[0]:
            raise _Unsupported("nll_loss with differently padded target")
        over = {0: self.masked(self.env[x], lx, [0], "zero") if len(lx) == 2 else self.env[x],
                1: self._nll_target(target, ignore_index)}
        args, kw = self.map_call(node, over)
        self.env[node] = self.emit(node, args, kw)
        out = self.L(target) if reduction == 0 else ()
        self.lay[node] = [out, ()]

    def op_nll_loss_backward(self, node, name):
        go, x, target, weight, reduction, ignore_index = node.args[:6]
        lx = self.L(x)
        if len(lx) == 2 and _is_padded_dim(lx[1]) or len(lx) == 1 and _is_padded_dim(lx[0]):
            raise _Unsupported("nll_loss over padded classes")
        over = {1: self.env[x], 2: self._nll_target(target, ignore_index)}
        if reduction == 0:
            over[0] = self.masked(self.env[go], self.L(go), range(len(self.L(go))), "zero")
        args, kw = self.map_call(node, over)
        self.env[node] = self.emit(node, args, kw)
        self.lay[node] = lx

    def op_tril(self, node, name):
        lay = self.L(node.args[0])
        if any(len(d) > 1 for d in lay[-2:] if _is_padded_dim(d)):
            raise _Unsupported("tril/triu of a flattened padded dim")
        self.env[node] = self.emit(node)
        self.lay[node] = lay

    op_triu = op_tril


def _clamp_sub(n, c):
    return max(n - c, 0)


def _pair(a, b):
    return (a, b)


# ---- the per-graph wrapper ----

class BucketedGraph:
    """Runs gm (a graph with symbolic sizes) at bucket sizes. layouts: a dict shared by the
    forward and backward graphs of one Dynamo graph (forward outputs by node name -> their
    symbolic factor layout), so the backward knows how flattened saved tensors are made."""

    def __init__(self, gm, options, what, layouts, run_exact, run_graph):
        self.gm, self.what, self.layouts = gm, what, layouts
        self.buckets = options.get("buckets")
        self.run_exact, self.run_graph = run_exact, run_graph
        self.specs = {}
        self.fallback = None
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.n_visible = 0 if what == "backward" else _visible_outputs()
        self.symbols = self._find_symbols()
        if self.fallback is None:
            self._record_output_layouts()

    def _find_symbols(self):
        syms = set()
        for n in self.placeholders:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                for s in v.shape:
                    syms |= _sym_expr(s).free_symbols
            elif isinstance(v, _SYM_TYPES):
                syms |= _sym_expr(v).free_symbols
        self.sources = {}
        for i, n in enumerate(self.placeholders):
            v = n.meta.get("val")
            if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
                self.sources.setdefault(v.node.expr, (i, None))
        for i, n in enumerate(self.placeholders):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                for d, s in enumerate(v.shape):
                    e = _sym_expr(s)
                    if e.is_Symbol:
                        self.sources.setdefault(e, (i, d))
        missing = syms - set(self.sources)
        if missing:
            self._fail(f"sizes {sorted(map(str, missing))} not readable from the inputs")
        return sorted(syms, key=str)

    def _fail(self, reason):
        self.fallback = reason
        _count_in("pad_fallbacks", f"{self.what}: {reason}")

    def _record_output_layouts(self):
        # symbolic factor layouts of the forward outputs, for the backward's placeholders
        try:
            spec = _Spec({s: 1 << 20 for s in self.symbols}, set(self.symbols))
            p = _Pass(self.gm, spec, self._placeholder_layout, self.n_visible)
            p.run()
            out = next(n for n in self.gm.graph.nodes if n.op == "output")
            for a in out.args[0]:
                if isinstance(a, torch.fx.Node) and isinstance(p.lay.get(a), tuple):
                    self.layouts[a.name] = tuple(tuple(f if not isinstance(f, int) else
                                                       sympy.Integer(f) for f in d)
                                                 for d in p.lay[a])
        except Exception:  # noqa: BLE001  the first real call reports it
            pass

    def _placeholder_layout(self, node, spec):
        v = node.meta["val"]
        rec = self.layouts.get(node.name)
        if rec is not None and len(rec) == v.dim() and all(
                sympy.expand(math.prod(d) - _sym_expr(n)) == 0 for d, n in zip(rec, v.shape)):
            return tuple(_norm(tuple(spec.factor(f) for f in d)) for d in rec)
        return spec.from_shape(v.shape)

    def __call__(self, *args):
        if self.fallback is not None:
            _count("exact_runs")
            return self.run_exact(*args)
        reals, key = {}, []
        for s in self.symbols:
            i, d = self.sources[s]
            v = int(args[i]) if d is None else int(args[i].shape[d])
            reals[s] = sympy.Integer(v)
            key.append(bucket_of(v, self.buckets))
        if any(b is None for b, _ in key):
            _count("exact_runs")
            return self.run_exact(*args)
        key = tuple(key)
        entry = self.specs.get(key)
        if entry is None:
            entry = self._specialize(key)
            self.specs[key] = entry
        if isinstance(entry, str):
            _count("exact_runs")
            return self.run_exact(*args)
        _count("padded_runs")
        return self.run_graph(entry, *args, {"reals": reals, "masks": {}})

    def _specialize(self, key):
        bucket_vals = {s: b for s, (b, _) in zip(self.symbols, key)}
        padded = {s for s, (b, lo) in zip(self.symbols, key) if lo < b}
        spec = _Spec(bucket_vals, padded)
        try:
            g = _Pass(self.gm, spec, self._placeholder_layout, self.n_visible).run()
            g.lint()
            gm = torch.fx.GraphModule(self.gm, g)
        except Exception as e:  # noqa: BLE001  (a pass failure must never fail the model)
            reason = (str(e) if isinstance(e, _Unsupported)
                      else f"pass error {type(e).__name__}: {e}")
            _count_in("pad_fallbacks", f"{self.what}: {reason}")
            return reason
        _count("bucket_graphs")
        _count_in("graphs_per_bucket", ",".join(f"{s}={b}" for s, (b, _) in
                                                zip(self.symbols, key)))
        return gm


def _visible_outputs():
    """How many leading outputs of the forward graph being compiled reach the user
    (mutated inputs, user outputs, intermediate bases; the rest is saved for the
    backward), from AOTAutograd's metadata; None (all) when it is not available."""
    try:
        meta = torch._guards.TracingContext.try_get().fw_metadata
        return (meta.num_mutated_inp_runtime_indices + len(meta.output_info)
                + meta.num_intermediate_bases)
    except Exception:  # noqa: BLE001
        return None


def has_symbolic_sizes(gm):
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape):
            return True
    return False

"""Program generator of the differential fuzzer.

A program is a list of Python statements ("lines") over tensors t0, t1, ... on device `dev`.
Inputs are made by `mk(seed, shape, dtype, dev)` (PRELUDE), so a program is a
self-contained piece of source. The generator runs every line on CPU while it generates, so
it knows each variable's shape, dtype and aliasing and picks mostly valid arguments; a few
arguments are invalid on purpose (bad dims, shapes that do not broadcast, masks of the wrong
length, indices out of range), and CPU's answer for those is what tpu must reproduce.

Each line is a dict: src (the statement), op (a short name, used by the table of explained
differences), dd (True when the line's error depends on the data, e.g. an index out of range
in an index tensor: tpu may report it at the next synchronization instead of at the op; such a
line ends the program). Variables flagged exact hold values computed without rounding
(inputs, views, copies, integer math); discontinuous ops (comparisons, floor, casts to int,
argmax, sort indices) only take exact operands, so a last-ulp difference never flips them.
"""
import random
import re
import warnings

import torch

PRELUDE = '''import torch
import torch.nn.functional as F
import torch_tpu  # noqa: F401


def mk(seed, shape, dtype, dev):
    """deterministic input: floats uniform in [-3, 3), ints in [-5, 5], bools 50/50"""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif dtype.is_floating_point:
        t = (torch.rand(shape, generator=g, dtype=torch.float64) * 6 - 3).to(dtype)
    else:
        t = torch.randint(-5, 6, shape, generator=g).to(dtype)
    return t.to(dev)
'''

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int64, torch.int32]
DTYPES = FLOATS + INTS + [torch.bool]
DTYPE_W = [8, 2, 2, 2, 3, 2, 1]
MAX_NUMEL = 120_000

_ns = {}
exec(PRELUDE.replace("import torch_tpu  # noqa: F401\n", ""), _ns)
mk = _ns["mk"]


def dname(dt):
    return "torch." + str(dt).split(".")[1]


class _Random(random.Random):
    def randint(self, a, b):  # an empty range gives its low end (sizes of 0-size dims)
        return a if b < a else super().randint(a, b)

    def randrange(self, a, b=None):
        if b is None:
            a, b = 0, a
        return a if b <= a else super().randrange(a, b)


# float precision classes, finest first: a value's tolerance is that of the coarsest float
# dtype anywhere in its history (a float32 result computed from bfloat16 data carries
# bfloat16's rounding differences)
RANK = {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
RANK_DTYPES = ["float64", "float32", "float16", "bfloat16"]


class Var:
    def __init__(self, name, t, exact, low=0):
        self.name, self.t, self.exact, self.low = name, t, exact, low


class Gen:
    def __init__(self, seed, n_ops=None):
        self.r = _Random(seed)
        self.seed = seed
        self.n_ops = n_ops if n_ops is not None else self.r.randint(2, 12)
        self.vars = []
        self.lines = []
        self.ns = {"torch": torch, "F": torch.nn.functional, "mk": mk, "dev": "cpu"}
        self.k = 0

    # ---- helpers --------------------------------------------------------------
    def new(self):
        n = f"t{self.k}"
        self.k += 1
        return n

    def shape(self, ndim=None):
        r = self.r
        if ndim is None:
            ndim = r.choices([0, 1, 2, 3, 4], [1, 3, 4, 3, 2])[0]
        s = []
        for _ in range(ndim):
            s.append(r.choices([0, 1, r.randint(2, 6), r.randint(7, 17)], [1, 4, 10, 3])[0])
        if ndim and r.random() < 0.04:  # big enough for the multi-threaded kernels
            i = r.randrange(ndim)
            rest = 1
            for j, v in enumerate(s):
                if j != i:
                    rest *= max(v, 1)
            s[i] = max(1, min(40_000 // rest, r.randint(2000, 40_000)))
        return tuple(s)

    def dtype(self, kinds=None):
        ds = [(d, w) for d, w in zip(DTYPES, DTYPE_W) if kinds is None or self.kind(d) in kinds]
        return self.r.choices([d for d, _ in ds], [w for _, w in ds])[0]

    @staticmethod
    def kind(dt):
        return "f" if dt.is_floating_point else ("b" if dt == torch.bool else "i")

    def input(self, shape=None, dtype=None):
        shape = self.shape() if shape is None else tuple(shape)
        dtype = self.dtype() if dtype is None else dtype
        name = self.new()
        seed = self.r.randrange(1 << 30)
        src = f"{name} = mk({seed}, {shape}, {dname(dtype)}, dev)"
        self.run({"src": src, "op": "input", "dd": False}, [(name, True)])
        return self.vars[-1]

    def pick(self, pred=lambda v: True, fresh=0.1):
        c = [v for v in self.vars if pred(v)]
        if not c or self.r.random() < fresh:
            return None
        nc = [v for v in c if not v.t.is_contiguous() or v.t.storage_offset()]
        if nc and self.r.random() < 0.4:  # views with strides and offsets find layout bugs
            return self.r.choice(nc)
        return self.r.choice(c)

    def pick_or_new(self, pred=lambda v: True, shape=None, dtype=None, fresh=0.1):
        v = self.pick(pred, fresh)
        return v if v is not None else self.input(shape, dtype)

    def dim(self, t, extra=0):
        nd = max(t.dim(), 1)
        if self.r.random() < 0.03:  # out of range on purpose
            return self.r.choice([nd + extra, -nd - 1 - extra])
        return self.r.randrange(-nd - extra, nd + extra)

    def bshape(self, s):
        """a shape broadcasting with s (sometimes one that does not)"""
        r = self.r
        s = list(s)
        if r.random() < 0.3 and s:
            s = s[r.randrange(len(s) + 1):]
        s = [1 if r.random() < 0.3 else v for v in s]
        if r.random() < 0.15:
            s = [r.choice([1, 2, 3])] + s
        if r.random() < 0.03 and s:  # does not broadcast
            i = r.randrange(len(s))
            s[i] = s[i] + 2
        return tuple(s)

    def run(self, line, outs, inplace=None, exact_after=True, coarse=0):
        """runs the line on CPU; on success adds the outputs (name, exact) as variables"""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (e.g. std with too few elements)
                exec(line["src"], self.ns)
            err = None
        except Exception as e:  # noqa: BLE001 - CPU's error is the expected behaviour
            err = type(e).__name__
        line["cpu_err"] = err
        self.lines.append(line)
        if err is not None:
            return False
        used = set(re.findall(r"\bt\d+\b", line["src"]))
        low = max([v.low for v in self.vars if v.name in used] + [0])
        tol = {}
        for name, exact in outs:
            t = self.ns[name]
            if not isinstance(t, torch.Tensor):
                continue
            tol[name] = max(low, RANK.get(t.dtype, 0), coarse)
            if t.numel() > MAX_NUMEL:
                continue
            self.vars = [v for v in self.vars if v.name != name]
            self.vars.append(Var(name, t, exact, tol[name]))
        if inplace is not None:
            sp = inplace.t.untyped_storage().data_ptr()
            for v in self.vars:
                if v.t.untyped_storage().data_ptr() == sp:
                    v.exact = v.exact and exact_after
                    v.low = max(v.low, low)
                    tol[v.name] = v.low
        line["tol"] = tol
        return True

    def emit(self, op, expr, exact, dd=False, coarse=0):
        """coarse: the output's tolerance is at least that of precision class RANK_DTYPES[coarse]
        (where the op amplifies its operands' rounding beyond their own class)"""
        name = self.new()
        return self.run({"src": f"{name} = {expr}", "op": op, "dd": dd}, [(name, exact)], coarse=coarse)

    # ---- op builders -----------------------------------------------------------
    def op_view(self):
        r = self.r
        v = self.pick_or_new()
        t, x = v.t, v.name
        nd = t.dim()
        c = r.choice(["transpose", "permute", "slice", "expand", "select", "narrow", "view",
                      "reshape", "unsqueeze", "squeeze", "flatten", "t", "diagonal",
                      "contiguous", "unflatten", "movedim"])
        if c == "transpose":
            e = f"{x}.transpose({self.dim(t)}, {self.dim(t)})"
        elif c == "permute":
            p = list(range(nd))
            r.shuffle(p)
            if r.random() < 0.03:
                p = p + [0]
            e = f"{x}.permute({tuple(p)})"
        elif c == "slice":
            if nd == 0:
                return
            idx = []
            for s in t.shape[: r.randint(1, nd)]:
                a = r.randint(-s - 1, s + 1) if s else 0
                b = r.randint(-s - 1, s + 1) if s else 0
                st = r.choice([1, 1, 2, 3])
                idx.append(f"{a if r.random() < .7 else ''}:{b if r.random() < .6 else ''}:{st}")
            e = f"{x}[{', '.join(idx)}]"
        elif c == "expand":
            s = [(r.randint(1, 4) if d == 1 and r.random() < .7 else (-1 if r.random() < .5 else d))
                 for d in t.shape]
            if r.random() < 0.4:
                s = [r.randint(1, 3)] + s
            if r.random() < 0.03 and s:
                s[0] = s[0] + 3 if isinstance(s[0], int) and s[0] > 0 else 5
            e = f"{x}.expand({tuple(s)})"
        elif c == "select":
            d = self.dim(t)
            size = t.shape[d] if -nd <= d < nd and nd else 1
            i = r.randint(-size, size - 1) if r.random() > 0.05 else size
            e = f"{x}.select({d}, {i})"
        elif c == "narrow":
            d = self.dim(t)
            size = t.shape[d] if -nd <= d < nd and nd else 1
            s = r.randint(0, size)
            ln = r.randint(0, size - s) if r.random() > 0.05 else size - s + 1
            e = f"{x}.narrow({d}, {s}, {ln})"
        elif c in ("view", "reshape"):
            n = t.numel()
            if n == 0 or r.random() < 0.2:
                s = [-1] + ([1] if r.random() < .5 else [])
            else:
                f = [d for d in range(1, n + 1) if n % d == 0]
                a = r.choice(f)
                s = [a, -1] if r.random() < .6 else [n // a, a]
                if r.random() < 0.3:
                    s = [1] + s
            if r.random() < 0.03:
                s = [n + 1]
            e = f"{x}.{c}({tuple(s)})"
        elif c == "unsqueeze":
            e = f"{x}.unsqueeze({self.dim(t, extra=1)})"
        elif c == "squeeze":
            e = f"{x}.squeeze({self.dim(t)})" if r.random() < .7 else f"{x}.squeeze()"
        elif c == "flatten":
            e = f"{x}.flatten()" if r.random() < .5 else f"{x}.flatten({self.dim(t)})"
        elif c == "t":
            e = f"{x}.t()"
        elif c == "diagonal":
            if nd < 2:
                return
            e = f"{x}.diagonal({r.randint(-2, 2)}, {self.dim(t)}, {self.dim(t)})"
        elif c == "contiguous":
            e = f"{x}.contiguous()"
        elif c == "unflatten":
            if nd == 0:
                return
            d = self.dim(t)
            size = t.shape[d] if -nd <= d < nd else 1
            e = f"{x}.unflatten({d}, (-1, {r.choice([1, size if size else 1])}))"
        else:
            e = f"{x}.movedim({self.dim(t)}, {self.dim(t)})"
        self.emit(c, e, v.exact)

    def op_inplace(self):
        r = self.r
        v = self.pick_or_new(fresh=0.05)
        t, x = v.t, v.name
        k = self.kind(t.dtype)
        c = r.choice(["add_", "mul_", "zero_", "fill_", "clamp_", "copy_", "setitem", "relu_",
                      "neg_", "sub_", "div_", "abs_", "masked_fill_", "index_add_"])
        exact_after = True
        if c in ("add_", "sub_", "mul_", "div_", "copy_"):
            o = self.pick(lambda u: u is not v) if r.random() < .6 else None
            if o is None or (r.random() < .7 and not _broadcasts(o.t.shape, t.shape)):
                o = self.input(self.bshape(t.shape), self.dtype())
            on = f"{o.name}.clone()" if _order_dependent(t, o.t) else o.name
            if c == "div_" and not o.exact and self.kind(o.t.dtype) == "f":
                on = f"({on}.abs() + 1)"  # a rounded divisor near 0 (see op_binary's div; seed 216325)
            if c == "copy_":
                src, exact_after = f"{x}.copy_({on})", o.exact
            else:
                alpha = f", alpha={r.choice([2, -1])}" if c in ("add_", "sub_") and r.random() < .3 else ""
                src, exact_after = f"{x}.{c}({on}{alpha})", False
        elif c in ("zero_", "relu_", "neg_", "abs_"):
            src = f"{x}.{c}()"
        elif c == "fill_":
            val = r.choice([0, 1, -2, 1.5, True])
            src = f"{x}.fill_({val})"
        elif c == "clamp_":
            src = f"{x}.clamp_({r.choice([-1, -0.5, None])}, {r.choice([1, 2.5])})"
        elif c == "masked_fill_":
            m = self.pick(lambda u: u.t.dtype == torch.bool and _broadcasts(u.t.shape, t.shape))
            if m is None:
                m = self.input(self.bshape(t.shape), torch.bool)
            src = f"{x}.masked_fill_({m.name}, {r.choice([0, -1, 2.5])})"
            exact_after = True
        elif c == "index_add_":
            if t.dim() == 0:
                return
            d = r.randrange(t.dim())
            n = r.randint(0, 4)
            ids = [r.randrange(t.shape[d]) for _ in range(n)] if t.shape[d] else []
            dd = False
            if ids and r.random() < .06:  # (an empty dim gives no ids even when n > 0)
                ids[0], dd = t.shape[d] + r.randint(0, 3), True
            shp = list(t.shape)
            shp[d] = len(ids)
            s = self.input(shp, t.dtype)
            idx = f"torch.tensor({ids}, dtype=torch.int64, device=dev)"
            return self.run({"src": f"{x}.index_add_({d}, {idx}, {s.name})", "op": c, "dd": dd},
                            [], inplace=v, exact_after=False)
        else:  # setitem
            if t.dim() == 0:
                src = f"{x}[...] = {r.choice([1, 2.5])}"
            else:
                s = t.shape[0]
                a = r.randint(0, s)
                val = r.choice(["1", "-2.5", None])
                if val is None:
                    sub = t[a:].shape
                    o = self.input(self.bshape(sub), self.dtype())
                    val, exact_after = o.name, o.exact
                src = f"{x}[{a}:] = {val}"
        if k != "f":
            exact_after = exact_after or c in ("zero_", "fill_", "relu_", "neg_", "abs_", "clamp_",
                                                "add_", "sub_", "mul_")
        self.run({"src": src, "op": c, "dd": False}, [], inplace=v, exact_after=exact_after)

    def op_binary(self):
        r = self.r
        a = self.pick_or_new()
        if r.random() < 0.5:
            b = self.pick(lambda u: _broadcasts(u.t.shape, a.t.shape) and u is not a)
        else:
            b = None
        if b is None:
            b = self.input(self.bshape(a.t.shape), self.dtype())
        ex = a.exact and b.exact
        ints = self.kind(a.t.dtype) != "f" and self.kind(b.t.dtype) != "f"
        c = r.choice(["add", "sub", "mul", "div", "maximum", "minimum", "atan2", "where", "pow",
                      "scalar", "cmp", "logical", "bitwise", "remainder", "hypot", "lerp"])
        x, y = a.name, b.name
        if c in ("add", "sub", "mul", "maximum", "minimum"):
            if c == "sub" and (a.t.dtype == torch.bool or b.t.dtype == torch.bool) and r.random() < .7:
                return
            return self.emit(c, f"torch.{c}({x}, {y})", ex and (ints or c in ("maximum", "minimum")))
        if c in ("div", "atan2", "hypot"):
            if c == "hypot" and ints:
                return
            if c == "div" and not b.exact and self.kind(b.t.dtype) == "f":
                # a quotient is discontinuous where a rounded divisor is near 0 (CPU's f16
                # layer_norm of one element is -7.9e-06, not 0: 1/x is -inf there, seed 16725)
                y = f"({y}.abs() + 1)"
            return self.emit(c, f"torch.{c}({x}, {y})", False)
        if c == "pow":
            if ints:
                return
            # a rounded base near 0 raised to a power up to 3 in magnitude triples its relative
            # rounding (|gelu(-3)| ** -3, seed 65440)
            return self.emit(c, f"torch.pow({x}.abs(), {y})" if r.random() < .7 else f"{x} ** 2", False,
                             coarse=0 if a.exact else 2)
        if c == "lerp":
            return self.emit(c, f"torch.lerp({x}, {y}, {r.choice([0.25, 0.5])})", False)
        if c == "scalar":
            s = r.choice(["2", "-1", "0.5", "True", "3.25"])
            o = r.choice(["+", "-", "*", "/"])
            if o == "-" and (s == "True" or a.t.dtype == torch.bool):
                return
            first = r.random() < .7 or (o == "/" and not a.exact)  # (a rounded divisor: see div)
            return self.emit("scalar" + o, f"{x} {o} {s}" if first else f"{s} {o} {x}",
                             a.exact and o != "/" and (self.kind(a.t.dtype) != "f" and "." not in s))
        if c == "where":
            m = self.pick(lambda u: u.t.dtype == torch.bool and _broadcasts(u.t.shape, a.t.shape))
            if m is None:
                if not a.exact:
                    return
                return self.emit(c, f"torch.where({x} > 0, {x}, {y})", ex)
            return self.emit(c, f"torch.where({m.name}, {x}, {y})", ex)
        if c == "cmp":
            if not ex:
                return
            o = r.choice(["<", "<=", ">", ">=", "==", "!="])
            return self.emit("cmp", f"{x} {o} {y}", True)
        if c == "logical":
            return self.emit(c, f"torch.logical_{r.choice(['and', 'or', 'xor'])}({x}, {y})" if ex
                             else f"torch.logical_not({x})" if a.exact else "None", True)
        if c == "bitwise":
            return self.emit(c, f"torch.bitwise_{r.choice(['and', 'or', 'xor'])}({x}, {y})", ex)
        if c == "remainder":
            if not ex or ints:  # integer remainder by zero is a data-dependent error on CPU
                return
            return self.emit(c, f"torch.remainder({x}, {y})", False)

    def op_unary(self):
        r = self.r
        v = self.pick_or_new()
        x, t = v.name, v.t
        c = r.choice(["exp", "log", "tanh", "sigmoid", "sqrt", "abs", "neg", "sin", "cos", "relu",
                      "gelu", "rsqrt", "reciprocal", "erf", "log1p", "floor", "round", "sign",
                      "to", "clone", "square", "silu", "expm1", "tril", "flip", "roll", "repeat",
                      "clamp", "nan_to_num", "cumsum", "sort", "topk", "argsort", "nonzero"])
        k = self.kind(t.dtype)
        if c in ("exp", "log", "tanh", "sigmoid", "sqrt", "sin", "cos", "rsqrt", "reciprocal", "erf",
                 "log1p", "expm1"):
            if c in ("exp", "expm1") and not v.exact:  # a last-ulp input difference stays small
                x = f"{x}.clamp(-3, 3)"
            if c in ("log", "sqrt", "rsqrt", "reciprocal") and not v.exact and k == "f":
                # a rounded operand near 0 decides between NaN, -inf/inf and a finite value
                # (CPU's f16 layer_norm of one element is the rounding residue of an FMA, e.g.
                # -2.1e-05, where the exact value and tpu's is 0: log is NaN there, -inf on
                # tpu; seed 99353, as for div)
                x = f"({x}.abs() + 1)"
            return self.emit(c, f"torch.{c}({x})", False)
        if c in ("abs", "neg", "relu", "clone", "square"):
            if c == "neg" and k == "b":
                return
            return self.emit(c, f"torch.{c}({x})", v.exact and (c != "square" or k != "f"))
        if c in ("gelu", "silu"):
            return self.emit(c, f"F.{c}({x})", False)
        if c in ("floor", "round", "sign"):
            if not v.exact:
                return
            return self.emit(c, f"torch.{c}({x})", True)
        if c == "to":
            d = self.dtype()
            if self.kind(d) != "f" and k == "f" and not v.exact:
                return
            return self.emit(c, f"{x}.to({dname(d)})", v.exact and (self.kind(d) != "f" or k != "f" or
                                                                     d in (torch.float32, torch.float64)))
        if c == "tril":
            return self.emit(c, f"torch.tril({x}, {r.randint(-1, 1)})", v.exact)
        if c == "flip":
            return self.emit(c, f"torch.flip({x}, ({self.dim(t)},))", v.exact)
        if c == "roll":
            return self.emit(c, f"torch.roll({x}, {r.randint(-3, 3)}, {self.dim(t)})", v.exact)
        if c == "repeat":
            reps = tuple(r.choice([1, 1, 2, 3]) for _ in range(max(t.dim(), 1) + r.choice([0, 0, 1])))
            return self.emit(c, f"{x}.repeat({reps})", v.exact)
        if c == "clamp":
            return self.emit(c, f"torch.clamp({x}, min={r.choice([-1, 0, None])}, max={r.choice([1, 2])})",
                             v.exact)
        if c == "nan_to_num":
            return self.emit(c, f"torch.nan_to_num({x}, nan=0.0, posinf=1.0, neginf=-1.0)", v.exact)
        if c == "cumsum":
            return self.emit(c, f"torch.cumsum({x}, {self.dim(t)})", v.exact and k != "f")
        if c in ("sort", "argsort", "topk"):
            if not v.exact or k == "b" and c == "topk":
                return
            d = self.dim(t)
            desc = r.random() < .5
            if c == "sort":
                a, b = self.new(), self.new()
                return self.run({"src": f"{a}, {b} = torch.sort({x}, dim={d}, descending={desc}, stable=True)",
                                 "op": c, "dd": False}, [(a, True), (b, True)])
            if c == "argsort":
                return self.emit(c, f"torch.argsort({x}, dim={d}, descending={desc}, stable=True)", True)
            nd = t.dim()
            size = t.shape[d] if -nd <= d < nd and nd else 1
            kk = r.randint(0, size) if r.random() > .05 else size + 1
            return self.emit(c, f"torch.topk({x}, {kk}, {d}).values", True)
        if c == "nonzero":
            if not v.exact:
                return
            return self.emit(c, f"torch.nonzero({x})", True)

    def op_reduce(self):
        r = self.r
        v = self.pick_or_new()
        x, t = v.name, v.t
        k = self.kind(t.dtype)
        c = r.choice(["sum", "mean", "amax", "amin", "prod", "argmax", "argmin", "var", "std",
                      "logsumexp", "any", "all", "norm", "max_dim", "count_nonzero"])
        nd = t.dim()
        if nd and r.random() < .7:
            dims = sorted({self.dim(t) for _ in range(r.randint(1, min(nd, 3)))})
            dims = dims[0] if len(dims) == 1 and r.random() < .5 else tuple(dims)
        else:
            dims = None
        kd = r.random() < .4
        # a long sum of rounded values that cancel (a layer_norm output sums to 0) keeps their
        # absolute rounding, not a relative one of its result (seed 72272)
        coarse = 2 if c in ("sum", "mean") and k == "f" and not v.exact and t.numel() > 1000 else 0
        dt = ""
        if c in ("sum", "prod", "mean") and r.random() < .15:
            dt = f", dtype={dname(self.dtype('f'))}"
        if c == "prod" and (t.dtype in (torch.float16, torch.bfloat16) or "float16" in dt):
            # CPU multiplies 16-bit products in vector lanes of its own width: one lane at inf
            # and another at 0 give NaN where the product is +-inf (seed 37795); factors of at
            # most 1 in magnitude never overflow
            x = f"{x}.clamp(-1, 1)"
        if c in ("argmax", "argmin", "max_dim"):
            if not v.exact:
                return
            d = dims if isinstance(dims, int) else self.dim(t)
            if c == "max_dim":
                a, b = self.new(), self.new()
                return self.run({"src": f"{a}, {b} = torch.max({x}, {d}, keepdim={kd})", "op": c,
                                 "dd": False}, [(a, True), (b, True)])
            return self.emit(c, f"torch.{c}({x}, {d}, keepdim={kd})" if r.random() < .8
                             else f"torch.{c}({x})", True)
        if c in ("any", "all") and not v.exact and k == "f":
            return  # (a rounded value near 0 decides it: seed 31810, as for comparisons)
        if c == "count_nonzero":
            return self.emit(c, f"torch.count_nonzero({x}, {dims})" if v.exact else "None", True)
        if dims is None:
            if c == "logsumexp":  # (CPU's logsumexp refuses dim=(): a PyTorch quirk, not tested)
                dims = tuple(range(nd))
            dstr = "" if c != "logsumexp" else f", {dims}"
            if c in ("sum", "mean", "prod") and not dt and r.random() < .5:
                return self.emit(c, f"{x}.{c}()", v.exact and k != "f" and c != "mean", coarse=coarse)
            if c in ("amax", "amin"):
                dstr = ", dim=()"
        else:
            dstr = f", {dims}"
        if c in ("var", "std"):
            corr = r.choice([0, 1])
            return self.emit(c, f"torch.{c}({x}{dstr}, correction={corr}, keepdim={kd})", False)
        if c == "norm":
            return self.emit(c, f"torch.linalg.vector_norm({x}, {r.choice([1, 2])}{dstr}, keepdim={kd})",
                             False)
        if c == "prod" and not v.exact and not x.endswith(")"):
            x = f"{x}.clamp(-2, 2)"
        exact = v.exact and (k != "f" and c not in ("mean",) or c in ("amax", "amin", "any", "all"))
        extra = f"{dt}" if c in ("sum", "prod", "mean") else ""
        if c == "prod" and isinstance(dims, tuple):
            dstr = f", {dims[0]}" if dims else ""
        return self.emit(c, f"torch.{c}({x}{dstr}, keepdim={kd}{extra})", exact, coarse=coarse)

    def _index(self, n, allow_neg=False):
        """an index tensor source for a dim of size n: (src, list, out_of_range)"""
        r = self.r
        m = r.randint(0, 5)
        lo = -n if allow_neg else 0
        ids = [r.randint(lo, n - 1) for _ in range(m)] if n else []
        bad = False
        if r.random() < 0.06 and m:
            ids = ids or [0] * m
            ids[r.randrange(m)] = r.choice([n, n + 3, -n - 1])
            bad = True
        return ids, bad

    def op_index(self):
        r = self.r
        v = self.pick_or_new(lambda u: u.t.dim() > 0)
        x, t = v.name, v.t
        if t.dim() == 0:
            return
        nd = t.dim()
        c = r.choice(["index_select", "gather", "adv", "adv2", "mask", "index_put", "masked_fill",
                      "scatter_add", "take_along_dim", "setitem_adv", "index_fill"])
        d = r.randrange(nd)
        n = t.shape[d]
        if c == "index_select":
            ids, bad = self._index(n)
            return self.emit(c, f"torch.index_select({x}, {d}, torch.tensor({ids}, dtype=torch.int64, "
                                f"device=dev))", v.exact, dd=bad)
        if c in ("gather", "take_along_dim", "scatter_add"):
            shp = [r.randint(0, s) for s in t.shape]
            if r.random() < 0.03:
                shp[d] = shp[d] + 1
                shp = shp + [1]
            if 0 in shp and r.random() < .5:
                shp = [min(max(1, s), t.shape[i]) if i < nd else s for i, s in enumerate(shp)]
            hi = n
            dd = False
            if r.random() < .06:
                hi, dd = n + 2, True
            if hi == 0:
                idx = f"torch.zeros({tuple(shp)}, dtype=torch.int64, device=dev)"
            else:
                seed = r.randrange(1 << 30)
                idx = (f"torch.randint(0, {hi}, {tuple(shp)}, generator=torch.Generator()"
                       f".manual_seed({seed})).to(dev)")
            if c == "gather":
                return self.emit(c, f"torch.gather({x}, {d}, {idx})", v.exact, dd=dd)
            if c == "take_along_dim":
                return self.emit(c, f"torch.take_along_dim({x}, {idx}, {d})", v.exact, dd=dd)
            s = self.input(shp, t.dtype)
            return self.emit(c, f"{x}.scatter_add({d}, {idx}, {s.name})", v.exact and self.kind(t.dtype) != "f",
                             dd=dd)
        if c == "adv":
            ids, bad = self._index(n, allow_neg=True)
            pre = ":, " * d
            return self.emit(c, f"{x}[{pre}torch.tensor({ids}, dtype=torch.int64, device=dev)]", v.exact,
                             dd=bad)
        if c == "adv2":
            if nd < 2:
                return
            a, bad_a = self._index(t.shape[0], True)
            b, bad_b = self._index(t.shape[1], True)
            if r.random() < .85:
                b = (b * 5)[: len(a)] if b else []
                if len(b) < len(a):
                    b = b + [0] * (len(a) - len(b)) if t.shape[1] else b
            return self.emit(c, f"{x}[torch.tensor({a}, dtype=torch.int64, device=dev), "
                                f"torch.tensor({b}, dtype=torch.int64, device=dev)]", v.exact,
                             dd=(bad_a or bad_b) and (len(a) == len(b) or 1 in (len(a), len(b))))
        if c in ("mask", "masked_fill"):
            m = self.pick(lambda u: u.t.dtype == torch.bool and u.t.dim() <= nd and
                          tuple(u.t.shape) == tuple(t.shape[:u.t.dim()]) and u.t.dim() > 0)
            if m is None or r.random() < .3:
                ms = list(t.shape[: r.randint(1, nd)])
                if r.random() < .05:
                    ms[0] += r.choice([-1, 1]) if ms[0] else 1
                m = self.input(ms, torch.bool)
            if c == "mask":
                return self.emit(c, f"{x}[{m.name}]", v.exact)
            if not _broadcasts(m.t.shape, t.shape):
                return
            return self.emit(c, f"{x}.masked_fill({m.name}, {r.choice([0, 1.5, -3])})", v.exact)
        if c == "index_fill":
            ids, bad = self._index(n)
            return self.emit(c, f"{x}.index_fill({d}, torch.tensor({ids}, dtype=torch.int64, device=dev), "
                                f"{r.choice([0, -1, 2])})", v.exact, dd=bad)
        # index_put / setitem_adv: in place into a clone-free target (a view or variable)
        ids, bad = self._index(t.shape[0], allow_neg=True)
        acc = r.random() < .4
        # a non-accumulating put with repeated indices is undefined (CPU's own kernel writes
        # them in parallel over large tensors); setitem never accumulates
        if not acc or c == "setitem_adv":
            ids = sorted(set(i % t.shape[0] for i in ids)) if t.shape[0] else []
            if bad:
                ids = ids + [t.shape[0] + 1]
        vs = list(t.shape[1:])
        if r.random() < .5:
            vs = [len(ids)] + vs
        if r.random() < .04:
            vs = [len(ids) + 1] + list(t.shape[1:])
        val = self.input(vs, t.dtype)
        idx = f"torch.tensor({ids}, dtype=torch.int64, device=dev)"
        if c == "index_put":
            src = f"{x}.index_put_(({idx},), {val.name}, accumulate={acc})"
        else:
            if nd >= 2 and r.random() < .3:  # the two-index shape mismatch
                b = [0] * max(len(ids) - 1, 0)
                bad = bad or (t.shape[1] == 0 and len(b) > 0)  # index 0 of an empty dim
                src = f"{x}[{idx}, torch.tensor({b}, dtype=torch.int64, device=dev)] = 5"
            else:
                src = f"{x}[{idx}] = {val.name}"
        self.run({"src": src, "op": c, "dd": bad}, [], inplace=v,
                 exact_after=not acc or self.kind(t.dtype) != "f")

    def op_matmul(self):
        r = self.r
        dt = r.choice([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float16,
                       torch.int64])
        m, k, n = r.randint(0, 9), r.randint(0, 9), r.randint(0, 9)
        if r.random() < .1:
            m, k, n = r.randint(30, 70), r.randint(30, 70), r.randint(30, 70)
        form = r.choice(["mm", "bmm", "mv", "vv", "bcast", "linear"])
        if form == "mm":
            sa, sb = (m, k), (k, n)
        elif form == "bmm":
            b = r.randint(0, 3)
            sa, sb = (b, m, k), (b, k, n)
        elif form == "mv":
            sa, sb = (m, k), (k,)
        elif form == "vv":
            sa, sb = (k,), (k,)
        elif form == "bcast":
            sa, sb = (r.randint(1, 3), 1, m, k), (r.randint(1, 2), k, n)
            sa = (sa[0], sb[0], m, k)
        else:
            sa, sb = (m, k), (n, k)
        if r.random() < .04:
            sb = tuple(s + 1 for s in sb)
        a = self.pick(lambda u: tuple(u.t.shape) == sa and u.t.dtype == dt) or self.input(sa, dt)
        b = self.pick(lambda u: tuple(u.t.shape) == sb and u.t.dtype == dt) or self.input(
            sb, dt if r.random() > .03 else torch.float64)
        if form == "linear":
            return self.emit("linear", f"F.linear({a.name}, {b.name})", False)
        bt = f"{b.name}.t()" if False else b.name
        if form == "mm" and r.random() < .3:  # non-contiguous operand
            return self.emit("matmul", f"{a.name}.t().contiguous().t() @ {bt}", dt == torch.int64 and a.exact and b.exact)
        return self.emit("matmul", f"{a.name} @ {bt}", dt == torch.int64 and a.exact and b.exact)

    def op_nn(self):
        r = self.r
        v = self.pick_or_new()
        x, t = v.name, v.t
        c = r.choice(["softmax", "log_softmax", "layer_norm", "softmax_dtype"])
        if self.kind(t.dtype) == "f" and not v.exact:
            x = f"{x}.clamp(-20, 20)"
        if c in ("softmax", "log_softmax"):
            return self.emit(c, f"torch.{c}({x}, {self.dim(t)})", False)
        if c == "softmax_dtype":
            return self.emit(c, f"torch.log_softmax({x}, {self.dim(t)}, dtype=torch.float32)", False)
        nd = t.dim()
        kk = r.randint(1, nd) if nd else 0
        ns = tuple(t.shape[nd - kk:])
        if r.random() < .03 and ns:
            ns = ns[:-1] + (ns[-1] + 1,)
        if r.random() < .5 and ns and self.kind(t.dtype) == "f":
            w = self.input(ns, t.dtype)
            b = self.input(ns, t.dtype)
            return self.emit(c, f"F.layer_norm({x}, {ns}, {w.name}, {b.name})", False)
        return self.emit(c, f"F.layer_norm({x}, {ns})", False)

    def op_cat(self):
        r = self.r
        a = self.pick_or_new(lambda u: u.t.dim() > 0)
        t = a.t
        if t.dim() == 0:
            return
        c = r.choice(["cat", "stack", "cat", "cat_empty"])
        d = r.randrange(t.dim())
        parts = [a]
        for _ in range(r.randint(1, 3)):
            s = list(t.shape)
            if c in ("cat", "cat_empty"):
                s[d] = r.randint(0, 4)
            if r.random() < .04:
                s[(d + 1) % len(s)] += 1
            cand = self.pick(lambda u: tuple(u.t.shape) == tuple(s))
            parts.append(cand or self.input(s, t.dtype if r.random() < .6 else self.dtype()))
        names = ", ".join(p.name for p in parts)
        ex = all(p.exact for p in parts)
        if c == "cat_empty" and r.random() < .5:
            names += ", torch.empty(0, device=dev)"  # legacy 1-D empty operand
        if c == "stack":
            return self.emit(c, f"torch.stack([{names}], {self.dim(t, extra=1)})", ex)
        return self.emit("cat", f"torch.cat([{names}], {d if r.random() < .8 else self.dim(t)})", ex)

    def op_item(self):
        v = self.pick(lambda u: u.t.numel() == 1)
        if v is None:
            return
        return self.emit("item", f"torch.tensor({v.name}.item(), dtype={v.name}.dtype, device=dev)", v.exact)

    def generate(self):
        ops = [(self.op_view, 9), (self.op_inplace, 4), (self.op_binary, 6), (self.op_unary, 5),
               (self.op_reduce, 4), (self.op_index, 4), (self.op_matmul, 2), (self.op_nn, 2),
               (self.op_cat, 2), (self.op_item, 1)]
        for _ in range(self.r.randint(1, 3)):
            self.input()
        steps = 0
        while steps < self.n_ops:
            steps += 1
            f = self.r.choices([o for o, _ in ops], [w for _, w in ops])[0]
            try:
                f()
            except Exception as e:  # a generator bug must not stop the fuzzer; keep it visible
                raise RuntimeError(f"fuzz generator failed at seed {self.seed}: {e!r}") from e
            if self.lines and self.lines[-1]["dd"] and self.lines[-1]["cpu_err"]:
                break  # a data-dependent error ends the program
        self.lines = [ln for ln in self.lines if not ln["src"].endswith("= None")]
        return self.lines


def _order_dependent(w, t):
    """True when writing w in place from t is order-dependent: t shares w's memory in a way
    CPU's overlap check cannot decide (not both dense: "too hard", no error), so CPU's
    result is that of its own loop order (seed 44960: t2.add_(t2.narrow(-1, 1, 1)))"""
    if w.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or 0 in (w.numel(), t.numel()):
        return False
    if (w.data_ptr(), w.shape, w.stride()) == (t.data_ptr(), t.shape, t.stride()):
        return False  # the same elements: element-wise, no order
    return not (w.is_contiguous() and t.is_contiguous())


def _broadcasts(a, b):
    """True when shape a broadcasts to shape b (result shape b)"""
    a, b = list(a), list(b)
    if len(a) > len(b):
        return False
    for x, y in zip(reversed(a), reversed(b)):
        if x != y and x != 1:
            return False
    return True


def generate(seed, n_ops=None):
    """the program of a seed: a list of line dicts (src, op, dd, cpu_err)"""
    return Gen(seed, n_ops).generate()

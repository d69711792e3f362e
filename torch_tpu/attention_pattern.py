"""Attention written out by hand, found in a Dynamo graph and replaced by one
scaled_dot_product_attention call (the compile backend runs this before AOTAutograd).

The pattern, as models write it (examples/train_gpt.py, nanoGPT, minGPT)::

    s = (q @ k.transpose(-2, -1)) * scale        # or / d, or no scale
    s = s.masked_fill(m, float("-inf"))          # optional: m true = hidden
      | s = s + bias                             #   or an additive float mask
    p = F.softmax(s, dim=-1)                     # or s.softmax(-1), torch.softmax; a
                                                 # dtype= argument only the scores' own
    p = p.to(dtype)                              # optional, where it changes nothing
    p = F.dropout(p, prob, training)             # optional (nn.Dropout inlined)
    y = p @ v

becomes ``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)``:
``m = ~torch.ones(T, T, dtype=bool).tril()`` becomes is_causal=True, ``m = ~c`` the boolean
mask c, any other m its negation. AOTAutograd then traces sdpa into the fused forward and
backward ops (torch_tpu/csrc/attention.cpp), so the T x T scores and probabilities of the
match never exist in memory and the backward needs no saved probabilities.

A match needs: tpu tensors of one float dtype (float32, bfloat16, float16), 3-d or 4-d q, k,
v with equal leading dims (no broadcasting matmul), static sizes, every intermediate (scores,
scaled, masked, probabilities, dropped) used only by the next step, a scale that is a Python
number and a masked_fill value of -inf exactly (-1e9 differs on fully masked rows), and (without
dropout) at least TORCH_TPU_SDPA_FUSED_MIN_SCORES queries x keys, below which sdpa would take
the math path anyway (attention.cpp). Anything else is left as it is.
"""
import math
import operator

import torch
import torch.nn.functional as F

from . import _C

_MATMUL = {operator.matmul, torch.matmul}
_SOFTMAX = {F.softmax, torch.softmax, torch.nn.functional.softmax}
_DROPOUT = {F.dropout, torch.dropout}
_MUL = {operator.mul, torch.mul}
_DIV = {operator.truediv, torch.div}
_ADD = {operator.add, torch.add}
_INVERT = {operator.invert, torch.logical_not, torch.bitwise_not}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _is(node, fns, method=None):
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function" and node.target in fns:
        return True
    return method is not None and node.op == "call_method" and node.target == method


def _val(node):
    v = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _static(t):
    return all(isinstance(s, int) for s in t.shape)


def _arg(node, i, name, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _only_user(node, user):
    return len(node.users) == 1 and user in node.users


def _last_dim(dim, nd):
    return isinstance(dim, int) and dim in (-1, nd - 1)


def _transposed_key(kt):
    """k when kt is k.transpose(-2, -1) (either order, or by positive dims)."""
    if not _is(kt, {torch.transpose}, "transpose") or len(kt.args) < 3 or kt.kwargs:
        return None
    k = kt.args[0]
    kv = _val(k)
    if kv is None:
        return None
    nd = kv.dim()
    dims = {d % nd if isinstance(d, int) else None for d in kt.args[1:3]}
    return k if dims == {nd - 2, nd - 1} else None


def _causal(c, tq, tk):
    """Whether bool tensor node c is torch.ones(n, n, dtype=bool).tril() with n == tq == tk."""
    if not _is(c, {torch.tril}, "tril"):
        return False
    diag = c.args[1] if len(c.args) > 1 else c.kwargs.get("diagonal", 0)
    o = c.args[0] if c.args else None
    if diag != 0 or not _is(o, {torch.ones}):
        return False
    cv = _val(c)
    return (cv is not None and cv.dtype == torch.bool and tuple(cv.shape) == (tq, tk) and
            tq == tk)


def _match(graph, out):
    """The sdpa arguments and the chain's nodes for `out` = p @ v, or None."""
    if not _is(out, _MATMUL) or len(out.args) != 2 or out.kwargs:
        return None
    p, v = out.args
    chain = []
    dropout_p = 0.0
    if _is(p, _DROPOUT, "dropout"):
        if p.op == "call_method":
            return None
        prob, training = _arg(p, 1, "p", 0.5), _arg(p, 2, "train" if p.target is torch.dropout
                                                  else "training", True)
        inplace = _arg(p, 3, "inplace", False)
        if not isinstance(prob, (int, float)) or not isinstance(training, bool) or inplace:
            return None
        chain.append(p)
        dropout_p = float(prob) if training else 0.0
        p = p.args[0]
    if _is(p, set(), "to") and len(p.args) == 2 and not p.kwargs:
        # Hugging Face's softmax(..., dtype=float32).to(query.dtype): kept when it changes
        # nothing
        pv = _val(p.args[0]) if isinstance(p.args[0], torch.fx.Node) else None
        if pv is None or p.args[1] != pv.dtype:
            return None
        chain.append(p)
        p = p.args[0]
    if not _is(p, _SOFTMAX, "softmax"):
        return None
    sv = _val(p)
    if sv is None or sv.dim() not in (3, 4):
        return None
    dim = _arg(p, 1, "dim")
    dtype = _arg(p, 3 if p.target is F.softmax else 2, "dtype")
    scores = _val(p.args[0]) if isinstance(p.args[0], torch.fx.Node) else None
    if not _last_dim(dim, sv.dim()) or scores is None:
        return None
    if dtype is not None and dtype != scores.dtype:  # a softmax in another dtype
        return None
    chain.append(p)
    s = p.args[0]
    mask, causal, bias = None, False, None
    if _is(s, {torch.masked_fill}, "masked_fill"):
        if len(s.args) != 3 or s.kwargs or s.args[2] != -math.inf:
            return None
        m = s.args[1]
        if not isinstance(m, torch.fx.Node):
            return None
        chain.append(s)
        mask = m
        s = s.args[0]
    elif _is(s, _ADD) and len(s.args) == 2 and not s.kwargs:
        a, b = s.args
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
            return None
        chain.append(s)
        # the scores are the operand made by the scale or the matmul
        s, bias = (a, b) if _is(a, _MUL | _DIV | _MATMUL) else (b, a)
    scale = 1.0
    if _is(s, _MUL) and len(s.args) == 2 and not s.kwargs:
        a, b = s.args
        c, s2 = (b, a) if isinstance(b, (int, float)) else (a, b)
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            return None
        chain.append(s)
        scale, s = float(c), s2
    elif _is(s, _DIV) and len(s.args) == 2 and not s.kwargs:
        if not isinstance(s.args[1], (int, float)) or isinstance(s.args[1], bool) or not s.args[1]:
            return None
        chain.append(s)
        scale, s = 1.0 / float(s.args[1]), s.args[0]
    if not _is(s, _MATMUL) or len(s.args) != 2 or s.kwargs:
        return None
    chain.append(s)
    q, kt = s.args
    k = _transposed_key(kt)
    if k is None:
        return None
    # each intermediate feeds only the next step
    users = [out] + chain[:-1]
    if not all(_only_user(n, u) for n, u in zip(chain, users)):
        return None
    qv, kv, vv = _val(q), _val(k), _val(v)
    if qv is None or kv is None or vv is None:
        return None
    nd = qv.dim()
    if nd not in (3, 4) or kv.dim() != nd or vv.dim() != nd:
        return None
    if qv.device.type != "tpu" or qv.dtype not in _FLOATS:
        return None
    if any(t.device != qv.device or t.dtype != qv.dtype for t in (kv, vv)):
        return None
    if not all(_static(t) for t in (qv, kv, vv)):
        return None
    if qv.shape[:-2] != kv.shape[:-2] or kv.shape[:-1] != vv.shape[:-1]:
        return None
    tq, tk = qv.shape[-2], kv.shape[-2]
    if qv.shape[-1] != kv.shape[-1] or tuple(sv.shape) != tuple(qv.shape[:-1]) + (tk,):
        return None
    if dropout_p == 0.0 and tq * tk < _C.sdpa_fused_min_scores():
        return None  # sdpa would take the math path: the graph's own ops are that already
    attn_mask = None
    if mask is not None:
        mv = _val(mask)
        if mv is None or mv.dtype != torch.bool or not _static(mv) or mv.device != qv.device:
            return None
        hidden = mask
        if _is(hidden, _INVERT, "logical_not") or _is(hidden, set(), "bitwise_not"):
            c = hidden.args[0]
            cv = _val(c)
            if cv is not None and cv.dtype == torch.bool:
                if _causal(c, tq, tk):
                    causal = True
                else:
                    attn_mask = c
            else:
                attn_mask = ("not", mask)
        else:
            attn_mask = ("not", mask)
    elif bias is not None:
        bv = _val(bias)
        if bv is None or bv.dtype != qv.dtype or not _static(bv) or bv.device != qv.device:
            return None
        attn_mask = bias
    return dict(q=q, k=k, v=v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal,
                scale=scale, chain=chain)


def rewrite(gm):
    """Replaces each hand-written attention of Dynamo graph gm by one sdpa call, in place;
    returns the number of matches."""
    graph = gm.graph
    found = 0
    for out in list(graph.nodes):
        if out.graph is not graph or out.op not in ("call_function", "call_method"):
            continue
        m = _match(graph, out)
        if m is None:
            continue
        with graph.inserting_before(out):
            mask = m["attn_mask"]
            if isinstance(mask, tuple):
                mask = graph.call_function(torch.logical_not, (mask[1],))
            new = graph.call_function(
                F.scaled_dot_product_attention, (m["q"], m["k"], m["v"]),
                dict(attn_mask=mask, dropout_p=m["dropout_p"], is_causal=m["is_causal"],
                     scale=m["scale"]))
        new.meta.update(out.meta)
        out.replace_all_uses_with(new)
        graph.erase_node(out)
        # the chain, then what only it used (the mask's negation, tril and ones), if unused
        dead = list(m["chain"])
        while dead:
            n = dead.pop(0)
            if (not getattr(n, "_erased", False) and not n.users and not n.is_impure() and
                    n.op in ("call_function", "call_method")):
                inputs = [a for a in n.all_input_nodes if a.op != "placeholder"]
                graph.erase_node(n)
                dead.extend(inputs)
        found += 1
    if found:
        graph.lint()
        gm.recompile()
    return found

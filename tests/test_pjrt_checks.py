"""Data-dependent errors on the pjrt target: XLA clamps an index that is out of range (and bernoulli
takes any probability), so each indexing lowering (and bernoulli's) also computes, on the device, whether its indices lie in CPU's range; a program
that fails a check raises CPU's exception type at the next synchronization (as a host kernel's
error does), naming the op, and the device keeps working. In Debug mode it raises at the op."""
import textwrap

from tests.test_pjrt_target import pytestmark, run_pjrt  # noqa: F401  (the skip mark)

CASES = """
import warnings
warnings.simplefilter("ignore")

def cases(dev):
    x = torch.arange(12.0, device=dev).reshape(4, 3)
    t = lambda *v: torch.tensor(v, device=dev)
    one = torch.ones(1, 3, device=dev)
    return {
        "gather": lambda: x.gather(0, torch.tensor([[7, 0, 0]], device=dev)),
        "gather_negative": lambda: x.gather(0, torch.tensor([[-1, 0, 0]], device=dev)),
        "index_select": lambda: x.index_select(0, t(7)),
        "index_select_negative": lambda: x.index_select(0, t(-1)),
        "index": lambda: x[t(4)],
        "index_negative": lambda: x[t(-5)],
        "index_negative_in_range": lambda: x[t(-4)],
        "take": lambda: x.take(t(12)),
        "take_negative_in_range": lambda: x.take(t(-12)),
        "scatter": lambda: x.scatter(0, torch.tensor([[4, 0, 0]], device=dev), 1.0),
        "scatter_add": lambda: x.scatter_add(0, torch.tensor([[4, 0, 0]], device=dev), one),
        "index_add": lambda: x.index_add(0, t(4), one),
        "index_copy": lambda: x.index_copy(0, t(-1), one),
        "index_fill": lambda: x.index_fill(0, t(-5), 1.0),
        "index_fill_negative_in_range": lambda: x.index_fill(0, t(-4), 1.0),
        "index_put": lambda: x.index_put((t(4),), torch.tensor(1.0, device=dev)),
        "put": lambda: x.put(t(12), torch.tensor([1.0], device=dev)),
        "embedding": lambda: torch.nn.functional.embedding(t(4), x),
        "bernoulli": lambda: torch.bernoulli(torch.tensor([0.5, 2.0], device=dev)),
        "bernoulli_nan": lambda: torch.empty(2, device=dev).bernoulli_(torch.tensor([0.5, float("nan")], device=dev)),
        "bernoulli_in_range": lambda: torch.bernoulli(torch.tensor([0.0, 1.0], device=dev)),
    }

def outcome(f, dev):
    try:
        r = f()
        if dev == "tpu":
            torch.tpu.synchronize()
        return ("ok", r.cpu())
    except Exception as e:
        return (type(e).__name__, str(e))
"""


def with_cases(body):
    """the body after the cases' definitions (each dedented on its own: the cases are
    top-level code, so a body left indented would run inside outcome() and never at all)"""
    return CASES + textwrap.dedent(body)


def test_out_of_range_indices_raise_cpu_exception_types():
    run_pjrt(with_cases("""
        cpu, tpu = cases("cpu"), cases("tpu")
        for name in cpu:
            ce, te = outcome(cpu[name], "cpu"), outcome(tpu[name], "tpu")
            assert ce[0] == te[0], (name, ce, te)
            if ce[0] == "ok":
                assert torch.equal(ce[1], te[1]), (name, ce, te)
            else:
                op = {"embedding": "index_select", "bernoulli_nan": "bernoulli_"}.get(
                    name, name.split("_negative")[0])
                assert op + "()" in te[1] and ("out" in te[1] or "[0, 1]" in te[1]), (name, te)
            same(torch.ones(3, device="tpu") * 2, torch.ones(3) * 2)  # the device keeps working
    """))


def test_a_failed_check_in_a_fused_graph_names_its_op_and_loses_nothing():
    run_pjrt(with_cases("""
        torch_tpu.set_eager_mode("defer_and_fuse")
        keep = torch.arange(6.0).to("tpu") * 3
        x = torch.randn(5, 4).to("tpu")
        y = (x * 2).exp().index_select(0, torch.tensor([1, 9]).to("tpu")).sum()
        try:
            y.item()
            raise SystemExit("no error")
        except IndexError as e:
            assert "index_select()" in str(e) and "size 5" in str(e), str(e)
        same(keep, torch.arange(6.0) * 3)  # an earlier live tensor keeps its value
        same((x * 2).exp().index_select(0, torch.tensor([1, 3]).to("tpu")), (x.cpu() * 2).exp()[[1, 3]],
             atol=1e-6, rtol=1e-6)
    """))


def test_debug_mode_raises_at_the_op():
    run_pjrt(with_cases("""
        torch_tpu.set_eager_mode("debug")
        x = torch.arange(4.0).to("tpu")
        try:
            x.gather(0, torch.tensor([4]).to("tpu"))
            raise SystemExit("no error at the op")
        except RuntimeError as e:
            assert "gather()" in str(e), str(e)
        same(x.gather(0, torch.tensor([3]).to("tpu")), torch.tensor([3.0]))
    """))

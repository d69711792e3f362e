"""The short, deterministic part of the differential fuzzer (fixed seeds; ~1 min on 2 cores).
The long run: `python -m tests.fuzz.run --seed 1000 --count 30000` (README, docs/design.md)."""
import io
import os

from tests.fuzz.gen import generate
from tests.fuzz.run import fuzz, reproducer

SEED = 0
COUNT = int(os.environ.get("TORCH_TPU_FUZZ_COUNT", "40"))


def test_generator_is_deterministic():
    assert generate(123) == generate(123)
    assert generate(123) != generate(124)


def test_reproducer_is_self_contained_python():
    lines = generate(5)
    for mode in ("strict", "compile"):
        src = reproducer(lines, mode, {"kind": "value", "op": "x", "detail": "d"}, 5)
        compile(src, "<reproducer>", "exec")
        assert "def mk(" in src


def test_fuzz_short_run():
    out = io.StringIO()
    s = fuzz(SEED, COUNT, jobs=2, compile_every=8, out=out)
    assert s["programs"] == COUNT
    assert s["crashes"] == 0 and s["hangs"] == 0 and s["failures"] == 0, out.getvalue()


def test_compare_flags_values_dtypes_shapes():
    import torch
    from tests.fuzz.worker import compare_tensor
    e = torch.tensor([1.0, 2.0, float("nan"), float("inf")])
    assert compare_tensor(e.clone(), e) is None
    assert compare_tensor(torch.tensor([1.0, 2.1, float("nan"), float("inf")]), e)[0] == "value"
    assert compare_tensor(torch.tensor([1.0, 2.0, float("nan"), -float("inf")]), e)[0] == "value"
    assert compare_tensor(e.double(), e)[0] == "dtype"
    assert compare_tensor(e[:2], e)[0] == "shape"


def test_pool_reports_crash_and_hang(monkeypatch):
    from tests.fuzz import run
    monkeypatch.setitem(run.TIMEOUT, "strict", 20)
    pool = run.Pool(1)
    try:
        crash = run.run_one(pool, [{"src": "import os; os._exit(3)", "op": "x", "dd": False}], "strict")
        hang = run.run_one(pool, [{"src": "import time; time.sleep(600)", "op": "x", "dd": False}], "strict")
        ok = run.run_one(pool, [{"src": "t0 = mk(1, (3,), torch.float32, dev) * 2", "op": "x", "dd": False}],
                         "strict")
    finally:
        pool.close()
    assert [m["kind"] for m in crash] == ["crash"]
    assert [m["kind"] for m in hang] == ["hang"]
    assert ok == []


def test_explain_value_only_vouches_for_right_ops():
    """a value difference counts as explained only when CPU's op on tpu's inputs (or in float64)
    gives tpu's value, and only for a variable no later line touches"""
    import torch
    import torch_tpu  # noqa: F401
    from tests.fuzz.worker import AMPLIFIED, F64_SAME, _snapshot, explain_value
    lines = ["t1 = mk(835745951, (3, 3, 4444), torch.float32, dev)",
             "t5 = torch.linalg.vector_norm(t1, 1, keepdim=True)",
             "t16 = torch.cos(t5)"]
    cpu, _ = _snapshot(lines, 3, "cpu")
    tpu, _ = _snapshot(lines, 3, "tpu", "strict")
    right = torch.cos(tpu["t5"])  # what a right cos gives on tpu's input
    assert AMPLIFIED in explain_value(lines, "t16", right, cpu["t16"], "strict")
    wrong = right + 0.25
    assert explain_value(lines, "t16", wrong, cpu["t16"], "strict") == ""
    assert explain_value(lines + ["t17 = t16 * 2"], "t16", right, cpu["t16"], "strict") == ""
    # tpu's value is the float64 result and CPU's is further off (on this input CPU's float32
    # op on tpu's inputs may already be close enough: either tag vouches)
    f64 = torch.linalg.vector_norm(cpu["t1"].double(), 1, keepdim=True).float()
    assert explain_value(lines[:2], "t5", f64, f64 * (1 + 1e-3), "strict").strip() in (AMPLIFIED, F64_SAME)
    assert explain_value(lines[:2], "t5", f64 * (1 + 1e-3), f64, "strict") == ""
    # a float32 sum that cancels: CPU's float32 result 0, float64's 1
    lines = ["t1 = torch.tensor([1e8, 1.0, -1e8], device=dev)", "t5 = t1.sum()"]
    one, zero = torch.tensor(1.0), torch.tensor(0.0)
    assert F64_SAME in explain_value(lines, "t5", one, zero, "strict")
    assert explain_value(lines, "t5", torch.tensor(2.0), zero, "strict") == ""

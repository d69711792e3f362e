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

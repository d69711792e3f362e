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

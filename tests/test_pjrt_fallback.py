"""Ops without a lowering on the pjrt target: NotImplementedError naming the op and the target, or,
with TORCH_TPU_CPU_FALLBACK=1, the CPU kernel through explicit copies with one warning.
(special_airy_ai is the suite's example of an op without a lowering: tests/test_stablehlo.py.)"""
from tests.test_pjrt_target import pytestmark, run_pjrt  # noqa: F401  (the skip mark)


def test_op_without_lowering_raises_naming_it():
    run_pjrt("""
        x = torch.rand(8).to("tpu")
        try:
            torch.special.airy_ai(x)
            raise SystemExit("no error")
        except NotImplementedError as e:
            assert "special_airy_ai" in str(e) and "pjrt" in str(e), str(e)
        same(x + 1, x.cpu() + 1)   # the device keeps working
    """)


def test_cpu_fallback_runs_it_with_one_warning():
    run_pjrt("""
        import warnings
        xc = torch.rand(8) * 3
        x = xc.to("tpu")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y = torch.special.airy_ai(x)
            y2 = torch.special.airy_ai(x * 2)
        msgs = [str(m.message) for m in w if "airy_ai" in str(m.message)]
        assert len(msgs) == 1 and "CPU" in msgs[0], msgs
        same(y, torch.special.airy_ai(xc), atol=1e-6, rtol=1e-5)
        same(y2, torch.special.airy_ai(xc * 2), atol=1e-6, rtol=1e-5)
    """, env={"TORCH_TPU_CPU_FALLBACK": "1"})

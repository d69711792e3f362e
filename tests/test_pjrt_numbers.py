"""Python numbers on the pjrt target: a floating number an op uses as a value (a learning rate,
an Adam bias correction, a loss scale) is an argument of the program, not a constant, so a value
that changes every step reuses the program; a number the lowering holds as a constant (a branch,
a literal) is checked on every reuse, so a new value never runs an old program."""
import textwrap

from tests.test_pjrt_target import pytestmark, run_pjrt  # noqa: F401  (the skip mark)

STATS = """
def stats():
    torch.tpu.synchronize()
    return torch_tpu._C.pjrt_stats()

def composed(s0, s1):  # programs composed (not found by their call key)
    return (s1["runs"] - s0["runs"]) - (s1["call_hits"] - s0["call_hits"])
"""


def run(code):
    run_pjrt(STATS + textwrap.dedent(code))


def test_changing_numbers_reuse_the_program_in_strict():
    run("""
        xc = torch.randn(64); x = xc.to("tpu")
        dc = xc.abs() + 1; d = dc.to("tpu")
        ops = [lambda t, lr: t.mul(lr), lambda t, lr: t.add(t, alpha=2 * lr),
               lambda t, lr: t.sub(lr), lambda t, lr: t.div(1 + lr),
               lambda t, lr: torch.addcdiv(t, t, d if t.is_tpu else dc, value=-lr),
               lambda t, lr: torch.addcmul(t, t, t, value=lr),
               lambda t, lr: torch.lerp(t, t * 0, lr)]
        for _ in range(3):  # compiles: a fresh output storage, then a reused one
            for f in ops:
                f(x, 0.125)
        s0 = stats()
        for lr in [0.1, 0.2, 0.3, 1.0, 1e-3, -2.5]:
            for f in ops:
                same(f(x, lr), f(xc, lr), atol=1e-6, rtol=1e-6)
        s1 = stats()
        assert s1["compiles"] == s0["compiles"], (s0, s1)
        assert composed(s0, s1) == 0, (s0, s1)
    """)


def test_numbers_held_as_constants_are_checked():
    # nan_to_num's replacement values and leaky_relu's slope are constants of their programs:
    # each new value composes (or finds) its own, and an old one never runs for a new value.
    run("""
        xc = torch.tensor([float("nan"), float("inf"), -float("inf"), -1.5, 2.0]); x = xc.to("tpu")
        vals = [0.0, 1.0, -3.25, 7.5, 0.5, 2.0, 9.0, -1.0, 4.0, 11.0, 0.25]
        for _ in range(2):  # more values than a key keeps plans for, twice
            for v in vals:
                same(torch.nan_to_num(x, nan=v, posinf=v + 1, neginf=v - 1),
                     torch.nan_to_num(xc, nan=v, posinf=v + 1, neginf=v - 1))
                same(F.leaky_relu(x[3:], v), F.leaky_relu(xc[3:], v))
        s0 = stats()
        same(torch.nan_to_num(x, nan=vals[0], posinf=1.0, neginf=-1.0),
             torch.nan_to_num(xc, nan=vals[0], posinf=1.0, neginf=-1.0))
        s1 = stats()
        assert s1["compiles"] == s0["compiles"], (s0, s1)  # the first value's program is kept
    """)


def test_optimizer_steps_compile_once():
    # AdamW's bias corrections and step sizes change every step (Python floats), in Strict and in
    # DeferAndFuse: after the first steps nothing is composed or compiled.
    run("""
        import copy
        for mode in ["strict", "defer_and_fuse"]:
            torch.manual_seed(0)
            ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
            dev = copy.deepcopy(ref).to("tpu")
            opt_c = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
            opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2, weight_decay=0.1)
            sched_c = torch.optim.lr_scheduler.ExponentialLR(opt_c, 0.9)
            sched_d = torch.optim.lr_scheduler.ExponentialLR(opt_d, 0.9)
            data = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(6)]
            with torch_tpu.eager_mode(mode):
                for step, (xb, yb) in enumerate(data):
                    if step == 3:
                        s0 = stats()
                    for m, o, s, dv in [(ref, opt_c, sched_c, "cpu"), (dev, opt_d, sched_d, "tpu")]:
                        loss = (m(xb.to(dv)) - yb.to(dv)).pow(2).mean()
                        o.zero_grad()
                        loss.backward()
                        o.step()
                        s.step()
                    torch_tpu.materialize()
            s1 = stats()
            assert s1["compiles"] == s0["compiles"], (mode, s0, s1)
            assert composed(s0, s1) == 0, (mode, s0, s1)
            for p, q in zip(dev.parameters(), ref.parameters()):
                same(p.detach(), q.detach(), atol=1e-5, rtol=1e-5)
    """)

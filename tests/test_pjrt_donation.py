"""Buffer donation on the pjrt target: an in-place update gives its storage's buffer to the
program's result (tf.aliasing_output) when no other reader holds it, so updating a tensor in
place needs no second copy of it; what other tensors and views see is unchanged."""
from tests.test_pjrt_target import pytestmark, run_pjrt  # noqa: F401  (the skip mark)


def test_in_place_updates_donate_their_buffer():
    run_pjrt("""
        xc = torch.randn(1000); x = xc.to("tpu")
        v = x[::2]                      # a view of the same storage
        torch.tpu.synchronize()
        s0 = torch_tpu._C.pjrt_stats()
        for _ in range(5):
            x.add_(1.0); xc.add_(1.0)
            x.mul_(0.5); xc.mul_(0.5)
        torch.tpu.synchronize()
        s1 = torch_tpu._C.pjrt_stats()
        assert s1["donated"] - s0["donated"] >= 8, (s0, s1)
        same(x, xc)
        same(v, xc[::2])
        y = x.clone()                   # taken before the next update: keeps the old values
        x.add_(2); yc = xc.clone(); xc.add_(2)
        same(y, yc)
        same(x, xc)
    """)


def test_optimizer_step_in_defer_and_fuse_donates():
    run_pjrt("""
        torch.manual_seed(0)
        w = torch.randn(64, 64)
        p = w.to("tpu").requires_grad_()
        q = w.clone().requires_grad_()
        opt_d, opt_c = torch.optim.SGD([p], lr=0.1, momentum=0.9), torch.optim.SGD([q], lr=0.1, momentum=0.9)
        with torch_tpu.eager_mode("defer_and_fuse"):
            for _ in range(3):
                for t, o in [(p, opt_d), (q, opt_c)]:
                    o.zero_grad()
                    (t * t).sum().backward()
                    o.step()
                torch_tpu.materialize()
        torch.tpu.synchronize()
        assert torch_tpu._C.pjrt_stats()["donated"] > 0
        same(p.detach(), q.detach(), atol=1e-5, rtol=1e-5)
    """)

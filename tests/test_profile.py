"""torch_tpu.debug.kernel_profile(): per-op kernel time and call counts."""
import threading

import torch

import torch_tpu
import torch_tpu.debug as debug


def test_counts_calls_per_op_inside_the_block_only():
    x = torch.randn(128, 128, device="tpu")
    (x @ x).relu()  # outside the block: not counted
    torch.tpu.synchronize()
    with debug.kernel_profile() as prof:
        for _ in range(3):
            y = (x @ x).relu()
        z = y.sum()
    assert prof.ops["mm"][0] == 3
    assert prof.ops["relu"][0] == 3
    assert prof.ops["sum"][0] == 1
    assert all(s > 0 for _, s in prof.ops.values())
    assert abs(prof.total_seconds - sum(s for _, s in prof.ops.values())) < 1e-12
    assert prof.seconds("mm", "no_such_op") == prof.ops["mm"][1]
    table = prof.table()
    assert table.splitlines()[0].split() == ["op", "calls", "seconds", "share"]
    assert any(line.startswith("mm ") for line in table.splitlines())
    torch.testing.assert_close(z.cpu(), (x.cpu() @ x.cpu()).relu().sum(), rtol=1e-2, atol=1e-1)
    # off after the block
    with debug.kernel_profile() as empty:
        pass
    assert empty.ops == {}


def test_fused_groups_count_once():
    """A matmul-epilogue group counts as one fused entry; the GEMM inside it is not counted
    again (only the outermost run on a thread counts)."""
    x = torch.randn(512, 64, device="tpu")
    w = torch.randn(64, 64, device="tpu")

    def fn():
        return torch.nn.functional.gelu(x @ w) + 1.0

    with torch_tpu.eager_mode("defer_and_fuse"):
        first = fn()
        torch.tpu.synchronize()
        torch_tpu.modes.wait_compiles()
        del first
        with debug.kernel_profile() as prof:
            out = fn()
            torch.tpu.synchronize()
    torch.testing.assert_close(out.cpu(), fn().cpu(), rtol=1e-5, atol=1e-5)
    # mm, gelu and add ran as one epilogue group: one entry, the GEMM not counted again
    assert list(prof.ops) == ["fused.matmul_epilogue"], prof.ops
    assert prof.ops["fused.matmul_epilogue"][0] == 1


def test_streams_and_threads_are_all_counted():
    """Kernels queued from another Python thread (its own stream) are counted too."""
    x = torch.randn(64, 64, device="tpu")
    with debug.kernel_profile() as prof:
        def work():
            s = torch.tpu.Stream()
            with torch.tpu.stream(s):
                for _ in range(4):
                    x.exp()
            s.synchronize()
        t = threading.Thread(target=work)
        t.start()
        t.join()
        x.exp()
    assert prof.ops["exp"][0] == 5

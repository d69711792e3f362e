"""tpu_dist across processes: every collective and dtype against values computed on CPU, in
each eager mode; errors on every rank (mismatched sizes and dtypes, a cpu tensor, a rank that
dies) instead of hangs; no shared memory segment left behind."""
import glob

import pytest

from tests.dist import launch



def segments():
    return set(glob.glob("/dev/shm/tpu_dist.*"))


def run_ok(scenario, mode, world, tmp_path, timeout=240, env=None, rank_env=None):
    before = segments()
    rcs, outs, results = launch.run("tests.dist.worker", [scenario, mode, str(tmp_path)], world,
                                    str(tmp_path), timeout=timeout, env=env, rank_env=rank_env)
    for r in range(world):
        assert rcs[r] == 0 and results[r] and results[r]["ok"], f"rank {r}:\n{outs[r][-3000:]}"
    assert segments() - before == set()
    return results


def direct_ran(results):
    """Whether the collectives copied straight between the ranks' buffers (every rank)."""
    return [r["stats"]["direct_collectives"] > 0 for r in results if r]


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_collectives_two_ranks(mode, tmp_path):
    assert all(direct_ran(run_ok("collectives", mode, 2, tmp_path)))


def test_collectives_staged_through_shared_memory(tmp_path):
    """TORCH_TPU_DIST_DIRECT=0 (as where the kernel forbids reading another process's memory):
    every collective goes through the shared segment's slots instead."""
    results = run_ok("collectives", "strict", 2, tmp_path, env={"TORCH_TPU_DIST_DIRECT": "0"})
    assert not any(direct_ran(results))
    assert all(r["stats"]["shm_collectives"] > 0 for r in results)


def test_collectives_on_the_pjrt_target(tmp_path):
    """The same on the pjrt target (XLA's CPU plugin): device memory the host cannot address,
    so each collective stages through host copies."""
    run_ok("collectives", "strict", 2, tmp_path, env={"TORCH_TPU_TARGET": "pjrt"})


def test_collectives_three_ranks(tmp_path):
    """3 ranks, with direct copies for every size (by default from 1 MiB)."""
    results = run_ok("collectives", "strict", 3, tmp_path,
                     env={"TORCH_TPU_DIST_DIRECT_MIN_BYTES": "0"})
    assert all(direct_ran(results))


@pytest.mark.parametrize("layout", ["host_by_host", "interleaved"])
def test_hierarchical_gathers_for_any_rank_layout(layout, tmp_path):
    """Two "hosts" told apart by TORCH_TPU_DIST_HOST_ID (loopback between them): ranks 0, 1 |
    2, 3 as torchrun numbers them, or 0, 2 | 1, 3. Either way all_gather_into_tensor and
    reduce_scatter_tensor (and coalesced) give the right pieces at every rank's place and go
    through the hosts' leaders, never the Gloo group of all ranks."""
    host = (lambda r: r // 2) if layout == "host_by_host" else (lambda r: r % 2)
    results = run_ok("hier_gathers", "strict", 4, tmp_path, timeout=300,
                     env={"GLOO_SOCKET_IFNAME": "lo", "TPU_DIST_TEST_TIMEOUT": "240"},
                     rank_env=lambda r: {"TORCH_TPU_DIST_HOST_ID": f"host{host(r)}"})
    for res in results:
        st = res["stats_gathers"]
        assert st["hierarchical_all_gathers"] >= 13 and st["hierarchical_reduce_scatters"] >= 24, st
        assert st["gloo_calls"] == 0 and st["shm_collectives"] == 0, st


def test_errors_on_every_rank_and_a_dead_rank(tmp_path):
    before = segments()
    rcs, outs, results = launch.run("tests.dist.worker", ["errors", "strict", str(tmp_path)], 3,
                                    str(tmp_path), timeout=120)
    for r in range(2):
        assert rcs[r] == 0 and results[r] and results[r]["ok"], f"rank {r}:\n{outs[r][-3000:]}"
        assert results[r]["death_noticed_s"] < 20
    assert segments() - before == set()


def test_ddp_matches_one_process(tmp_path):
    """DDP (several buckets, find_unused_parameters, static_graph, no_sync, torch.compile) on 2
    ranks against one process training on the global batch: losses within 1e-5 relative,
    parameters within 1e-5 after the last step."""
    results = run_ok("ddp", "strict", 2, tmp_path)
    assert results[0]["stats"]["shm_collectives"] > 0 and results[0]["stats"]["gloo_calls"] == 0
    for name, fig in results[0].items():
        if name not in ("ok", "stats"):
            assert fig["max_param_diff"] <= 1e-5, (name, fig)


def test_fsdp2_matches_one_process(tmp_path):
    """FSDP2 fully_shard of the example GPT (per block and the root), reshard_after_forward
    both ways, against one process on the global batch; bf16 parameters with float32
    reduction within bf16's rounding."""
    results = run_ok("fsdp", "strict", 2, tmp_path)
    figs = results[0]
    assert figs["reshard"]["max_param_diff"] <= 1e-5
    assert figs["no_reshard"]["max_param_diff"] <= 1e-5
    assert figs["bf16_params_fp32_reduce"]["max_param_diff"] <= 5e-2


def test_tensor_parallel_matches_one_process(tmp_path):
    """parallelize_module (ColwiseParallel, RowwiseParallel) on the GPT on a mesh of 2, and
    SequenceParallel on a LayerNorm/MLP stack, against one process."""
    results = run_ok("tp", "strict", 2, tmp_path)
    assert results[0]["tp"]["max_param_diff"] <= 1e-5


def test_dp_x_tp_mesh_matches_one_process(tmp_path):
    """A 2 x 2 DeviceMesh (FSDP2 over dp, tensor parallel over tp): sub-meshes are subgroups,
    each with its own tpu_dist backend."""
    results = run_ok("tp", "strict", 4, tmp_path)
    assert results[0]["dp_x_tp"]["max_param_diff"] <= 1e-5


@pytest.mark.parametrize("saved_by,loaded_by", [(2, 1), (1, 2)])
def test_dcp_across_world_sizes(saved_by, loaded_by, tmp_path):
    """torch.distributed.checkpoint of the FSDP2-sharded GPT and its optimizer (a plain model
    in one process), loaded back on another world size: every value equal."""
    ckpt = tmp_path / "ckpt"
    for action, world in (("save", saved_by), ("load", loaded_by)):
        out = tmp_path / action
        out.mkdir()
        rcs, outs, results = launch.run(
            "tests.dist.worker", ["dcp", "strict", str(out)], world, str(out), timeout=240,
            env={"TPU_DIST_DCP": action, "TPU_DIST_CKPT": str(ckpt)})
        for r in range(world):
            assert rcs[r] == 0 and results[r]["ok"], f"{action} rank {r}:\n{outs[r][-3000:]}"
    assert results[0]["max_diff"] == 0.0 and results[0]["loaded"] > 10


def test_init_styles_pick_tpu_dist(tmp_path):
    """init_process_group("tpu_dist"), ("tpu"), (device_id=tpu:0) and
    ("cpu:gloo,tpu:tpu_dist") all run tpu tensors through tpu_dist."""
    results = run_ok("init_styles", "strict", 2, tmp_path)
    r = results[0]
    assert r["tpu_dist"] == "tpu_dist" and r["device_id"] == "tpu_dist", r
    assert "tpu_dist" in r["cpu:gloo,tpu:tpu_dist"], r


def test_visible_devices_choose_the_chips_of_a_process():
    """TORCH_TPU_VISIBLE_DEVICES: the chips this process uses, numbered from tpu:0 (on the host
    target and on the pjrt target, whose XLA CPU plugin has 4 devices); a bad value raises at the
    first use, naming it."""
    from tests.conftest import run_python

    code = ("import torch; n = torch.tpu.device_count(); "
            "x = torch.arange(4.0, device=f'tpu:{n - 1}'); print(n, x.sum().item())")
    r = run_python(code, env={"TORCH_TPU_HOST_DEVICES": "4", "TORCH_TPU_VISIBLE_DEVICES": "1,3"})
    assert r.returncode == 0 and r.stdout.split() == ["2", "6.0"], r.stderr[-2000:]
    r = run_python(code, env={"TORCH_TPU_TARGET": "pjrt", "TORCH_TPU_VISIBLE_DEVICES": "2"})
    assert r.returncode == 0 and r.stdout.split() == ["1", "6.0"], r.stderr[-2000:]
    bad = ("import torch\ntry:\n    torch.ones(1, device='tpu')\nexcept RuntimeError as e:\n"
           "    print('raised', e)")
    r = run_python(bad, env={"TORCH_TPU_HOST_DEVICES": "2", "TORCH_TPU_VISIBLE_DEVICES": "0,5"})
    assert "raised" in r.stdout and "TORCH_TPU_VISIBLE_DEVICES=0,5" in r.stdout, (r.stdout,
                                                                                   r.stderr[-2000:])

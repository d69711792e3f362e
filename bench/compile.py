"""torch.compile(backend="tpu") on the example GPT's training step, one run, ratios.

    .venv/bin/python bench/compile.py [--steps N] [--no-inductor] [--n-layer 6] [--n-embd 384]

Each configuration runs in a fresh process: Strict eager tpu; compiled tpu at medium and
at highest precision; torch.compile with Inductor on CPU float32 tensors (the peer);
compiled tpu again with a warm tier-3 cache (first-step time cold vs warm).
Goals (issue 6): compiled tokens/s >= 3.0x Strict eager and >= 1.0x Inductor on CPU.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time, torch, torch_tpu
sys.path.insert(0, ROOT + '/examples')
import train_gpt
kind, steps, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
device = 'cpu' if kind == 'inductor' else 'tpu'
args = train_gpt.parser().parse_args(['--device', device, '--steps', str(steps)] + extra)
if kind == 'tpu_highest':
    torch.set_float32_matmul_precision('highest')
data, chars = train_gpt.load_text(args.text)
model = train_gpt.make_model(len(chars), args, args.seed).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
step_model = model
if kind in ('tpu_medium', 'tpu_highest'):
    step_model = torch.compile(model, backend='tpu')
elif kind == 'inductor':
    step_model = torch.compile(model)
batches = train_gpt.batches(data, args.block_size, args.batch_size, args.seed)
times, losses = [], []
for step in range(steps):
    x, y = next(batches)
    t0 = time.perf_counter()
    x, y = x.to(device), y.to(device)
    _, loss = step_model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
    times.append(time.perf_counter() - t0)
print(json.dumps({'times': times, 'losses': losses, 'tokens': args.batch_size * args.block_size,
                  'cache': torch.tpu.compilation_cache_stats()}))
""".replace("ROOT", repr(ROOT))


def run(kind, steps, extra, env):
    e = dict(os.environ)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", CHILD, kind, str(steps)] + extra, env=e,
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"{kind} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--n-layer", default="6")
    p.add_argument("--n-embd", default="384")
    p.add_argument("--n-head", default="6")
    p.add_argument("--batch-size", default="8")
    p.add_argument("--block-size", default="64")
    a = p.parse_args()
    extra = ["--n-layer", a.n_layer, "--n-embd", a.n_embd, "--n-head", a.n_head,
             "--batch-size", a.batch_size, "--block-size", a.block_size]
    tmp = tempfile.mkdtemp(prefix="tpu_compile_bench_")
    env = {"TORCH_TPU_ASYNC_COMPILE": "0", "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
           "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": tmp}
    print(f"load average: {os.getloadavg()[0]:.2f}  config: {' '.join(extra)}  steps {a.steps}")
    res = {"strict": run("strict", a.steps, extra, env)}
    res["tpu_medium"] = run("tpu_medium", a.steps, extra, env)        # cold cache
    res["tpu_medium_warm"] = run("tpu_medium", a.steps, extra, env)   # warm tier 3
    res["tpu_highest"] = run("tpu_highest", a.steps, extra, env)
    if not a.no_inductor:
        res["inductor"] = run("inductor", a.steps, extra, {})

    def rate(r):
        t = r["times"][a.warmup:]
        return r["tokens"] * len(t) / sum(t)

    base = rate(res["strict"])
    ind = rate(res["inductor"]) if "inductor" in res else None
    print(f"{'configuration':34s} {'tokens/s':>10s} {'vs strict':>10s} {'vs inductor':>12s}")
    for k, label in [("strict", "tpu eager strict"), ("tpu_medium_warm", "tpu compiled, medium"),
                     ("tpu_highest", "tpu compiled, highest"), ("inductor", "cpu inductor float32")]:
        if k not in res:
            continue
        r = rate(res[k])
        vs_ind = f"{r / ind:12.2f}" if ind else f"{'n/a':>12s}"
        print(f"{label:34s} {r:10.0f} {r / base:10.2f} {vs_ind}")
    cold, warm = res["tpu_medium"], res["tpu_medium_warm"]
    print(f"first step: cold cache {cold['times'][0]:.2f} s ({cold['cache']['compiles']} compiles, "
          f"{cold['cache']['compile_seconds']:.2f} s compiling), warm tier-3 cache "
          f"{warm['times'][0]:.2f} s ({warm['cache']['compiles']} compiles, "
          f"{warm['cache']['tier3_hits']} tier-3 hits)")
    print("goals: compiled >= 3.0x strict and >= 1.0x inductor")


if __name__ == "__main__":
    main()

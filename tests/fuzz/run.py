"""Differential fuzzer driver.

    python -m tests.fuzz.run --seed 0 --count 2000 [--jobs 2] [--modes strict,debug,defer_and_fuse]
                             [--compile-every 10] [--time-limit S] [--no-shrink]

Program i has seed (--seed + i); each runs in every eager mode given and, for one program in
--compile-every, under torch.compile(backend="tpu"). Programs run in subprocess workers
(tests/fuzz/worker.py) with a timeout; a worker that dies is a crash, one that does not answer
in time a hang (it is killed and restarted). A failing program is shrunk (lines dropped while
the same kind of failure remains) and printed as a self-contained Python reproducer. At the end
the run prints programs run per mode, crashes, hangs and mismatches by kind; mismatches
matching the table in tests/fuzz/known.py are counted as explained. Exit status 1 when
anything unexplained was found.
"""
import argparse
import collections
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time

from tests.fuzz import known
from tests.fuzz.gen import PRELUDE, generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("strict", "debug", "defer_and_fuse")
TIMEOUT = {"compile": 180, "strict": 60, "debug": 60, "defer_and_fuse": 90}


class Worker:
    def __init__(self):
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.p = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker"], cwd=ROOT, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.buf = b""
        self.task = None
        self.deadline = None
        self.ready = False
        self.history = []  # the seeds and modes this process ran, for a hang or crash report

    def send(self, task, timeout):
        self.task = task
        self.deadline = time.monotonic() + timeout
        self.history.append(f"{task.get('seed')}:{task['req']['mode']}")
        self.p.stdin.write((json.dumps(dict(task["req"], timeout=timeout)) + "\n").encode())
        self.p.stdin.flush()

    def stderr_tail(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-1500:]

    def kill(self):
        try:
            self.p.kill()
        except OSError:
            pass
        self.p.wait()


def _request(lines, mode):
    tol = {}
    for ln in lines:
        for k, r in ln.get("tol", {}).items():
            tol[k] = max(tol.get(k, 0), r)
    return {"lines": [ln["src"] for ln in lines], "ops": [ln["op"] for ln in lines],
            "dd": [ln["dd"] for ln in lines], "mode": mode, "tol": tol}


class Pool:
    """runs requests on `jobs` workers; yields (task, result) where result is the worker's
    answer or {"mismatches": [crash/hang]}"""

    def __init__(self, jobs):
        self.workers = [Worker() for _ in range(jobs)]
        self.sel = selectors.DefaultSelector()
        for w in self.workers:
            self.sel.register(w.p.stdout, selectors.EVENT_READ, w)

    def _replace(self, w):
        self.sel.unregister(w.p.stdout)
        w.kill()
        n = Worker()
        self.workers[self.workers.index(w)] = n
        self.sel.register(n.p.stdout, selectors.EVENT_READ, n)
        return n

    def run(self, tasks):
        tasks = iter(tasks)
        busy = 0
        exhausted = False
        while True:
            for w in self.workers:
                if w.task is None and w.ready and not exhausted:
                    t = next(tasks, None)
                    if t is None:
                        exhausted = True
                        break
                    w.send(t, TIMEOUT[t["req"]["mode"]])
                    busy += 1
            if busy == 0 and exhausted:
                return
            now = time.monotonic()
            wait = max(0.0, min([w.deadline for w in self.workers if w.task] or [now + 1]) - now)
            for key, _ in self.sel.select(timeout=wait):
                w = key.data
                chunk = os.read(w.p.stdout.fileno(), 1 << 20)
                if not chunk:  # the worker died: a crash
                    t = w.task
                    if t is None:
                        raise RuntimeError("fuzz worker failed to start: " + w.stderr_tail())
                    rc = w.p.wait()
                    tail = w.stderr_tail()
                    self._replace(w)
                    busy -= 1
                    yield t, {"mismatches": [{"kind": "crash", "line": None, "op": "?",
                                              "detail": f"worker exit status {rc}; ran before: "
                                                        f"{w.history[-6:-1]}; stderr: {tail[-600:]}"}]}
                    continue
                w.buf += chunk
                if b"\n" in w.buf:
                    line, w.buf = w.buf.split(b"\n", 1)
                    if not w.ready:
                        w.ready = True
                        continue
                    t, w.task = w.task, None
                    busy -= 1
                    yield t, json.loads(line)
            now = time.monotonic()
            for w in list(self.workers):
                if w.task is not None and now > w.deadline:
                    t = w.task
                    w.kill()
                    tail = w.stderr_tail()
                    hist = w.history[-6:-1]
                    self._replace(w)
                    busy -= 1
                    yield t, {"mismatches": [{"kind": "hang", "line": None, "op": "?",
                                              "detail": f"no answer in {TIMEOUT[t['req']['mode']]} s; ran "
                                                        f"before: {hist}; stacks: {tail[-900:]}"}]}

    def close(self):
        for w in self.workers:
            try:
                w.p.stdin.close()
            except OSError:
                pass
            w.kill()


def run_one(pool, lines, mode):
    for _, res in pool.run([{"req": _request(lines, mode)}]):
        return res["mismatches"]


def shrink(pool, lines, mode, kind, op, max_tries=80):
    """drops lines while a mismatch of the same kind at the same op remains"""
    cur = list(lines)
    tries = 0
    changed = True
    while changed and tries < max_tries:
        changed = False
        i = len(cur) - 1
        while i >= 0 and tries < max_tries:
            cand = cur[:i] + cur[i + 1:]
            tries += 1
            m = run_one(pool, cand, mode) if cand else []
            if any(x["kind"] == kind and x["op"] == op and not known.explained(x, mode) for x in m):
                cur = cand
                changed = True
            i -= 1
    return cur


def reproducer(lines, mode, mism, seed):
    """a self-contained Python snippet running the program on cpu and tpu"""
    head = f"# fuzz seed {seed}, mode {mode}: {mism['kind']} ({mism['op']}): {mism['detail'][:300]}\n"
    s = head + PRELUDE + '\ntorch.set_float32_matmul_precision("highest")\n\n\n'
    if mode == "compile":
        from tests.fuzz.worker import compile_source
        names = sorted({n.strip() for ln in lines for n in ln["src"].split("=")[0].split(",")
                        if "=" in ln["src"].split("(")[0] and n.strip().isidentifier()},
                       key=lambda n: int(n[1:]))
        ins, src = compile_source([ln["src"] for ln in lines], [ln["op"] for ln in lines], names)
        s += src + "\n\n"
        s += "for dev in ('cpu', 'tpu'):\n"
        for ln in lines:
            if ln["op"] == "input":
                s += f"    {ln['src']}\n"
        call = f"prog({', '.join(ins)})"
        s += (f"    out = {call} if dev == 'cpu' else torch.compile(prog, backend='tpu')({', '.join(ins)})\n"
              "    print(dev, [(o.dtype, tuple(o.shape), o.cpu().flatten()[:6].tolist()) for o in out])\n")
        return s
    s += "def prog(dev):\n"
    for i, ln in enumerate(lines):
        s += f"    try:  # line {i}\n        {ln['src']}\n" \
             f"    except Exception as e:\n        print(dev, 'line {i}:', type(e).__name__, e)\n"
    s += ("    if dev != 'cpu':\n        torch.tpu.synchronize()\n"
          "    return {k: v.cpu() for k, v in locals().items() if isinstance(v, torch.Tensor)}\n\n\n"
          "cpu = prog('cpu')\n"
          f"with torch_tpu.eager_mode({mode!r}):\n    tpu = prog('tpu')\n"
          "for k, e in cpu.items():\n"
          "    a = tpu.get(k)\n"
          "    same = a is not None and a.dtype == e.dtype and a.shape == e.shape and "
          "torch.allclose(a.double(), e.double(), rtol=1e-3, atol=1e-3, equal_nan=True)\n"
          "    print(k, 'ok' if same else f'DIFFERS: tpu {None if a is None else (a.dtype, tuple(a.shape))} "
          "cpu {(e.dtype, tuple(e.shape))}\\n  tpu {a}\\n  cpu {e}')\n")
    return s


def fuzz(seed, count, jobs=2, modes=MODES, compile_every=10, time_limit=None, do_shrink=True,
         max_reports=20, out=sys.stdout, n_ops=None, progress=False):
    """runs the programs; returns the summary dict"""
    import torch
    # The generator runs every line on CPU. With the default intra-op pool, those ops leave
    # threads spinning that starve the workers on a 2-core machine (measured: 89 ms per run
    # instead of 4 to 14).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fuzz(seed, count, jobs, modes, compile_every, time_limit, do_shrink,
                     max_reports, out, n_ops, progress)
    finally:
        torch.set_num_threads(threads)


def _fuzz(seed, count, jobs, modes, compile_every, time_limit, do_shrink, max_reports, out,
          n_ops, progress):
    pool = Pool(jobs)
    t0 = time.monotonic()
    runs = collections.Counter()
    kinds = collections.Counter()
    explained = collections.Counter()
    failures = []  # (seed, mode, first unexplained mismatch, lines)

    def tasks():
        for i in range(count):
            if time_limit is not None and time.monotonic() - t0 > time_limit:
                return
            s = seed + i
            lines = generate(s, n_ops)
            ms = list(modes) + (["compile"] if compile_every and i % compile_every == 0 else [])
            for m in ms:
                yield {"seed": s, "lines": lines, "req": _request(lines, m)}

    done = collections.Counter()
    last = [t0]
    try:
        for t, res in pool.run(tasks()):
            mode = t["req"]["mode"]
            runs[mode] += 1
            first = None
            for m in res["mismatches"]:
                if known.explained(m, mode):
                    explained[known.explained(m, mode)] += 1
                    continue
                kinds[m["kind"]] += 1
                first = first or m
            if first is not None:
                failures.append((t["seed"], mode, first, t["lines"]))
                if progress:
                    print(f"FAIL seed {t['seed']} mode {mode}: {first['kind']} at line {first['line']} "
                          f"({first['op']}): {first['detail'][:200]}", file=sys.stderr, flush=True)
            done[t["seed"]] += 1
            if progress and time.monotonic() - last[0] > 60:
                last[0] = time.monotonic()
                print(f"[{last[0] - t0:.0f} s] programs {len(done)} runs {dict(runs)} "
                      f"unexplained {dict(kinds)} explained {sum(explained.values())}",
                      file=sys.stderr, flush=True)
        elapsed = time.monotonic() - t0
        summary = {"programs": len({s for s in done}), "runs_per_mode": dict(runs),
                   "runs": sum(runs.values()), "seconds": round(elapsed, 1),
                   "runs_per_second": round(sum(runs.values()) / max(elapsed, 1e-9), 2),
                   "crashes": kinds.get("crash", 0), "hangs": kinds.get("hang", 0),
                   "mismatches_by_kind": {k: v for k, v in kinds.items() if k not in ("crash", "hang")},
                   "explained": dict(explained), "failures": len(failures)}
        print(json.dumps(summary, indent=1), file=out)
        # one reproducer per (kind, op, mode): the rest are most likely the same root cause
        seen = set()
        for s, mode, m, lines in failures:
            key = (m["kind"], m["op"], mode)
            print(f"FAIL seed {s} mode {mode}: {m['kind']} at line {m['line']} ({m['op']}): "
                  f"{m['detail'][:300]}", file=out)
            if key in seen or len(seen) >= max_reports:
                continue
            seen.add(key)
            small = shrink(pool, lines, mode, m["kind"], m["op"]) if do_shrink else lines
            mm = [x for x in run_one(pool, small, mode) if x["kind"] == m["kind"]] or [m]
            print("----- reproducer " + "-" * 50, file=out)
            print(reproducer(small, mode, mm[0], s), file=out)
            print("-" * 67, file=out)
        out.flush()
        return summary
    finally:
        pool.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--compile-every", type=int, default=10, help="0: never")
    ap.add_argument("--time-limit", type=float, default=None, help="stop generating after S seconds")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--max-reports", type=int, default=20)
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--print-program", action="store_true", help="print program --seed and exit")
    a = ap.parse_args(argv)
    if a.print_program:
        for ln in generate(a.seed):
            print(ln["src"], f"  # {ln['op']}{' dd' if ln['dd'] else ''} cpu: {ln['cpu_err']}")
        return 0
    s = fuzz(a.seed, a.count, a.jobs, [m for m in a.modes.split(",") if m], a.compile_every,
             a.time_limit, not a.no_shrink, a.max_reports, progress=not a.quiet)
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""OpInfo coverage sweep: every OpInfo of PyTorch's op_db x dtype (float32,
bfloat16, float16, int64, int32, bool), forward and backward, on tpu against
CPU (tests/opinfo/opinfo_harness.py). Regenerates docs/op_coverage.md and
docs/op_coverage.json and prints the totals.

    nice .venv/bin/python tools/op_coverage.py [--samples 4] [--jobs 1] [--timeout 300]
    .venv/bin/python tools/op_coverage.py --ops add softmax   # print only, no docs
    nice .venv/bin/python tools/op_coverage.py --target pjrt --dtypes float32 --forward-only

--target runs the workers with TORCH_TPU_TARGET set (the pjrt target on the XLA CPU plugin
writes docs/op_coverage_pjrt.{md,json}) and compares with the host target's docs/op_coverage.json:
the share of the OpInfos passing on host that pass there too. --dtypes and --forward-only
narrow the sweep.

OpInfos run in worker subprocesses, so an op that crashes the interpreter or
hangs past --timeout is recorded as failed and the sweep goes on.
"""
import argparse
import collections
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "opinfo"))
import opinfo_harness as h  # noqa: E402
import torch  # noqa: E402
import torch_tpu  # noqa: E402

DOCS = os.path.join(ROOT, "docs")
DIRECTIONS = ("forward", "backward")
SHORT = {"forward": "fwd", "backward": "bwd"}
DTYPE_NAMES = [str(d).removeprefix("torch.") for d in h.DTYPES + h.OPTIONAL_DTYPES]
CHUNK = 50  # OpInfos per worker process
START_RETRIES = 5  # workers that may fail before their first op
COMMAND = "nice .venv/bin/python tools/op_coverage.py"


# ------------------------------------------------------------------ worker side
def wanted(op, args):
    """[(dtype, directions)] of the OpInfo that the sweep runs."""
    out = []
    for d in h.dtypes_for(op, optional=bool(args.dtypes)):
        name = str(d).removeprefix("torch.")
        if args.dtypes and name not in args.dtypes:
            continue
        dirs = DIRECTIONS[:1 + (h.has_backward(op, d) and not args.forward_only)]
        out.append((d, dirs))
    return out


def run_worker(names, args):
    """Runs the named OpInfos; writes one JSON line per start and per result."""
    samples = args.samples
    warnings.simplefilter("ignore")
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # an op that prints must not corrupt the protocol stream
    for name in names:
        print(json.dumps({"start": name}), file=proto, flush=True)
        op = h.OPS[name]
        result = {str(d).removeprefix("torch."): {
            direction: h.run_direction(op, d, direction == "backward", samples).to_dict()
            for direction in dirs} for d, dirs in wanted(op, args)}
        result = {"dtypes": result, **({"skip": h.SKIP[name]} if name in h.SKIP else {})}
        print(json.dumps({"done": name, "result": result}), file=proto, flush=True)


# ------------------------------------------------------------------ parent side
class Worker:
    def __init__(self, names, args):
        self.names = collections.deque(names)
        self.current, self.started, self.started_any = None, time.monotonic(), False
        self.log = tempfile.TemporaryFile(mode="w+")
        env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_CPU_FALLBACK"}
        env["TORCH_TPU_TARGET"] = args.target
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--samples", str(args.samples),
               *(["--dtypes", *args.dtypes] if args.dtypes else []),
               *(["--forward-only"] if args.forward_only else []), "--ops", *self.names]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, cwd=ROOT)

    def last_stderr_line(self):
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read().splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""


def crash_result(name, failure, args):
    """An OpInfo whose worker crashed or hung: every direction it has fails."""
    op, fail = h.OPS[name], {"status": "fail", "detail": f"error: {failure}"}
    return {"error": failure, "dtypes": {
        str(d).removeprefix("torch."): {direction: fail for direction in dirs}
        for d, dirs in wanted(op, args)}}


def sweep(names, args):
    """{OpInfo name: result}; restarts a worker after a crash or a timeout."""
    todo = collections.deque(names[i:i + CHUNK] for i in range(0, len(names), CHUNK))
    results, workers, sel = {}, [], selectors.DefaultSelector()
    start_failures = 0
    t0 = time.monotonic()

    def start(chunk):
        w = Worker(chunk, args)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        workers.append(w)

    def finish(w, failure=None):
        nonlocal start_failures
        sel.unregister(w.proc.stdout)
        workers.remove(w)
        if failure and not w.started_any:  # e.g. torch_tpu being rebuilt: wait and retry
            start_failures += 1
            if start_failures > START_RETRIES:
                sys.exit(f"a worker failed before running an op: {failure}")
            print(f"  worker failed to start ({failure}); retrying", flush=True)
            time.sleep(20)
        elif failure and w.current:
            results[w.current] = crash_result(w.current, failure, args)
            print(f"  {w.current}: {failure}", flush=True)
            w.names.remove(w.current)
        if w.names:
            todo.appendleft(list(w.names))

    while todo or workers:
        while todo and len(workers) < args.jobs:
            start(todo.popleft())
        for key, _ in sel.select(timeout=5):
            w = key.data
            line = w.proc.stdout.readline()
            if not line:  # the worker exited
                rc = w.proc.wait()
                finish(w, rc and f"crashed (exit {rc}): {w.last_stderr_line()}")
                continue
            msg = json.loads(line)
            if "start" in msg:
                w.current, w.started, w.started_any = msg["start"], time.monotonic(), True
            else:
                results[msg["done"]] = msg["result"]
                w.names.remove(msg["done"])
                w.current = None
                print(f"[{len(results)}/{len(names)} {time.monotonic() - t0:6.0f}s] {msg['done']}",
                      flush=True)
        for w in list(workers):
            if w.current and time.monotonic() - w.started > args.timeout:
                w.proc.kill()
                w.proc.wait()
                finish(w, f"timeout: more than {args.timeout} s")
    return {n: results[n] for n in names}


# ------------------------------------------------------------------ summaries
def statuses(result):
    """((dtype, direction), Result dict) of an OpInfo, in DTYPES and DIRECTIONS order."""
    for dtype in DTYPE_NAMES:
        for direction in DIRECTIONS:
            r = result["dtypes"].get(dtype, {}).get(direction)
            if r:
                yield (dtype, direction), r


def totals(results):
    """{(dtype, direction): Counter of statuses} over the OpInfos."""
    t = collections.defaultdict(collections.Counter)
    for res in results.values():
        for key, r in statuses(res):
            t[key][r["status"]] += 1
    return t


def pct(counter):
    n = counter["pass"] + counter["fail"] + counter["unsupported"]
    return f"{counter['pass']}/{n} ({100 * counter['pass'] / n:.1f}%)" if n else "n/a"


def headline(results, nsupported):
    t = totals(results)
    crashed = sum("error" in r for r in results.values())
    return [
        f"OpInfos: {len(results)} ({sum('skip' in r for r in results.values())} skipped as random "
        f"or uninitialized, {crashed} crashed or timed out)",
        f"Passing forward float32: {pct(t['float32', 'forward'])}",
        f"Passing backward float32: {pct(t['float32', 'backward'])}",
        f"Passing forward bfloat16: {pct(t['bfloat16', 'forward'])}",
        f"Passing backward bfloat16: {pct(t['bfloat16', 'backward'])}",
        f"Natively implemented ATen overloads (len(torch_tpu.supported_ops())): {nsupported}",
    ]


def against_host(results, target):
    """Per swept (dtype, direction): of the OpInfos passing on host (docs/op_coverage.json),
    how many pass on the target."""
    try:
        with open(os.path.join(DOCS, "op_coverage.json")) as f:
            host = json.load(f)["ops"]
    except (OSError, ValueError, KeyError) as e:
        return [f"(no host results to compare with: {e})"]
    lines = []
    keys = sorted({k for r in results.values() for k, _ in statuses(r)},
                  key=lambda k: (DTYPE_NAMES.index(k[0]), DIRECTIONS.index(k[1])))
    for dtype, direction in keys:
        on_host = [n for n in results
                   if host.get(n, {}).get("dtypes", {}).get(dtype, {}).get(direction, {}).get("status") == "pass"]
        both = [n for n in on_host
                if results[n]["dtypes"].get(dtype, {}).get(direction, {}).get("status") == "pass"]
        share = f"{100 * len(both) / len(on_host):.1f}%" if on_host else "n/a"
        lines.append(f"{target} {direction} {dtype}: {len(both)} of the {len(on_host)} OpInfos passing on "
                     f"host pass ({share})")
    return lines


def kind_of(detail):
    return detail.split(":", 1)[0]


def missing_ops(results):
    """{aten op: [OpInfos it blocks]}, most blocking first."""
    blocked = collections.defaultdict(set)
    for name, res in results.items():
        for _, r in statuses(res):
            for m in r.get("missing", ()):
                blocked[m].add(name)
    return sorted(((m, sorted(ns)) for m, ns in blocked.items()), key=lambda x: (-len(x[1]), x[0]))


def failures_by_kind(results):
    """{kind: {message or "": {OpInfo: ["dtype fwd", ...]}}} of the failed pairs;
    error messages are grouped with their numbers blanked."""
    out = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for name, res in results.items():
        for (dtype, direction), r in statuses(res):
            if r["status"] == "fail":
                kind = kind_of(r["detail"])
                key = re.sub(r"\d+", "#", r["detail"])[:160] if kind == "error" else ""
                out[kind][key][name].append(f"{dtype} {SHORT[direction]}")
    return out


def cell(r):
    """A table cell; "-" where the dtype or direction does not apply."""
    return {"pass": "pass", "fail": "FAIL", "unsupported": "unsup", "skip": "skip"}[r["status"]] if r else "-"


def first_problem(res):
    if "error" in res:
        return res["error"]
    for (dtype, direction), r in statuses(res):
        if r["status"] in ("fail", "unsupported"):
            return f"{dtype} {SHORT[direction]}: {r['detail']}"
    return ""


def render_markdown(results, nsupported, samples, args):
    dtypes = DTYPE_NAMES
    floats = [str(d).removeprefix("torch.") for d in h.FLOAT_DTYPES]
    esc = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    on = "" if args.target == "host" else f" (target {args.target})"
    cmd = COMMAND + ("" if args.target == "host" else f" --target {args.target}") + \
        (f" --dtypes {' '.join(args.dtypes)}" if args.dtypes else "") + \
        (" --forward-only" if args.forward_only else "")
    raw = "op_coverage" if args.target == "host" else f"op_coverage_{args.target}"
    lines = [
        f"# Op coverage: PyTorch OpInfos on tpu{on}",
        "",
        f"Generated by `{cmd}` (also writes `docs/{raw}.json`, the raw per-op results);",
        "do not edit by hand. Each OpInfo of PyTorch's `op_db` runs its first "
        f"{samples} sample inputs per dtype",
        "on CPU and on tpu (CPU fallback off) and compares values (`torch.testing.assert_close`",
        "defaults), dtypes, shapes, strides and aliasing; backward compares the inputs' gradients.",
        "`unsup`: an ATen op has no tpu kernel; a `precision` failure means the values differ from",
        "CPU's but are at least as close to a float64 run; `-`: the dtype is not supported on CPU",
        "(backward: or not differentiable). float32 matmuls run at precision \"highest\" (CPU's);",
        "the tpu default \"medium\" rounds their inputs to bfloat16 by design. The default tests run a subset",
        "(tests/opinfo/test_opinfo.py). Options: `--samples N`, `--jobs J`, `--timeout S`,",
        "`--ops NAME ...` (print those only).",
        "",
        "## Totals",
        "",
        *[f"- {line}" for line in headline(results, nsupported)],
        "",
        "| dtype | forward pass | backward pass |",
        "| --- | --- | --- |",
    ]
    t = totals(results)
    lines += [f"| {d} | {pct(t[d, 'forward'])} | {pct(t[d, 'backward']) if d in floats else '-'} |"
              for d in dtypes]
    lines += ["", "## Missing ATen ops, by OpInfos blocked", "", "| ATen op | OpInfos | which |",
              "| --- | --- | --- |"]
    lines += [f"| `{m}` | {len(ns)} | {esc(', '.join(ns))} |" for m, ns in missing_ops(results)]
    lines += ["", "## Failures by kind", "",
              "Failed (OpInfo, dtype, direction) triples. `values`: differ from CPU beyond the",
              "tolerance; `precision`: differ from CPU, but at least as close to float64 (candidates",
              "for the harness's TOLERANCES table); `dtype`, `shape`, `stride`, `alias`, `grad`,",
              "`structure`: metadata or autograd differ; `error`: an exception, grouped by message.",
              "Missing kernels are in the table above.", ""]
    for kind, groups in sorted(failures_by_kind(results).items()):
        count = sum(len(v) for ops in groups.values() for v in ops.values())
        lines += [f"### {kind} ({count} OpInfo/dtype/direction triples)", ""]
        for key, ops in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            where = "; ".join(f"{n} ({', '.join(v)})" for n, v in ops.items())
            lines.append(f"- `{esc(key)}`: {esc(where)}" if key else f"- {esc(where)}")
        lines.append("")
    noted = [(n, f"{d} {SHORT[k]}", r["detail"]) for n, res in results.items()
             for (d, k), r in statuses(res) if r["status"] == "pass" and r.get("detail")]
    lines += ["## Passing through the OpInfo's output convention", "",
              "These differ from CPU in raw values but agree once the sample's",
              "`output_process_fn_grad` is applied to both results, as PyTorch's own",
              "device-vs-CPU test (`test_compare_cpu`) compares them: eigen- and singular",
              "vectors whose sign or phase LAPACK libraries choose differently.", ""]
    lines += [f"- {esc(n)} ({w}): {esc(detail[:160])}" for n, w, detail in noted] or ["- none"]
    lines.append("")
    header = dtypes + [f"bwd {d}" for d in floats]
    lines += ["## Per OpInfo", "", "| OpInfo | " + " | ".join(header) + " | first problem |",
              "| --- " * (len(header) + 2) + "|"]
    for name, res in results.items():
        cells = [cell(res["dtypes"].get(d, {}).get("forward")) for d in dtypes]
        cells += [cell(res["dtypes"].get(d, {}).get("backward")) for d in floats]
        note = f"skip: {res['skip']}" if "skip" in res else first_problem(res)
        lines.append(f"| {esc(name)} | " + " | ".join(cells) + f" | {esc(note[:160])} |")
    return "\n".join(lines) + "\n"


def render_json(results, nsupported, samples):
    """The raw results, one OpInfo a line (readable diffs)."""
    ops = ",\n".join(f"  {json.dumps(n)}: {json.dumps(r, sort_keys=True)}" for n, r in results.items())
    head = json.dumps({"torch": torch.__version__, "samples": samples, "supported_ops": nsupported})
    return f"{head[:-1]},\n \"ops\": {{\n{ops}\n }}\n}}\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=h.DEFAULT_SAMPLES,
                    help="sample inputs per OpInfo and dtype")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per OpInfo")
    ap.add_argument("--ops", nargs="+", help="only these OpInfos; prints, writes no docs")
    ap.add_argument("--target", default="host", choices=("host", "pjrt"),
                    help="the target the workers run on (TORCH_TPU_TARGET)")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPE_NAMES, help="only these dtypes")
    ap.add_argument("--forward-only", action="store_true", help="no backward checks")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_worker(args.ops, args)

    names = args.ops or list(h.OPS)
    unknown = [n for n in names if n not in h.OPS]
    if unknown:
        raise SystemExit(f"unknown OpInfo names: {', '.join(unknown)}")
    results = sweep(names, args)
    nsupported = len(torch_tpu.supported_ops())
    for name in names if args.ops else ():
        print(name, json.dumps(results[name]))
    print("\n".join(headline(results, nsupported)))
    if args.target != "host":
        print("\n".join(against_host(results, args.target)))
    if args.ops:
        return
    stem = "op_coverage" if args.target == "host" else f"op_coverage_{args.target}"
    with open(os.path.join(DOCS, stem + ".json"), "w") as f:
        f.write(render_json(results, nsupported, args.samples))
    with open(os.path.join(DOCS, stem + ".md"), "w") as f:
        f.write(render_markdown(results, nsupported, args.samples, args))


if __name__ == "__main__":
    sys.exit(main())

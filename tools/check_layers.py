#!/usr/bin/env python3
"""Checks the runtime's layering: a lower layer never includes or calls an upper one.

Layers, lowest first (docs/design.md, "Layers"):

    base < device (= dist) < exec (= ir, lower) < cache < targets < bridge (torch_tpu/csrc)

Two checks:
  * includes (always): every `#include "..."` of runtime/<layer>/ and of the public
    headers in runtime/include/tpu/ must name a file of the same or a lower layer;
    torch_tpu/csrc must include nothing under runtime/targets.
  * symbols (when object files are given with --objects, e.g. build/runtime): every
    symbol an object of runtime/<layer>/ uses must be defined in the same or a lower
    layer. This catches hand-written declarations that the include check cannot see.

Known exceptions are listed below with the issue item that removes them. Exit status 0
when clean, 1 with one line per violation otherwise.

    python3 tools/check_layers.py [--root DIR] [--objects DIR]
"""
import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys

RANK = {"base": 0, "device": 1, "dist": 1, "exec": 2, "ir": 2, "lower": 2, "cache": 3, "targets": 4,
        "bridge": 5}

# The public headers (runtime/include/tpu/) by the layer that implements them. op.h
# describes calls (types every layer shares); the op table functions it also declares are
# exec's, and the symbol check keeps lower layers from calling them. target.h is the target
# interface (types) and the registered target (device/target.c); targets.h lists the
# targets of the build and chooses one (runtime/targets/targets.c). op_ids.def (the op
# families, included by op.h) and ew_ops.def (the element-wise inventory: names, arity,
# expressions, lowering recipes; read by the host kernels, the fusion planner and the
# lowering) are X-macro lists that include nothing. dist.h is the collective transport
# (runtime/dist/), beside the device layer: it uses base only, and only the bridge calls it.
# kernel_abi.h is the self-contained ABI of user C kernels (includes nothing of ours);
# kernels.h defines user kernels as ops (runtime/targets/kernels.c).
PUBLIC = {"status.h": "base", "tensor.h": "base", "float8.h": "base", "op.h": "base",
          "parallel.h": "base",
          "op_ids.def": "base", "ew_ops.def": "base",
          "device.h": "device", "target.h": "device", "trace.h": "exec", "cache.h": "cache",
          "targets.h": "targets", "dist.h": "dist", "kernel_abi.h": "base", "kernels.h": "targets",
          "observe.h": "device"}

# (file, included path) pairs allowed to point upward, each until its issue item is done.
# (Empty since issue 14 items 1 and 3: the list and its stale check stay for the next one.)
INCLUDE_EXCEPTIONS = set()

# (object, symbol pattern) pairs allowed to call upward, each until its issue item is done.
SYMBOL_EXCEPTIONS = []

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
SOURCE_EXT = (".c", ".h", ".def", ".cpp")


def layer_of(rel):
    """The layer of a repository-relative path, or None when it has none."""
    parts = rel.split("/")
    if parts[0] == "torch_tpu" and len(parts) > 1 and parts[1] == "csrc":
        return "bridge"
    if parts[0] != "runtime" or len(parts) < 3:
        return None
    if parts[1] == "include" and parts[2] == "tpu" and len(parts) == 4:
        return PUBLIC.get(parts[3], "?")
    if parts[1] == "tests":
        return None  # tests may use every layer
    return parts[1] if parts[1] in RANK else "?"


def resolve(root, src_rel, inc):
    """Repository-relative path of an include as the compiler finds it (-Iruntime/include
    -Iruntime, then the including file's folder), or None for system/unknown files."""
    here = os.path.dirname(src_rel)
    for base in (here, "runtime/include", "runtime"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand.replace(os.sep, "/")
    return None


def walk(root, top):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            if f.endswith(SOURCE_EXT):
                yield os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")


def check_includes(root):
    errors = []
    used = set()
    for top in ("runtime", "torch_tpu/csrc"):
        for rel in walk(root, top):
            src_layer = layer_of(rel)
            if src_layer is None:
                continue
            if src_layer == "?":
                errors.append(f"{rel}: not in a known layer (add it to tools/check_layers.py)")
                continue
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                text = f.read()
            for m in INCLUDE_RE.finditer(text):
                target = resolve(root, rel, m.group(1))
                if target is None:
                    continue
                tl = layer_of(target)
                if (rel, target) in INCLUDE_EXCEPTIONS:
                    used.add((rel, target))
                    continue
                if tl is None:
                    continue
                if tl == "?":
                    errors.append(f"{rel}: includes {target}, which is in no known layer")
                elif src_layer == "bridge" and target.startswith("runtime/targets/"):
                    errors.append(f"{rel}: the bridge includes a target's file {target}")
                elif RANK[tl] > RANK[src_layer]:
                    errors.append(f"{rel} ({src_layer}): includes {target} ({tl})")
    for rel, target in sorted(INCLUDE_EXCEPTIONS - used):
        if os.path.isfile(os.path.join(root, rel)):
            errors.append(f"{rel}: no longer includes {target}; drop its exception")
    return errors


def nm_symbols(nm, path):
    """(defined global symbols, undefined symbols) of an object file."""
    out = subprocess.run([nm, "-P", path], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRVWCG" and kind.isupper():
            defined.add(name)
    return defined, undefined


def check_symbols(root, objects):
    nm = shutil.which("nm")
    if nm is None:
        return ["nm not found: cannot check symbols"]
    objs = []  # (object path relative to the runtime tree, its layer)
    for dirpath, _, files in os.walk(objects):
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            rel = "runtime/" + os.path.relpath(os.path.join(dirpath, f), objects).replace(os.sep, "/")
            if not os.path.isfile(os.path.join(root, rel[:-2] + ".c")):
                continue  # stale object of a deleted source
            layer = layer_of(rel)
            if layer and layer != "?":
                objs.append((rel, os.path.join(dirpath, f), layer))
    owner = {}
    undefined = {}
    for rel, path, layer in objs:
        d, u = nm_symbols(nm, path)
        for s in d:
            owner.setdefault(s, layer)
        undefined[rel] = (layer, u)
    errors = []
    used = set()
    for rel, (layer, syms) in sorted(undefined.items()):
        for s in sorted(syms):
            tl = owner.get(s)
            if tl is None or RANK[tl] <= RANK[layer]:
                continue
            hit = [(o, p) for o, p in SYMBOL_EXCEPTIONS if rel == o and fnmatch.fnmatchcase(s, p)]
            if hit:
                used.update(hit)
                continue
            errors.append(f"{rel} ({layer}): uses {s}, defined in {tl}")
    for o, p in SYMBOL_EXCEPTIONS:
        if (o, p) not in used and o in undefined:
            errors.append(f"{o}: no longer uses {p} from an upper layer; drop its exception")
    return errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="repository root (default: this checkout)")
    ap.add_argument("--objects", help="object files of the runtime (e.g. build/runtime)")
    args = ap.parse_args(argv)
    errors = check_includes(args.root)
    if args.objects:
        errors += check_symbols(args.root, args.objects)
    for e in errors:
        print(e)
    if not errors:
        print("layers: ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The layering check (README "Architecture"): every source file sits in one layer, and no file
includes or calls into a layer above its own. Layers, bottom to top:

  0 basics      error, fs, log, mem, rng, config, optim, ops.h and the CPU backend (ops_cpu,
                ops_prof, blas_guard); cuda/ implements ops.h and is reached only through it:
                ops.c (ops_create, the factory that picks the backend) is the one file outside
                cuda/ that names it
  1 comm        bootstrap*, comm*, gloo_store, topology: the rank grid, the groups, the
                collectives
  2 tp/cp/ep    the three dimensions that split a layer, each owning its group
  3 model       model, moe, ckpt, data, hf_map, hf_config, hf_import, infer: the transformer's math, its tensors and files; it asks
                tp/cp/ep for every collective, so it neither includes nor calls layer 1
  4 pp/dp       pipeline and data parallelism: schedules, stages, ZeRO, the optimizer step
  5 train       the trainer, which builds the runtime and runs the steps, and plan, the memory
                plan of what it builds
  6 tools/cmd   cmd/*, planner, prep, tokenizer, export, generate, cuda/bench_gpu.c

A call is an identifier with a module's prefix followed by "(" (comments and strings removed,
member accesses such as q->tp_split and the file's own static functions ignored; cuda/ is
checked by its includes). Prints one PASS/FAIL line per rule and, on a
failure, each offending line as file:line. Usage: layering.py [ROOT] (default: the repository)."""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
LAYER_NAMES = ["basics", "comm", "tp/cp/ep", "model", "pp/dp", "train", "tools/cmd"]
# module (file stem, directory-qualified) -> layer
MODULES = {
    "core/error": 0, "core/fs": 0, "core/log": 0, "core/mem": 0, "core/rng": 0,
    "core/config": 0, "core/optim": 0, "core/ops": 0, "core/ops_cpu": 0, "core/ops_prof": 0,
    "core/blas_guard": 0, "core/spike": 0, "core/sha256": 0,
    "parallel/bootstrap": 1, "parallel/bootstrap_impl": 1, "parallel/bootstrap_pmix": 1,
    "parallel/bootstrap_server": 1, "parallel/bootstrap_common": 1, "parallel/bootstrap_store": 1, "parallel/comm": 1,
    "parallel/comm_impl": 1, "parallel/comm_shm": 1, "parallel/comm_shm_segment": 1,
    "parallel/comm_nccl": 1, "parallel/comm_gloo": 1, "parallel/gloo_store": 1,
    "parallel/comm_common": 1, "parallel/topology": 1,
    "parallel/tp": 2, "parallel/cp": 2, "parallel/ep": 2,
    "core/model": 3, "core/model_internal": 3, "core/acts": 3, "core/params": 3, "core/moe": 3, "core/ckpt": 3, "core/ckpt_manifest": 3, "core/data": 3, "core/data_blend": 3,
    "core/hf_map": 3, "core/hf_config": 3, "core/hf_import": 3, "core/infer": 3,
    "parallel/pp": 4, "parallel/dp_internal": 4, "parallel/dp_io": 4, "parallel/pp_schedule": 4, "parallel/pp_schedule_check": 4,
    "parallel/dp": 4,
    "core/train": 5, "core/plan": 5,
    "core/planner": 6, "core/prep": 6, "core/prep_input": 6, "core/tokenizer": 6, "core/tok_unicode": 6,
    "core/export": 6, "core/hf_tok": 6, "core/generate": 6, "cuda/bench_gpu": 6,
}
# function prefixes -> the module they belong to
PREFIXES = {
    "ust": "core/error", "fs": "core/fs", "log": "core/log", "mem": "core/mem", "rng": "core/rng",
    "cfg": "core/config", "optim": "core/optim", "ops_cpu": "core/ops_cpu",
    "ops_prof": "core/ops_prof", "boot": "parallel/bootstrap", "comm": "parallel/comm",
    "topo": "parallel/topology", "tp": "parallel/tp", "cp": "parallel/cp", "ep": "parallel/ep",
    "model": "core/model", "params": "core/params", "acts": "core/acts", "moe": "core/moe", "ckpt": "core/ckpt",
    "st": "core/ckpt", "data": "core/data", "pp": "parallel/pp", "pps": "parallel/pp_schedule",
    "dp": "parallel/dp", "train": "core/train", "plan": "core/plan", "planner": "core/planner",
    "prep": "core/prep", "tok": "core/tokenizer", "export": "core/export", "ops_cuda": "cuda",
    "hf": "core/hf_map", "spike": "core/spike", "infer": "core/infer", "gen": "core/generate",
    "sha256": "core/sha256", "hftok": "core/hf_tok", "ckman": "core/ckpt_manifest",
}
CALL = re.compile(r"(?<![\w.>])(" + "|".join(sorted(PREFIXES, key=len, reverse=True)) +
                  r")_\w+\s*\(")
STATIC_DEF = re.compile(r"^\s*(?:static|__device__|__global__|template\s*<[^>]*>)[^;{(]*?\b(\w+)\s*\(",
                        re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def strip(text):
    """Comments and string/char literals blanked (newlines kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(path):
    d, f = os.path.split(os.path.relpath(path, ROOT))
    stem = f.split(".")[0]
    if d == "cuda" and stem != "bench_gpu":
        return "cuda"
    return f"{d}/{stem}"


def layer_of(mod):
    if mod.startswith("cmd/"):
        return 6
    return 0 if mod == "cuda" else MODULES.get(mod)


def header_module(inc, src_dir):
    """The module an include names: "parallel/tp.h", "tp.h" (found in core/, parallel/, cuda/)."""
    if "/" in inc:
        return module_of(os.path.join(ROOT, inc))
    for d in (src_dir, "core", "parallel", "cuda"):
        if os.path.exists(os.path.join(ROOT, d, inc)):
            return module_of(os.path.join(ROOT, d, inc))
    return None  # a system or test header


def main():
    files = []
    for d in ("core", "parallel", "cmd", "cuda"):
        for f in sorted(os.listdir(os.path.join(ROOT, d))):
            if f.endswith((".c", ".h", ".cu")):
                files.append(os.path.join(ROOT, d, f))
    unplaced, upward, into_cuda, model_comm = [], [], [], []
    for path in files:
        rel = os.path.relpath(path, ROOT)
        mod = module_of(path)
        me = layer_of(mod)
        if me is None:
            unplaced.append(rel)
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        clean = strip(text)
        lines = clean.split("\n")
        raw = text.split("\n")
        own = set(STATIC_DEF.findall(clean))  # static helpers whose names merely look prefixed
        for no, line in enumerate(lines, 1):
            targets = []
            m = INCLUDE.match(raw[no - 1])
            if m:
                t = header_module(m.group(1), os.path.dirname(rel))
                if t:
                    targets.append((t, f'#include "{m.group(1)}"'))
            # cuda/ kernels are reached only through ops.h, which their includes show; their
            # device helpers (st_act, ...) are not calls into other modules
            for c in CALL.finditer(line) if mod != "cuda" else ():
                if c.group(0).rstrip("( ") in own:
                    continue
                targets.append((PREFIXES[c.group(1)], c.group(0).rstrip("( ")))
            for t, what in targets:
                if t == mod or (t.startswith("cuda") and mod == "cuda"):
                    continue
                where = f"{rel}:{no}: {what}"
                if t == "cuda" and not rel.startswith("cuda/") and rel != "core/ops.c":
                    into_cuda.append(where)
                    continue
                tl = layer_of(t)
                if tl is None:
                    unplaced.append(f"{t} (named at {where})")
                elif tl > me:
                    upward.append(f"{where} ({LAYER_NAMES[me]} -> {LAYER_NAMES[tl]})")
                elif me == 3 and tl == 1:
                    model_comm.append(where)
    ok = True
    for name, bad in (("layering_every_source_file_has_a_layer", unplaced),
                      ("layering_no_include_or_call_goes_upward", upward),
                      ("layering_nothing_outside_cuda_reaches_into_cuda", into_cuda),
                      ("layering_the_model_layer_asks_tp_cp_ep_never_comm", model_comm)):
        if bad:
            ok = False
            print(f"FAIL {name}: {len(bad)} place(s)")
            for b in bad[:40]:
                print(f"    {b}")
        else:
            print(f"PASS {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

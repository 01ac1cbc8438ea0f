#!/usr/bin/env python3
"""The layering check (docs/architecture.md), on what the compiler and the linker saw.

The one table of layers is the Makefile's (`make layers` prints it): units, folders or file stems,
bottom to top. A file may include and call only its own layer and those below it; the model never
reaches parallel/comm itself (LAYER_NEVER); only core/base/ops.c and the tools reach the backend
(cuda/). The evidence is the build's own: every object's .d file (each header the preprocessor
opened, angle brackets and macros included) and its `nm` undefined symbols, each resolved to the
object that defines it (so unprefixed names, names built by macros and C++ files count like any
call). A direct #include line is also read from the source, for the model -> comm rule (headers
of tp/cp/ep include comm.h, the model itself may not) and to name file:line.

Usage: layering.py [ROOT [BUILD]]   (defaults: the repository, ROOT/build)
       layering.py --diagram [ROOT]  prints the layer diagram docs/architecture.md carries
Prints one PASS/FAIL line per rule; on a failure, each offending place."""
import os
import re
import subprocess
import sys

SOURCE_EXT = (".c", ".h", ".cc", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def read_table(root):
    """{layer: [units]} in order, the forbidden (lower, upper) pairs and the backend folder."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "-C", root, "layers"],
                         capture_output=True, text=True, check=True).stdout
    layers, never, backend = {}, [], None
    for line in out.splitlines():
        key, _, rest = line.partition(":")
        if key == "never":
            never = [tuple(p.split(":")) for p in rest.split()]
        elif key == "backend":
            backend = rest.strip()
        else:
            layers[key] = rest.split()
    return layers, never, backend


class Table:
    def __init__(self, root):
        self.root = root
        self.layers, self.never, self.backend = read_table(root)
        self.order = list(self.layers)

    def unit_of(self, rel):
        """The unit naming rel most closely (file stem before folder), or None."""
        stem = os.path.splitext(rel)[0]
        best = None
        for layer, units in self.layers.items():
            for u in units:
                if stem == u or rel.startswith(u + "/"):
                    if best is None or len(u) > len(best[1]):
                        best = (layer, u)
        if best is None and self.backend and rel.startswith(self.backend + "/"):
            return ("backend", self.backend)
        return best

    def rank(self, layer):
        return -1 if layer == "backend" else self.order.index(layer)


def sources(root, backend):
    out = []
    for top in ("core", "parallel", "cmd", backend):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x != "emu")  # the emulator is a test harness
            out += [os.path.relpath(os.path.join(d, f), root) for f in sorted(files)
                    if f.endswith(SOURCE_EXT)]
    return out


def objects(build, t):
    """{object path: source rel} for every library, cmd and backend object of the build."""
    out = {}
    for d, _, files in os.walk(build):
        for f in files:
            if not f.endswith(".o"):
                continue
            obj = os.path.join(d, f)
            rel = os.path.relpath(obj, build)[:-2]
            if rel.startswith("test/"):
                continue
            for ext in (".c", ".cc", ".cu"):
                if os.path.exists(os.path.join(t.root, rel + ext)):
                    out[obj] = rel + ext
    return out


def deps(obj):
    """The files the preprocessor opened for obj (its .d file, relative paths as make saw them)."""
    try:
        text = open(obj[:-2] + ".d").read().replace("\\\n", " ")
    except OSError:
        return None
    first = text.split("\n\n")[0]
    return first.partition(":")[2].split()[1:]


def nm(obj):
    """(defined global symbols, undefined symbols) of obj."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper() or kind in "uvw":
            defined.add(name)
    return defined, undefined


def include_line(root, src, header):
    """file:line of the #include in src that names header's file, if src names it directly."""
    base = os.path.basename(header)
    try:
        lines = open(os.path.join(root, src), errors="replace").read().split("\n")
    except OSError:
        return src
    for no, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if m and os.path.basename(m.group(2)) == base:
            return f"{src}:{no}"
    return src


def symbol_line(root, src, sym):
    """file:line where src's text names sym, or src alone (a name built by a macro)."""
    try:
        lines = open(os.path.join(root, src), errors="replace").read().split("\n")
    except OSError:
        return src
    word = re.compile(r"\b" + re.escape(sym) + r"\b")
    for no, line in enumerate(lines, 1):
        if word.search(line):
            return f"{src}:{no}"
    return src


def direct_includes(root, src, headers_by_name):
    """(line, header rel) for each #include in src that names a project header."""
    out = []
    here = os.path.dirname(src)
    for no, line in enumerate(open(os.path.join(root, src), errors="replace").read().split("\n"), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        name = m.group(2)
        cand = os.path.normpath(os.path.join(here, name))
        if m.group(1) == '"' and os.path.exists(os.path.join(root, cand)):
            out.append((no, cand))
            continue
        hits = [h for h in headers_by_name.get(os.path.basename(name), []) if h.endswith(name)]
        if len(hits) == 1:
            out.append((no, hits[0]))
    return out


def check(root, build):
    t = Table(root)
    fails = {k: [] for k in ("every_source_file_has_a_layer", "no_include_goes_upward",
                             "no_call_goes_upward", "the_model_asks_tp_cp_ep_never_comm",
                             "only_ops_create_reaches_the_backend", "every_object_has_its_dependencies")}
    srcs = sources(root, t.backend)
    for s in srcs:
        if t.unit_of(s) is None:
            fails["every_source_file_has_a_layer"].append(s)
    headers_by_name = {}
    for s in srcs:
        if s.endswith(".h"):
            headers_by_name.setdefault(os.path.basename(s), []).append(s)
    objs = objects(build, t)
    if not objs:
        print(f"FAIL layering_objects_found: no objects under {build} (build first)")
        return 1

    def verdict(src, target_rel, where, kind, never=True):
        """Files the preprocessor opened on the way (never=False) may hold comm.h: tp.h includes
        it; what the model names or calls itself may not."""
        me, tu = t.unit_of(src), t.unit_of(target_rel)
        if me is None or tu is None or me[1] == tu[1]:
            return
        if tu[0] == "backend" and me[0] != "backend":
            if src != "core/base/ops.c" and me[0] != "tools":
                fails["only_ops_create_reaches_the_backend"].append(f"{where} ({target_rel})")
            return
        if me[0] == "backend":
            me = ("base", me[1])  # the backend implements ops.h: it stands with base
        if never and (me[0], tu[0]) in t.never:
            fails["the_model_asks_tp_cp_ep_never_comm"].append(f"{where} ({target_rel})")
        elif t.rank(tu[0]) > t.rank(me[0]):
            fails[kind].append(f"{where} ({me[0]} -> {tu[0]}: {target_rel})")

    # includes: every header the preprocessor opened, and the ones each file names itself
    for obj, src in sorted(objs.items()):
        d = deps(obj)
        if d is None:
            fails["every_object_has_its_dependencies"].append(f"{obj} has no .d file")
            continue
        for h in d:
            h = os.path.normpath(h)
            if h.startswith("/") or h.startswith(".."):
                continue  # a system header
            verdict(src, h, include_line(root, src, h), "no_include_goes_upward", never=False)
    for s in srcs:
        for no, h in direct_includes(root, s, headers_by_name):
            me, tu = t.unit_of(s), t.unit_of(h)
            if me and tu and (me[0], tu[0]) in t.never:
                fails["the_model_asks_tp_cp_ep_never_comm"].append(f"{s}:{no} (#include {h})")
    # calls: each undefined symbol, resolved to the object that defines it
    defs, undefs = {}, {}
    for obj in objs:
        d, u = nm(obj)
        undefs[obj] = u
        for sym in d:
            defs.setdefault(sym, obj)
    for obj, src in sorted(objs.items()):
        for sym in sorted(undefs[obj]):
            other = defs.get(sym)
            if other is None or other == obj:
                continue
            verdict(src, objs[other], f"{symbol_line(root, src, sym)}: {sym}", "no_call_goes_upward")
    ok = True
    for name, bad in fails.items():
        bad = sorted(set(bad))
        if bad:
            ok = False
            print(f"FAIL layering_{name}: {len(bad)} place(s)")
            for b in bad[:40]:
                print(f"    {b}")
        else:
            print(f"PASS layering_{name}")
    return 0 if ok else 1


def diagram(root):
    """The layer diagram, top to bottom, as docs/architecture.md carries it."""
    t = Table(root)
    lines = ["```"]
    for layer in reversed(t.order):
        lines.append(f"{layer:<6} | " + "  ".join(t.layers[layer]))
    lines.append(f"{'':<6} | (backend {t.backend}/ implements core/base/ops.h; only ops_create names it)")
    lines.append("never: " + ", ".join(f"{a} -> {b}" for a, b in t.never))
    lines.append("```")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--diagram":
        r = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
        print(diagram(r))
        sys.exit(0)
    r = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "..")
    b = args[1] if len(args) > 1 else os.path.join(r, "build")
    sys.exit(check(r, b))

#!/usr/bin/env python3
"""The house's size rules (docs/architecture.md), measured on the sources under core/, parallel/,
cmd/ and cuda/ (the emulator aside):
  - no function over 80 lines, except CUDA kernels (__global__/__device__: one kernel is one
    launch; host code and the CPU kernels split into tile helpers);
  - no struct over 30 fields, except op tables (nine fields in ten function pointers);
  - every header opens with its contract, a comment of at most 10 lines.
Usage: house_rules.py [ROOT] [--list] [--known FILE]: one PASS/FAIL line per rule (each offender
named); --list prints the largest functions, structs and contracts with their sizes. FILE lists
the offenders still being worked off, one per line, "KIND PATH NAME SIZE" (KIND: function, struct
or contract): each may stay at or below SIZE, none may grow, and an entry that no longer offends
must leave the list, so it only shrinks."""
import os
import re
import sys

MAX_FN, MAX_FIELDS, MAX_CONTRACT = 80, 30, 10


def strip(t):
    """Comments, strings and preprocessor lines blanked, newlines kept (line numbers hold)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    t = re.sub(r"/\*.*?\*/", blank, t, flags=re.S)
    t = re.sub(r"//[^\n]*", blank, t)
    t = re.sub(r'"(\\.|[^"\\\n])*"', blank, t)
    t = re.sub(r"'(\\.|[^'\\\n])*'", blank, t)
    return re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", blank, t, flags=re.M)


def sources(root):
    for top in ("core", "parallel", "cmd", "cuda"):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x != "emu")
            for f in sorted(files):
                if f.endswith((".c", ".h", ".cc", ".cu")):
                    yield os.path.relpath(os.path.join(d, f), root)


def blocks(t):
    """(header text, first line, last line, body) of every top-level {...} block."""
    depth, last, start = 0, 0, None
    for i, c in enumerate(t):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and start is not None:
                hdr = t[last:start]
                lead = len(hdr) - len(hdr.lstrip())
                yield hdr.strip(), t.count("\n", 0, last + lead) + 1, t.count("\n", 0, i) + 1, t[start + 1:i]
                start, last = None, i + 1
        elif c == ";" and depth == 0:
            last = i + 1


def functions(path, t):
    for hdr, a, b, _ in blocks(t):
        if "(" not in hdr or re.match(r"(typedef|struct|enum|union|extern)\b", hdr) or \
                "=" in hdr.split("(")[0]:
            continue
        if re.search(r"__global__|__device__", hdr):
            continue  # a CUDA kernel
        names = re.findall(r"(\w+)\s*\(", hdr)
        yield b - a + 1, f"{path}:{a}", names[0] if names else "?"


def fields(body):
    """The fields of a struct body: declarators at its own depth (nested structs count as one)."""
    flat, depth = [], 0
    for c in body:
        depth += c == "{"
        depth -= c == "}"
        flat.append(c if depth == 0 or c == "}" else " ")
    decls = [d.strip() for d in "".join(flat).split(";") if d.strip()]
    n, fnptr = 0, 0
    for d in decls:
        parts = [p for p in re.split(r",(?![^()]*\))", d)]
        n += len(parts)
        fnptr += len(parts) if re.search(r"\(\s*\*", d) else 0
    return n, fnptr


def structs(path, t):
    for m in re.finditer(r"\bstruct\s*(\w*)\s*\{", t):
        depth, i = 1, m.end()
        while i < len(t) and depth:
            depth += t[i] == "{"
            depth -= t[i] == "}"
            i += 1
        body = t[m.end():i - 1]
        name = m.group(1)
        if not name:
            tail = re.match(r"\s*(\w+)", t[i:])
            name = tail.group(1) if tail else "?"
        n, fnptr = fields(body)
        yield n, fnptr, f"{path}:{t.count(chr(10), 0, m.start()) + 1}", name


def contract(raw):
    """Lines of the comment a header opens with (0: it opens with none)."""
    m = re.match(r"\s*/\*.*?\*/", raw, flags=re.S)
    if m:
        return m.group(0).strip().count("\n") + 1
    lines = raw.lstrip().split("\n")
    n = 0
    while n < len(lines) and lines[n].startswith("//"):
        n += 1
    return n


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "..")
    fns, sts, hdrs = [], [], []
    for p in sources(root):
        raw = open(os.path.join(root, p), errors="replace").read()
        t = strip(raw)
        fns += list(functions(p, t))
        sts += list(structs(p, t))
        if p.endswith(".h"):
            hdrs.append((contract(raw), p))
    if "--list" in sys.argv:
        for n, where, name in sorted(fns, reverse=True)[:30]:
            print(f"function {n:5d} {name} {where}")
        for n, fp, where, name in sorted(sts, reverse=True)[:30]:
            print(f"struct   {n:5d} {name} {where}" + (" (op table)" if fp * 10 >= n * 9 else ""))
        for n, p in sorted(hdrs, reverse=True)[:20]:
            print(f"contract {n:5d} {p}")
        return 0
    known = {}
    if "--known" in sys.argv:
        for line in open(sys.argv[sys.argv.index("--known") + 1]):
            if line.strip() and not line.startswith("#"):
                kind, path, name, size = line.split()
                known[(kind, path, name)] = int(size)
    seen = set()

    def offends(kind, where, name, n):
        key = (kind, where.split(":")[0], name)
        if key in known:
            seen.add(key)
            return n > known[key]
        return True
    rules = [
        ("house_no_function_over_80_lines", [f"{w} {nm}: {n} lines" for n, w, nm in fns
                                             if n > MAX_FN and offends("function", w, nm, n)]),
        ("house_no_struct_over_30_fields",
         [f"{w} {nm}: {n} fields" for n, fp, w, nm in sts
          if n > MAX_FIELDS and fp * 10 < n * 9 and offends("struct", w, nm, n)]),
        ("house_every_header_opens_with_a_contract_of_at_most_10_lines",
         [f"{p}: {'no contract' if n == 0 else f'{n} lines'}" for n, p in hdrs
          if (n == 0 or n > MAX_CONTRACT) and offends("contract", p, "-", n)]),
    ]
    if known:
        rules.append(("house_known_offenders_list_only_shrinks",
                      [f"{' '.join(k)}: no longer offends, remove it" for k in known if k not in seen]))
    ok = True
    for name, bad in rules:
        if bad:
            ok = False
            print(f"FAIL {name}: {len(bad)}")
            for b in sorted(bad):
                print(f"    {b}")
        else:
            print(f"PASS {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

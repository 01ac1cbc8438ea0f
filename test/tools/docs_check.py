#!/usr/bin/env python3
"""Checks what the docs point at (test/sh/docs.sh): every relative link in README.md and docs/*.md
names a file that exists (and a #heading that exists in it), every `path/file.c:function` named
in them is defined in that file, and every code comment citing "docs/design.md section N" names a
section docs/design.md has. Prints one line per broken reference; exit 1 if any."""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
bad = []


def slug(h):  # GitHub's heading anchors
    h = re.sub(r"[`*_]", "", h.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def headings(path):
    with open(path, encoding="utf-8") as f:
        return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", f.read(), re.M)}


docs = [os.path.join(root, "README.md")]
if os.path.isdir(os.path.join(root, "docs")):
    docs += sorted(os.path.join(root, "docs", n) for n in os.listdir(os.path.join(root, "docs"))
                   if n.endswith(".md"))
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    here = os.path.dirname(doc)
    name = os.path.relpath(doc, root)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, path)) if path else doc
        if not os.path.exists(full):
            bad.append(f"{name}: link {target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in headings(full):
            bad.append(f"{name}: link {target}: no such heading")
    for m in re.finditer(r"`([\w./-]+\.(?:c|h|cu|cc|py|sh)):(\w+)`", text):
        path, fn = m.groups()
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            bad.append(f"{name}: {path}:{fn}: no such file")
            continue
        src = open(full, encoding="utf-8", errors="replace").read()
        if not re.search(rf"^(?:[\w\s\*]*?[\s\*])?{re.escape(fn)}\s*\(", src, re.M) and \
           not re.search(rf"^\s*def {re.escape(fn)}\b|^{re.escape(fn)}\s*\(\)", src, re.M):
            bad.append(f"{name}: {path}:{fn}: no such function in the file")

design = os.path.join(root, "docs", "design.md")
sections = set()
if os.path.isfile(design):
    sections = {m.group(1) for m in re.finditer(r"^## (\d+)\. ", open(design).read(), re.M)}
for top in ("cmd", "core", "parallel", "cuda", "test", "scripts"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for n in files:
            if not n.endswith((".c", ".h", ".cu", ".cc", ".py", ".sh")) or n in ("docs_check.py", "docs.sh"):
                continue
            p = os.path.join(dirpath, n)
            src = open(p, encoding="utf-8", errors="replace").read()
            for m in re.finditer(r"design\.md section (\d+)", src):
                if m.group(1) not in sections:
                    bad.append(f"{os.path.relpath(p, root)}: cites design.md section {m.group(1)}, "
                               "which docs/design.md does not have")
            if re.search(r"\bDESIGN\.md\b", src):
                bad.append(f"{os.path.relpath(p, root)}: cites DESIGN.md, not in the repository")

for b in bad:
    print(b)
sys.exit(1 if bad else 0)

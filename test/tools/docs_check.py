#!/usr/bin/env python3
"""The docs check (test/sh/docs.sh): what README.md and docs/*.md point at exists.

    docs_check.py [ROOT]

Prints one PASS or FAIL line per check (FAIL lines name each place), exit 1 when any failed:
  docs_links_resolve          every relative markdown link names an existing file, and its
                              #anchor a heading of that file (GitHub's slugs)
  docs_paths_exist            every backticked source path (cmd/, core/, parallel/, cuda/,
                              scripts/, test/, configs/, docs/) exists (a module name such as
                              core/io/hf_import: a file of that stem)
  docs_functions_exist        every backticked `path/file.c:function` names a file that exists
                              and a function defined in it (a definition starting a line)
  design_sections_cited_exist every "docs/design.md section N" in the code is a "## N." heading
                              of docs/design.md, and no code cites a DESIGN.md outside docs/
  design_yaml_is_test_configs docs/design.md section 1's YAML is test/test_config.c's copy
  readme_at_most_300_lines    README.md is what a newcomer reads first: at most 300 lines
"""
import glob
import os
import re
import sys

README_MAX_LINES = 300
SOURCE_DIRS = ("cmd", "core", "parallel", "cuda", "scripts", "test", "configs", "docs")
CODE_EXTS = (".c", ".h", ".cu", ".cc", ".py", ".sh")
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")
FUNC_REF = re.compile(r"`([A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)+\.(?:c|h|cu|cc|py|sh)):([A-Za-z_]\w*)`")
PATH_REF = re.compile(r"`((?:%s)/[A-Za-z0-9_./+-]*[A-Za-z0-9_+-])(?::\w+)?`" % "|".join(SOURCE_DIRS))
CITE = re.compile(r"(docs/design\.md|DESIGN\.md) section (\d+)")


def doc_files(root):
    files = [os.path.join(root, "README.md")] if os.path.exists(os.path.join(root, "README.md")) else []
    return files + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    inside = False
    for i, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield i, line


def slug(heading):
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces -> '-'."""
    h = heading.strip().lower()
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)  # a link keeps its text
    h = h.replace("`", "")
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for _, line in prose_lines(open(path, encoding="utf-8").read()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def check_links(root, files):
    bad = []
    for f in files:
        for no, line in prose_lines(open(f, encoding="utf-8").read()):
            for m in LINK.finditer(INLINE_CODE.sub("", line)):
                target = m.group(2)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                where = "%s:%d: (%s)" % (os.path.relpath(f, root), no, target)
                if not os.path.exists(dest):
                    bad.append("%s names no file" % where)
                elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
                    bad.append("%s: no heading #%s in %s" % (where, anchor, os.path.relpath(dest, root)))
    return bad


def refs(files, pattern):
    for f in files:
        for no, line in prose_lines(open(f, encoding="utf-8").read()):
            for m in pattern.finditer(line):
                yield f, no, m


def check_paths(root, files):
    bad = []
    for f, no, m in refs(files, PATH_REF):
        p = m.group(1)
        if any(c in p for c in "*<>") or p.endswith("/"):
            continue
        full = os.path.join(root, p)
        if not os.path.exists(full) and not glob.glob(full + ".*"):  # a module: core/io/hf_import
            bad.append("%s:%d: %s does not exist" % (os.path.relpath(f, root), no, p))
    return bad


def defines(path, func):
    """Does the file at path define func? C-like: a line starting with the declaration whose
    parameter list is followed by a body, not a ';'. Python: def/class; shell: NAME() or
    function NAME."""
    text = open(path, encoding="utf-8", errors="replace").read()
    if path.endswith(".py"):
        return re.search(r"^\s*(def|class)\s+%s\b" % func, text, re.M) is not None
    if path.endswith(".sh"):
        return re.search(r"^\s*(function\s+%s\b|%s\s*\(\))" % (func, func), text, re.M) is not None
    for m in re.finditer(r"^[A-Za-z_][\w \t*]*?\b%s\s*\(" % func, text, re.M):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        rest = re.match(r"[^;{]*", text[i:]).group(0)
        if i + len(rest) < len(text) and text[i + len(rest)] == "{":
            return True
    return False


def check_functions(root, files):
    bad = []
    for f, no, m in refs(files, FUNC_REF):
        path, func = m.group(1), m.group(2)
        where = "%s:%d: %s:%s" % (os.path.relpath(f, root), no, path, func)
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            bad.append("%s: no file %s" % (where, path))
        elif not defines(full, func):
            bad.append("%s: %s defines no function %s" % (where, path, func))
    return bad


def design_sections(root):
    p = os.path.join(root, "docs", "design.md")
    if not os.path.exists(p):
        return set()
    return {int(m.group(1)) for m in re.finditer(r"^## (\d+)\. ", open(p, encoding="utf-8").read(), re.M)}


def code_files(root):
    for d in ("cmd", "core", "parallel", "cuda", "test", "scripts"):
        for dirpath, _, names in os.walk(os.path.join(root, d)):
            for n in sorted(names):
                if n.endswith(CODE_EXTS) and n != "docs_check.py":
                    yield os.path.join(dirpath, n)
    if os.path.exists(os.path.join(root, "Makefile")):
        yield os.path.join(root, "Makefile")


def check_citations(root):
    have, bad = design_sections(root), []
    for f in code_files(root):
        for no, line in enumerate(open(f, encoding="utf-8", errors="replace"), 1):
            for m in CITE.finditer(line):
                where = "%s:%d" % (os.path.relpath(f, root), no)
                if m.group(1) != "docs/design.md":
                    bad.append("%s cites %s, which is not in the repository (docs/design.md)" % (where, m.group(1)))
                elif int(m.group(2)) not in have:
                    bad.append("%s cites docs/design.md section %s, which has no heading '## %s.'"
                               % (where, m.group(2), m.group(2)))
    return bad


def check_design_yaml(root):
    design = os.path.join(root, "docs", "design.md")
    test = os.path.join(root, "test", "test_config.c")
    if not (os.path.exists(design) and os.path.exists(test)):
        return ["docs/design.md or test/test_config.c is missing"]
    text = open(design, encoding="utf-8").read()
    sec = re.search(r"^## 1\. .*?(?=^## 2\. |\Z)", text, re.M | re.S)
    block = re.search(r"^```yaml\n(.*?)^```", sec.group(0) if sec else "", re.M | re.S)
    src = re.search(r"DESIGN_YAML =\s*\n(.*?);\n", open(test, encoding="utf-8").read(), re.S)
    if not block or not src:
        return ["no ```yaml block in docs/design.md section 1, or no DESIGN_YAML in test/test_config.c"]
    copy = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', src.group(1)))
    copy = copy.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
    if block.group(1) != copy:
        a, b = block.group(1).split("\n"), copy.split("\n")
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        return ["docs/design.md section 1's YAML line %d differs from test/test_config.c's DESIGN_YAML: %r vs %r"
                % (i + 1, a[i] if i < len(a) else "", b[i] if i < len(b) else "")]
    return []


def check_readme(root):
    p = os.path.join(root, "README.md")
    if not os.path.exists(p):
        return ["README.md is missing"]
    n = len(open(p, encoding="utf-8").read().splitlines())
    return ["README.md has %d lines, at most %d (the rest belongs in docs/)" % (n, README_MAX_LINES)] if n > README_MAX_LINES else []


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files = doc_files(root)
    checks = [
        ("docs_links_resolve", lambda: check_links(root, files)),
        ("docs_paths_exist", lambda: check_paths(root, files)),
        ("docs_functions_exist", lambda: check_functions(root, files)),
        ("design_sections_cited_exist", lambda: check_citations(root)),
        ("design_yaml_is_test_configs", lambda: check_design_yaml(root)),
        ("readme_at_most_300_lines", lambda: check_readme(root)),
    ]
    failed = 0
    for name, run in checks:
        bad = run()
        if bad:
            failed += 1
            print("FAIL %s: %d problem%s" % (name, len(bad), "" if len(bad) == 1 else "s"))
            for b in bad:
                print("  " + b)
        else:
            print("PASS %s" % name)
    n_refs = sum(1 for _ in refs(files, FUNC_REF))
    print("docs_check: %d pages, %d file:function references" % (len(files), n_refs), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The docs resolve (test/tools/docs_check.py): relative links and #headings in README.md and
# docs/*.md, every `file:function` they name, every comment's "docs/design.md section N". The
# checker is checked on a copy of the tree with a broken link, a missing function, a cited
# section docs/design.md lacks and a comment citing the old DESIGN.md.
. "$(dirname "$0")/../lib.sh"

out=$(python3 test/tools/docs_check.py . 2>&1) && pass docs_links_and_functions_resolve ||
    fail docs_links_and_functions_resolve "$out"
T=$TMP/tree
mkdir -p $T
cp -a README.md docs core parallel cmd cuda test scripts $T/
probe() { # NAME EXPECTED-MESSAGE: the copy, broken by the caller, must fail naming it
    if out=$(python3 test/tools/docs_check.py $T 2>&1); then
        fail $1 "the checker passed a broken tree"
    elif echo "$out" | grep -q -- "$2"; then
        pass $1
    else
        fail $1 "expected '$2' in: $out"
    fi
}
cp $T/docs/architecture.md $T/keep.md
echo "See [the plan](no-such-page.md) and [design](design.md#no-such-heading)." >>$T/docs/architecture.md
probe docs_check_catches_a_broken_link "link no-such-page.md: no such file"
probe docs_check_catches_a_missing_heading "link design.md#no-such-heading: no such heading"
cp $T/keep.md $T/docs/architecture.md
echo 'The sealing: `core/io/ckpt_commit.c:ckpt_seal_everything`.' >>$T/docs/architecture.md
probe docs_check_catches_a_missing_function "ckpt_commit.c:ckpt_seal_everything: no such function"
cp $T/keep.md $T/docs/architecture.md
echo "/* docs/design.md section 11 says so */" >>$T/core/base/rng.c
probe docs_check_catches_a_missing_design_section "cites design.md section 11"
sed -i '$d' $T/core/base/rng.c
echo "/* as DESIGN.md section 3 says */" >>$T/core/base/rng.c
probe docs_check_catches_the_old_design_file "cites DESIGN.md"
sed -i '$d' $T/core/base/rng.c
python3 test/tools/docs_check.py $T >/dev/null 2>&1 && pass docs_check_passes_the_repaired_copy ||
    fail docs_check_passes_the_repaired_copy "$(python3 test/tools/docs_check.py $T 2>&1)"
echo 'Sealed in `core/io/ckpt_commit.c:ckpt_commit`.' >>$T/docs/architecture.md
python3 test/tools/docs_check.py $T >/dev/null 2>&1 && pass docs_check_accepts_a_real_function ||
    fail docs_check_accepts_a_real_function "$(python3 test/tools/docs_check.py $T 2>&1)"

#!/usr/bin/env bash
# The docs resolve (test/tools/docs_check.py): over README.md and docs/*.md every relative link
# names an existing file and heading, every backticked source path exists, every
# `path/file.c:function` names a function defined there; every code comment citing
# "docs/design.md section N" names a section that exists; design.md's YAML is test_config.c's;
# README.md is at most 300 lines. The checker itself is checked: in a copy of the tree, one
# deliberate breakage at a time must fail, naming the place.
. "$(dirname "$0")/../lib.sh"

python3 test/tools/docs_check.py . 2>/dev/null

T=$TMP/tree
mkdir -p $T
cp -a README.md docs core parallel cmd cuda scripts test Makefile $T/
# broken NAME PATTERN FILE=EDIT...: applies each sed EDIT to FILE in the copy; the checker must
# fail with output matching PATTERN; then puts the files back
broken() {
    local name=$1 pat=$2 out f
    shift 2
    for fe in "$@"; do
        f=${fe%%=*}
        sed -i "${fe#*=}" $T/$f
    done
    if out=$(python3 test/tools/docs_check.py $T 2>&1); then
        fail "$name" "the checker passed the broken tree"
    else
        echo "$out" | grep -qE "$pat" && pass "$name" || fail "$name" "$(echo "$out" | grep -A3 FAIL | head -6)"
    fi
    for fe in "$@"; do
        f=${fe%%=*}
        cp -a $f $T/$f
    done
}
broken docs_check_catches_a_link_to_no_file "README.md:[0-9]+: \(docs/no_such_page.md\) names no file" \
    'README.md=$a See [a page](docs/no_such_page.md).'
broken docs_check_catches_a_link_to_no_heading "docs/pp.md:[0-9]+: \(dp.md#no-such-heading\): no heading #no-such-heading in docs/dp.md" \
    'docs/pp.md=$a See [ZeRO](dp.md#no-such-heading).'
broken docs_check_catches_a_missing_function "docs/architecture.md:[0-9]+: core/io/ckpt_commit.c:ckpt_seal_probe: core/io/ckpt_commit.c defines no function ckpt_seal_probe" \
    'docs/architecture.md=$a Sealed in `core/io/ckpt_commit.c:ckpt_seal_probe`.'
broken docs_check_catches_a_declared_but_undefined_function "core/io/ckpt_commit.c defines no function ckpt_decl_probe" \
    'core/io/ckpt_commit.c=$a int ckpt_decl_probe(int x);' \
    'docs/architecture.md=$a Declared only: `core/io/ckpt_commit.c:ckpt_decl_probe`.'
broken docs_check_catches_a_function_in_a_missing_file "no file core/io/ckpt_gone.c" \
    'docs/checkpoints.md=$a Gone: `core/io/ckpt_gone.c:ckpt_commit`.'
broken docs_check_catches_a_missing_path "docs/data.md:[0-9]+: core/io/no_such_module.c does not exist" \
    'docs/data.md=$a Read by `core/io/no_such_module.c`.'
# (the citations are spelt through $S, so that this script cites nothing itself)
S="design.md section"
broken docs_check_catches_a_cited_section_that_does_not_exist "core/model/model.c:1 cites docs/$S 11, which has no heading" \
    "core/model/model.c=1s|^|/* docs/$S 11 */ |"
broken docs_check_catches_a_cited_section_that_was_renumbered "core/train/train.c:1 cites docs/$S 4, which has no heading" \
    'docs/design.md=s/^## 4\. /## Four. /'
broken docs_check_catches_a_citation_of_a_file_outside_the_repository "parallel/tp.c:1 cites DESIGN.md, which is not in the repository" \
    "parallel/tp.c=1s|^|/* DESIGN.md${S#design.md} 3 */ |"
broken docs_check_catches_design_yaml_drifting_from_test_config "section 1's YAML line 2 differs from test/test_config.c" \
    'docs/design.md=s/^model:      {arch: llama, n_layer: 4,/model:      {arch: llama, n_layer: 5,/'
seq 1 300 | sed 's/^/filler line /' >$TMP/filler.txt
broken docs_check_catches_a_readme_over_300_lines "README.md has [34][0-9][0-9] lines, at most 300" \
    "README.md=\$r $TMP/filler.txt"
# claims the walkthrough found false (issue 33): eval of a Hugging Face directory works (eval_cli.sh
# runs it), and a sharded export is in ustrain's tensor order, not transformers' state_dict order
! grep -q 'until the import is in, that path exits 2' docs/huggingface.md README.md &&
    pass docs_do_not_say_hf_eval_exits_2 || fail docs_do_not_say_hf_eval_exits_2 "docs/huggingface.md"
grep -q "in ustrain's tensor order, which is not transformers' \`state_dict\` order" docs/huggingface.md &&
    ! grep -q 'split as transformers$' docs/huggingface.md &&
    pass docs_say_the_export_shard_order_is_ustrains || fail docs_say_the_export_shard_order_is_ustrains "docs/huggingface.md"
exit 0

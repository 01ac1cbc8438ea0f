#!/usr/bin/env bash
# The kernels' resources on sm_90, as ptxas reports them (what CI can check without a GPU): every
# cuda/*.cu compiled once for sm_90 with -Xptxas -v (the PTX kept for the launch bounds). Fails
# on any register spill, and on a kernel whose registers (rounded to ptxas's allocation unit of
# 8) times its threads per block exceed the 64K registers of an SM: a kernel over 64 registers
# must declare __launch_bounds__ (64 x 1024 fills an SM), and its .maxntid bounds the product.
. "$(dirname "$0")/../lib.sh"

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
    echo "SKIP cuda_resources: nvcc not found (the CUDA toolkit is not installed)"
    exit 0
fi
for f in cuda/*.cu; do
    n=$(basename $f .cu)
    grep -q '__global__' $f || continue # no kernel of its own (cuda_plugin.cu: the loader's table)
    mkdir -p $TMP/$n
    if ! nice "$NVCC" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xptxas -v -keep \
        -keep-dir $TMP/$n -Icuda -Icore/base -c $f -o $TMP/$n.o >$TMP/$n.log 2>&1; then
        fail "cuda_resources_${n}_compiles" "$(grep -m3 error $TMP/$n.log)"
        continue
    fi
    python3 - $TMP/$n.log $TMP/$n/*.ptx <<'PY' | sed "s/^\(PASS\|FAIL\) /\1 cuda_resources_${n}_/"
import re, sys
log = open(sys.argv[1]).read()
ptx = ''.join(open(p).read() for p in sys.argv[2:])
bounds = {}  # entry -> max threads per block (.maxntid)
for m in re.finditer(r'\.entry (\w+)\((?:[^)]*)\)\s*((?:\.\w+[^\n]*\n\s*)*)', ptx):
    nt = re.search(r'\.maxntid (\d+), (\d+), (\d+)', m.group(2))
    if nt: bounds[m.group(1)] = int(nt.group(1)) * int(nt.group(2)) * int(nt.group(3))
spills, over, n = [], [], 0
for m in re.finditer(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                     r"(\d+) bytes spill loads(?:\nptxas info\s*: Used (\d+) registers)?", log):
    name, st, ld, regs = m.group(1), int(m.group(3)), int(m.group(4)), m.group(5)
    if st or ld: spills.append('%s (%d B stores, %d B loads)' % (name, st, ld))
    if regs is None: continue
    n += 1
    r = (int(regs) + 7) // 8 * 8
    threads = bounds.get(name, 1024)
    if r * threads > 65536:
        over.append('%s: %s registers x %d threads%s' % (name, regs, threads, '' if name in bounds else ' (no __launch_bounds__)'))
if n == 0: print('FAIL parsed: no kernel found in the ptxas output')
elif spills: print('FAIL no_spills: ' + '; '.join(spills))
else: print('PASS no_spills (%d kernels)' % n)
if over: print('FAIL registers_fit_an_sm: ' + '; '.join(over))
elif n: print('PASS registers_fit_an_sm')
PY
done
exit 0

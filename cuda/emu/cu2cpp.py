#!/usr/bin/env python3
"""cu2cpp: turns a cuda/*.cu file into C++ for the emulator build (make emu): kernel launches
`k<<<grid, block[, smem[, stream]]>>>(args);` become emu_launch(grid, block, ..., [=] { k(args); })
after a check that every pointer argument is device memory, and dynamic shared memory becomes the
emulator's per-block buffer; each static `__shared__` declaration registers its arrays with
emu_shared_reg as it runs, so strict mode (emu_strict.cpp) knows shared memory by address. Usage: cu2cpp.py IN.cu OUT.cpp"""
import re
import sys

src = open(sys.argv[1]).read()
src = src.replace('extern __shared__ float sm[];', 'float *sm = (float *)emu_dyn_smem;')


def shared_decl(m):
    """`__shared__ T a[N], b[M];` -> the same static arrays, then their registration (one line)."""
    names, depth, cur = [], 0, ''
    for ch in m.group(2) + ',':
        depth += ch == '['
        depth -= ch == ']'
        if ch == ',' and depth == 0:
            names.append(re.match(r'\s*(\w+)', cur).group(1))
            cur = ''
        else:
            cur += ch
    return '__shared__ %s %s; %s' % (m.group(1), m.group(2), ' '.join(
        'emu_shared_reg(&%s, sizeof %s);' % (n, n) for n in names))


src = re.sub(r'(?<!extern )__shared__\s+(\w+)\s+([^;]+);', shared_decl, src)
launch = re.compile(r'(\w+(?:<[\w, ]+>)?)\s*<<<(.*?)>>>\((.*?)\);', re.S)
# every pointer argument must be device memory (or null): checked once, at the launch
src = launch.sub(lambda m: '(emu_check_args((const void *)&%s, "%s", __func__, %s), emu_launch(%s, [=] { %s(%s); }));'
                 % (m.group(1), m.group(1), m.group(3), m.group(2), m.group(1), m.group(3)), src)
with open(sys.argv[2], 'w') as f:
    f.write('#line 1 "%s"\n' % sys.argv[1])
    f.write(src)

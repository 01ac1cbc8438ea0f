#!/usr/bin/env python3
"""cu2cpp: turns a cuda/*.cu file into C++ for the emulator build (make emu): kernel launches
`k<<<grid, block[, smem[, stream]]>>>(args);` become emu_launch(grid, block, ..., [=] { k(args); })
and dynamic shared memory becomes the emulator's per-block buffer. Usage: cu2cpp.py IN.cu OUT.cpp"""
import re
import sys

src = open(sys.argv[1]).read()
src = src.replace('extern __shared__ float sm[];', 'float *sm = (float *)emu_dyn_smem;')
launch = re.compile(r'(\w+(?:<\w+>)?)<<<(.*?)>>>\((.*?)\);', re.S)
src = launch.sub(lambda m: 'emu_launch(%s, [=] { %s(%s); });' % (m.group(2), m.group(1), m.group(3)), src)
with open(sys.argv[2], 'w') as f:
    f.write('#line 1 "%s"\n' % sys.argv[1])
    f.write(src)

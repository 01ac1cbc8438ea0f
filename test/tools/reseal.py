#!/usr/bin/env python3
"""reseal.py STEP_DIR: recomputes manifest.json's sizes and block CRC-32s from the files as they
are now. The hardening tests tamper with a checkpoint on purpose and reseal it, so that what they
exercise is the check behind the manifest (a hostile writer can rewrite the manifest too)."""
import json, os, sys, zlib

d = sys.argv[1]
path = os.path.join(d, "manifest.json")
m = json.load(open(path))
B = m["block_bytes"]
for f in m["files"]:
    b = open(os.path.join(d, f["name"]), "rb").read()
    f["size"] = len(b)
    f["crc32"] = [zlib.crc32(b[i:i + B]) for i in range(0, len(b), B)]
json.dump(m, open(path, "w"), indent=1)

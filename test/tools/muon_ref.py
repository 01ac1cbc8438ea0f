#!/usr/bin/env python3
"""Muon written from the math (Jordan et al. 2024; Moonlight, Liu et al. 2025) in numpy, checked
against ustrain's checkpoints.

  muon_ref.py selftest
      the reference itself: the quintic's coefficients, Newton-Schulz acting on every singular
      value as the polynomial p(x) = a x + b x^3 + c x^5 iterated (to 1e-12 in float64), and the
      published tolerance of the result's orthogonality: singular values in [0.5, 1.5] for
      Gaussian matrices of several shapes.
  muon_ref.py step CKPT1 CKPT2 METRICS [--lr-ratio R] [--mu M] [--no-nesterov] [--scale RULE]
              [--wd WD] [--b1 B1 --b2 B2 --eps EPS]
      one step of a tiny model: from step k's checkpoint (weights W1, states) and step k+1's
      (W2, states), where each state gives the step's scaled gradient (Muon: s g = M2 - mu M1;
      AdamW: its moments), the reference's W2 must equal ustrain's to 1e-6 for every tensor, and
      the singular values of ustrain's orthogonalised update (recovered from W1 and W2) must be
      p^steps of the momentum's normalised singular values (to 1e-3: the fp32 update recovered
      from a difference of fp32 weights). --fresh: CKPT1 is another optimizer's checkpoint that
      step 2 resumed with optimizer.reset_state (its weights, zero momentum).
"""
import json
import re
import sys

import numpy as np
import safetensors.numpy

A, B, C = 3.4445, -4.7750, 2.0315  # Muon's published quintic


def newton_schulz(G, steps=5):
    X = G.astype(np.float64) / (np.linalg.norm(G) + 1e-7)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        Am = X @ X.T
        X = A * X + (B * Am + C * Am @ Am) @ X
    return X.T if tall else X


def poly_iter(s, steps=5):
    for _ in range(steps):
        s = A * s + B * s ** 3 + C * s ** 5
    return s


def read_st(path):
    # the safetensors package's own reader (float32 checkpoints), widened for the reference
    return {k: v.astype(np.float64) for k, v in safetensors.numpy.load_file(path).items()}


def selftest():
    ok = True
    # the coefficients: p(1) = a + b + c, the published fixed-point neighbourhood ~0.7
    ok &= abs(A + B + C - 0.701) < 1e-9 and abs(A - 3.4445) < 1e-12
    rng = np.random.default_rng(0)
    for shape in [(32, 32), (16, 48), (48, 16), (64, 256), (256, 64)]:
        G = rng.standard_normal(shape)
        U, S, Vt = np.linalg.svd(G, full_matrices=False)
        O = newton_schulz(G)
        # Newton-Schulz is an odd matrix polynomial: same singular vectors, values p^5(s/|G|)
        want = U @ np.diag(poly_iter(S / (np.linalg.norm(G) + 1e-7))) @ Vt
        err = np.abs(O - want).max()
        sv = np.linalg.svd(O, compute_uv=False)
        print(f"{shape}: polynomial err {err:.2e}, singular values [{sv.min():.3f}, {sv.max():.3f}]")
        ok &= err < 1e-12 and sv.min() > 0.5 and sv.max() < 1.5
    return ok


def muon_tensor(name, ndim, routers=False):
    if ndim != 2 or re.search(r"embed_tokens|embed_positions|lm_head", name):
        return False
    return routers or ".router." not in name


def step(a):
    w1, w2 = read_st(a.ckpt1 + "/model.safetensors"), read_st(a.ckpt2 + "/model.safetensors")
    o1, o2 = read_st(a.ckpt1 + "/optimizer.safetensors"), read_st(a.ckpt2 + "/optimizer.safetensors")
    rows = [json.loads(l) for l in open(a.metrics)]
    k2 = int(re.search(r"step_0*(\d+)", a.ckpt2).group(1))
    lr = [r["lr"] for r in rows if r["step"] == k2][0]
    worst, worst_sv, nm = 0.0, 0.0, 0
    for name, W1 in w1.items():
        W2 = w2[name]
        if muon_tensor(name, W1.ndim, a.routers):
            nm += 1
            M2 = o2[name + ".momentum_buffer"]
            M1 = np.zeros_like(M2) if a.fresh else o1[name + ".momentum_buffer"]
            sg = M2 - a.mu * M1
            u = sg + a.mu * M2 if a.nesterov else M2
            r, c = W1.shape
            scale = 0.2 * np.sqrt(max(r, c)) if a.scale == "moonlight" else np.sqrt(max(1.0, r / c))
            O = newton_schulz(u, a.ns_steps)
            ref = W1 * (1 - lr * a.wd) - lr * scale * O
            # the polynomial on ustrain's own update
            O_ust = (W1 * (1 - lr * a.wd) - W2) / (lr * scale)
            s_u = np.linalg.svd(u, compute_uv=False)
            s_o = np.linalg.svd(O_ust, compute_uv=False)
            want = np.sort(poly_iter(s_u / (np.linalg.norm(u) + 1e-7), a.ns_steps))[::-1]
            worst_sv = max(worst_sv, np.abs(np.sort(s_o)[::-1] - want).max())
        else:
            m2, v2 = o2[name + ".exp_avg"], o2[name + ".exp_avg_sq"]
            t = k2
            alr = lr * a.lr_ratio
            wd = a.wd if W1.ndim == 2 else 0.0
            mhat, vhat = m2 / (1 - a.b1 ** t), v2 / (1 - a.b2 ** t)
            ref = W1 - alr * (mhat / (np.sqrt(vhat) + a.eps) + wd * W1)
        err = np.abs(ref - W2).max()
        if err > worst:
            worst, wname = err, name
    print(f"{nm} Muon matrices, {len(w1) - nm} AdamW tensors: max |W2 - ref| {worst:.2e} ({wname}), "
          f"singular values vs p^{a.ns_steps}: {worst_sv:.2e}")
    return nm > 0 and worst <= 1e-6 and worst_sv <= 1e-3


def main():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["selftest", "step"])
    p.add_argument("ckpt1", nargs="?")
    p.add_argument("ckpt2", nargs="?")
    p.add_argument("metrics", nargs="?")
    p.add_argument("--lr-ratio", type=float, default=1.0)
    p.add_argument("--mu", type=float, default=0.95)
    p.add_argument("--no-nesterov", dest="nesterov", action="store_false")
    p.add_argument("--scale", default="moonlight")
    p.add_argument("--ns-steps", type=int, default=5)
    p.add_argument("--routers", action="store_true")
    p.add_argument("--fresh", action="store_true", help="CKPT1 is another optimizer's: zero momentum")
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--b1", type=float, default=0.9)
    p.add_argument("--b2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    a = p.parse_args()
    ok = selftest() if a.mode == "selftest" else step(a)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

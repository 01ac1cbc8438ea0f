/* optim_muon: Muon's per-matrix math on any backend (ops.h): the momentum, the quintic
 * Newton-Schulz orthogonalisation and the update with its shape scale, and which parameters
 * Muon steps. Where each matrix is whole (ZeRO shards, tensor-parallel slices) is the caller's
 * (parallel/dp_muon.c); these functions see one whole matrix, or one piece for the elementwise
 * parts, and give the same bits for the same inputs on every rank. */
#ifndef UST_OPTIM_MUON_H
#define UST_OPTIM_MUON_H

#include <stdint.h>

#include "config.h"
#include "ops.h"

/* Muon's published quintic: X <- a X + (b A + c A^2) X with A = X X^T. */
#define OPTIM_NS_A 3.4445f
#define OPTIM_NS_B (-4.7750f)
#define OPTIM_NS_C 2.0315f

/* What a tensor is to Muon, from its name (the memory plan's layers have none: "" is a layer's
 * tensor), dims and decay: a hidden 2-D linear map, a MoE router, or neither (embeddings,
 * positions, the head, norms, biases). */
enum { OPTIM_NOT_MATRIX, OPTIM_HIDDEN, OPTIM_ROUTER };
int optim_matrix_kind(const char *name, int ndim, int decay);
/* Whether Muon steps a tensor of that kind under cfg: hidden matrices, and routers with
 * optimizer.muon_routers; the rest take AdamW. Always 0 when optimizer.name is not muon. */
int optim_muon_takes(const ust_config *cfg, int kind);
/* The update's shape scale for a rows x cols (out x in) matrix: moonlight 0.2 sqrt(max(rows,
 * cols)), which matches AdamW's update RMS; original sqrt(max(1, rows / cols)). */
float optim_muon_scale(const ust_config *cfg, int64_t rows, int64_t cols);
/* On n elements: m = mu m + s g, then u = s g + mu m (Nesterov) or m, written over g. */
void optim_muon_momentum(const ust_ops *o, const ust_config *cfg, float *g, float *m, int64_t n,
                         float grad_scale);
/* Floats of work optim_newton_schulz needs for a rows x cols matrix. */
int64_t optim_ns_work(int64_t rows, int64_t cols);
/* X (rows x cols, device) <- steps quintic Newton-Schulz iterations from X / |X|_F, in fp32,
 * on the smaller Gram matrix (X^T X when rows > cols). */
void optim_newton_schulz(const ust_ops *o, float *X, int rows, int cols, int steps, float *work);
/* p = p (1 - lr wd) - lr scale O on n elements: decoupled weight decay, then the step. */
void optim_muon_apply(const ust_ops *o, float *p, const float *O, int64_t n, float lr, float wd,
                      float scale);
#endif

/* model_state: the model's state, the parts of struct model each filled by one of the files
 * that implement model.h (params.c, acts.c, model.c, model_moe.c; model_block.c and
 * model_vocab.c only read them), and the small helpers they share. Outside core/model only the
 * memory plan sees it (through acts.h), and it reads no field. */
#ifndef UST_MODEL_STATE_H
#define UST_MODEL_STATE_H

#include "cp.h"
#include "model.h"
#include "moe.h"
#include "tp.h"

typedef struct {
    float *ln1_w, *ln1_b, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
    float *ln2_w, *ln2_b, *wg, *wu, *bu, *wd, *bd;
    float *qn_w, *kn_w;   /* model.qk_norm: the per-head q and k RMSNorm weights (D each) */
    float *pn1_w, *pn2_w; /* model.sandwich_norm: the norms after attention and after the MLP */
    /* model.mla (model_mla.c): q_a_proj, q_a_layernorm, q_b_proj (q_lora_rank > 0; else wq),
     * kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; wo is o_proj (C, H*v_head_dim) */
    float *wqa, *qa_norm, *wqb, *wkva, *kva_norm, *wkvb;
} layer_w; /* weights of one layer; the same struct points into the gradients */

/* model.mla: what a layer's latent attention keeps for its backward (model_mla.c); N rows,
 * Rq = q_lora_rank, Rkv = kv_lora_rank, R = qk_rope_head_dim, Dv = v_head_dim */
typedef struct {
    act *qa, *qan;            /* (N,Rq) q_a_proj's output, after q_a_layernorm */
    float *qa_rstd, *kv_rstd; /* (N) each: the two latent norms' statistics */
    act *ckv, *ckvn;          /* (N,Rkv) the latent c_kv, after kv_a_layernorm */
    act *krope;               /* (N,R) the one rope key all heads share, after RoPE */
    act *attv;                /* (N,H*Dv) attention's output without v's padding (o_proj's input) */
} mla_acts;

typedef struct layer_acts_s {
    act *ln1;                   /* (N,C) */
    float *ln1_mean, *ln1_rstd; /* (N), (N) */
    act *q, *k, *v;             /* (N,H*D), (N,Hkv*D), (N,Hkv*D); after RoPE for llama */
    act *qr, *kr;               /* model.qk_norm: q and k before their head norms */
    float *q_rstd, *k_rstd;     /* model.qk_norm: (N*H), (N*Hkv) */
    act *att;                   /* (N,H*D) */
    float *lse;                 /* (B,H,T) */
    act *res2;                  /* (N,C) residual after attention */
    act *ln2;                   /* (N,C) */
    float *ln2_mean, *ln2_rstd; /* (N), (N) */
    act *gate, *up, *act;       /* (N,F) each; gate only for llama */
    act *att_o, *mlp_o;         /* model.sandwich_norm: (Nl,C) attention's and the MLP's outputs */
    float *pn1_rstd, *pn2_rstd; /* ... and their post norms' statistics (Nl) */
    mla_acts mla;               /* model.mla */
} layer_acts;

/* Zero-bubble schedules split a layer's backward into B (input gradients, now) and W (weight
 * gradients, later). B keeps the gradient each weight gradient needs at its linear's output. */
typedef struct {
    act *gmlp, *dup, *dgate, *dln2;  /* (N,C) down_proj out, (N,F) up/gate out, (Nl,C) norm 2 */
    act *gatt, *dq, *dk, *dv, *dln1; /* (N,C) o_proj out, q/k/v out, (Nl,C) norm 1 */
    act *dqn, *dkn;                  /* model.qk_norm: the head norms' output gradients */
    act *dpn1, *dpn2;                /* model.sandwich_norm: the post norms' (Nl,C) */
    /* model.mla: kv_b_proj's (N,H*W) and kv_a_layernorm's (N,Rkv) output gradients, q_b_proj's
     * (N,H*D) and q_a_layernorm's (N,Rq), and the down-projections' (N,Rq or H*D), (N,Rkv+R) */
    act *mla_kvb, *mla_kvn, *mla_qb, *mla_qan, *mla_qa, *mla_kva;
} layer_wsave;

/* Zero-bubble's deferred weight gradients: B records, in backward order, what W must do later,
 * and W (model_chunk_weight_grad) runs the list. A linear's job reads its output gradient as B
 * saved it and its input (the half's input gathered again, WG_GATHER, under sp); a norm's reads
 * its saved output gradient and statistics; unit marks bracket each unit's jobs for the hooks. */
typedef enum {
    WG_UNIT_BEGIN, /* hook(unit, BWD_BEGIN) */
    WG_UNIT_END,   /* hook(unit, BWD_END) */
    WG_ACT,        /* selective recompute: rebuild a layer's MLP activation first */
    WG_GATHER,     /* gather x (a half's input, this rank's rows) for the linears after it */
    WG_LINEAR,     /* dw (+ db) += dout^T @ x, x the last gathered input (gathered) or x itself */
    WG_NORM,       /* a norm's weight (and bias) gradient */
    WG_EMBED,      /* the embeddings' gradients from the chunk's input gradient */
    WG_HEADNORM,   /* model.qk_norm: a per-head norm's weight gradient (N rows of C = D) */
    WG_PROJNORM,   /* model.qk_norm_whole: a whole-projection norm's (N = its heads) */
    WG_LATNORM,    /* model.mla: a latent norm's (N rows of C, its width) */
    WG_REP_BEGIN,  /* model.mla under tp: W's gradients of the tp-replicated tensors gather in */
    WG_REP_END,    /* scratch (BEGIN zeroes it), END sums them into layer .unit's over the group */
    WG_MTP_HEAD    /* model.mtp: the whole lm_head's weight gradient of every module */
} wg_kind;

typedef struct {
    wg_kind kind;
    int unit, gathered; /* UNIT marks; LINEAR: x is the last WG_GATHER's */
    /* where the gradients go and (NORM) the weight: the model's pointers to them, read when
     * the job runs, after the unit's hooks have placed them (ZeRO-2/3 working buffers) */
    float **dw, **db;
    float *const *w;
    const act *dout, *x;       /* the saved output gradient; the input */
    const float *mean, *rstd;  /* NORM: its statistics */
    int N, C, OC;              /* LINEAR: dout (N, OC), x (N, C) */
    int vc;                    /* EMBED: vocabulary chunk (-1: the positions; nvc = 0: all) */
    struct layer_acts_s *acts; /* ACT: the layer whose activation is rebuilt */
} wg_job;

typedef struct {
    wg_job *jobs;
    int n, cap;
} wg_list;

/* model.mtp (model_mtp.c): what multi-token prediction module k keeps of one micro-batch; Nl
 * rows of this rank, the block's own layer_acts (its layer index is n_layer + k). Its input
 * embedding Emb(t_{i+k+1}) and that one's gradient travel behind the residual stream in the
 * chunks' boundary tensors (mtp_emb, mtp_demb). */
typedef struct {
    act *en, *hn; /* (Nl,C) enorm(emb), hnorm(h_{k-1}) */
    float *en_rstd, *hn_rstd, *lnf_rstd;
    act *cat, *x, *h;  /* (Nl,2C) [en, hn]; (Nl,C) eh_proj's output, the block's output h_k */
    act *lnf, *logits; /* (Nl,C) shared_head.norm(h_k); (N,Vl) logits, then their gradient */
    layer_acts la;
    moe_acts ma; /* a MoE block's (the model has MoE layers) */
} mtp_acts;

/* What one micro-batch in flight through a chunk keeps between its forward and backward. */
typedef struct {
    act **xs;          /* layers+1 residual tensors (Nl,C): xs[i] is layer lo+i's input */
    layer_acts *la;    /* one set per layer (NULL under full recompute: the shared scratch) */
    layer_wsave *ws;   /* zb only: one per layer */
    wg_list wg;        /* zb only: the weight gradients B left for W */
    moe_acts *ma;      /* MoE layers: one per layer of the chunk (dense layers leave it unset) */
    act *lnf, *logits; /* head chunk: (Nl,C) (N,Vl) */
    float *lnf_mean, *lnf_rstd; /* head chunk: (Nl) (Nl) */
    act *dlnf;                  /* head chunk under zb: the final norm's output gradient (Nl,C) */
    int32_t *tok;               /* embedding chunk: the token ids */
    int32_t *doc;               /* data.doc_mask: where each token's document begins (B,Tl) */
    int32_t doc_min;            /* ... the smallest of them */
    int32_t *udoc;              /* ... under Ulysses cp: those of the tokens attended (B, Tb) */
    int32_t udoc_min;           /* ... the smallest of them */
    /* model.sliding_window, for each window size k (cfg_windows): doc and udoc raised to each
     * token's window start (position - W_k + 1), and their smallest */
    int32_t *wdoc[CFG_MAX_WINDOWS], *uwdoc[CFG_MAX_WINDOWS];
    int32_t wdoc_min[CFG_MAX_WINDOWS], uwdoc_min[CFG_MAX_WINDOWS];
    int32_t *pos;     /* (B,Tl) each token's position (ust_batch.positions) */
    act *dy;          /* (Nl,C): d loss / d chunk output on entry to backward, d / d input after */
    mtp_acts *mtp;    /* model.mtp: one per module (head chunk) */
    int32_t *mtp_tok; /* ... (D,B,Tl) the shifted input tokens (embedding chunk) */
    int mtp_live;     /* ... the modules ran in this micro-batch's forward */
} act_slot;

/* A contiguous run of layers: one pipeline stage (the whole model without pipelining). */
typedef struct {
    int stage, lo, hi; /* global stage; layers [lo, hi) */
    int embed, head;   /* holds the embeddings / the final norm, lm_head and loss */
    int copy;          /* a synced copy of a stage another rank owns (model_stage.copy) */
    int unit0, nunits; /* its units in the rank's unit numbering */
    int mtp_u0;        /* head chunk under model.mtp: module k's unit is mtp_unit's */
    int nslots;
    act_slot *slots;
} model_chunk;

typedef struct {
    float **p, **g; /* where to store the resolved parameter and gradient pointers */
} param_target;

/* The parts of struct model, each filled by the file named above it (model_create_with and
 * params_shape also copy in what model_storage gives); the others read it. */

/* params.c (params_dims, params_local_rows, params_chunks): the dimensions and flags. H, Hkv,
 * F and Vl are this rank's shares under tensor parallelism; Hg, Hkvg, Fg, Vp whole. */
typedef struct {
    int llama, L, C, H, Hkv, D, F, V, Vp, Vl, maxT, B, T, tied;
    int Nl; /* token rows held outside the tensor-parallel halves (B*T, or B*T/tp under sp) */
    int Hg, Hkvg, Fg;
    float eps;
    ust_rope rope;
    int qkv_bias;        /* q/k/v projections have biases (gpt2; llama with model.qkv_bias) */
    int qk_norm;         /* model.qk_norm: RMSNorm over each head's q and k before RoPE */
    int qk_whole;        /* model.qk_norm_whole: ... over the whole q and k projections (OLMo 2) */
    struct {             /* the block's family options (params_dims) */
        int post_norm;   /* model.post_norm: the norms after attention and the MLP (OLMo 2) */
        int sandwich;    /* model.sandwich_norm: norms before and after both (Gemma 3) */
        int norm_offset; /* model.norm_offset: every RMSNorm scales by (1 + w) */
        int geglu;       /* model.hidden_act gelu_tanh: the gated MLP's GELU */
        float embed_scale; /* model.embed_scale: sqrt(C) (0: none) */
        int local_rope;    /* model.rope_local_theta: windowed layers rotate by rope_local */
        ust_rope rope_local;
        float attn_softcap;  /* model.attn_softcap: attention scores c tanh(s / c) (0: none) */
        float final_softcap; /* model.final_softcap: the loss's logits c tanh(x / c) (0: none) */
    } fam;
    int doc_mask;  /* data.doc_mask: attention inside documents */
    int reset_pos; /* data.reset_positions: positions restart at each document */
    ust_recompute recompute;
    int zb;         /* keep what deferred weight gradients (model_chunk_weight_grad) need */
    int tied_local; /* tied embeddings with the embedding and the head on this rank */
    int tied_copy;  /* tied embeddings, head here, embedding on another stage: a synced copy */
} model_shape;

/* model_create_with: the parallel contexts the model computes over. */
typedef struct {
    ust_tp *tp, own_tp; /* tensor parallelism (own_tp: a group of one) */
    ust_cp *cp, own_cp; /* context parallelism (own_cp: a group of one) */
} model_par;

/* params.c: the parameter table, its units and the flat buffers. */
typedef struct {
    model_param *params;
    param_target *targets;
    int *param_unit;
    int nparams, cap;
    int64_t numel, unit_pad;
    int nunits, cur_unit;
    int64_t *unit_off, *unit_len;
    int *unit_expert; /* per unit: holds expert weights (reduced over expert-dp x cp) */
    float *p, *g;     /* whole flat buffers, or NULL when a sharding layer owns the storage */
    ckpt_tensor *all; /* every tensor of the whole model (all stages), checkpoint order */
    int nall;
    int64_t all_numel; /* their elements (a sizes-only list: with the experts it leaves out) */
    int64_t unlisted;  /* building a sizes-only table: elements of the experts repeat stands for */
    double all_expert_mm;    /* the whole list's expert matrices' elements (a run's model) */
    int sizing;              /* the memory plan's model (params_shape): shapes only, no names */
    int listing;             /* building the whole model's list (list_all_tensors): every expert */
    int in_experts;          /* building the table: the current unit holds experts */
    int sub_row0, sub_nrows; /* building: add_param keeps these rows of its slice */
    int copy_chunk;          /* building: the chunk's tensors are replicas (dualpipe) */
} model_table;

/* params.c resolves them (model_set_unit_params/grads); the blocks read them. */
typedef struct {
    layer_w *lw, *lg; /* indexed by global layer; only this rank's layers are set */
    float *wte, *wpe, *lnf_w, *lnf_b, *lm;
    float *g_wte, *g_wpe, *g_lnf_w, *g_lnf_b, *g_lm;
} model_weights;

/* params.c: vocabulary chunks (model_storage.vocab_chunk_rows > 0, ZeRO-3): the token table and
 * the head's matrix (lm_head, or the tied copy) are nvc parameters of vc_rows local rows each
 * (the last may be shorter), row slices of the tensor under its own name, one unit each;
 * the learned positions and the final norm get units of their own. wte/lm stay NULL. */
typedef struct {
    int vc_rows, nvc;
    int wte_u0, lm_u0;        /* units of chunk 0 (-1: not on this rank) */
    float **wte_c, **g_wte_c; /* per chunk: weights and gradients */
    float **lm_c, **g_lm_c;   /* the same arrays as wte_c under tied_local */
} model_vocab;

/* mixture of experts: the MLP of layers moe_layer_is_moe */
typedef struct {
    moe_ctx ctx;
    moe_weights *mw, *mg; /* per global layer (MoE layers only) */
    moe_stats *mstats;    /* per global layer: the last forward's load and losses */
    double *moe_load;     /* per global layer, E each: the step's routed counts (this rank's
                           * micro-batches, then global after model_moe_end_step) */
    double *moe_gload;    /* the last finished step's global counts */
    int has_moe, ep_rank, ep_size;
    double moe_loss; /* weighted aux + z losses of the forwards since the last take */
    float moe_scale; /* each micro-batch's share of the step's MoE loss */
} model_moe;

/* acts.c: the scratch the forward and backward share (acts_alloc). */
typedef struct {
    layer_acts scratch;   /* full recompute: the one set every layer rebuilds into */
    moe_acts moe_scratch; /* full recompute: the one set every MoE layer rebuilds into */
    float *losses;        /* (N) */
    act *dtmp, *dln, *dq, *dk, *dv, *datt, *dgate, *dup, *dact;
    float *dnorm; /* 2C: a norm's weight (and bias) gradient before the sp reduction */
    act *pn_stage, *pn_x,
        *pn_y;      /* model.qk_norm_whole under tp: (N, H*D) whole rows (proj_norm.c) */
    float *pn_sums; /* ... on the CPU: the rows' sums and the weight's gradient (proj_norm.c) */
    float *vc_lse;  /* (4N): the chunked cross-entropy's statistics */
    act *vc_merge, *vc_merge2; /* (N) each: the lse merge's unused outputs */
    int32_t *tgt;
    /* model.mla's scratch: kv_b_proj's output (N, H*(nope+Dv)) in forward and its gradient in
     * backward; the heads' rope parts gathered (N*H, R); d krope (N,R); d of the latents before
     * and after their norms (N, max(Rq, Rkv)) x2; d attv (N,H*Dv); fp32 partial weight
     * gradients of the tp-replicated down-projections and norms (tp > 1) */
    act *mla_kvb, *mla_rope, *mla_dkr, *mla_d1, *mla_d2, *mla_dattv;
    float *mla_dw;
    /* model.norm_offset: ones (max(C, D) floats, fp32) and the scratch each norm's 1 + w is
     * made in just before its op (model_block.c:block_norm_weight) */
    struct {
        float *ones, *wone;
    } noff;
    float *mla_rep[4]; /* zero-bubble's W under tp: mla_dw's parts (wkva, kva_norm, wqa, qa_norm) */
} model_acts;

/* model_mtp.c: multi-token prediction (model.mtp.depth D > 0): each module's weights (its
 * block's are lw/lg[n_layer + k]), the scratch its backward shares, and the cross-entropy sums
 * of the forwards since model_take_mtp_losses. */
typedef struct {
    float *enorm, *hnorm, *eh, *norm; /* enorm, hnorm (C); eh_proj (C, 2C); shared_head.norm */
} mtp_w;

typedef struct {
    int D;
    mtp_w *w, *g;
    act *dh;      /* (Nl,C) d loss / d h_k flowing back from module k + 1 (then d x_last) */
    act *dx;      /* (Nl,C) the block's output gradient, its input gradient after */
    act *dcat;    /* (Nl,2C) */
    float *dw;    /* eh_proj's gradient partial sums under sp (C x 2C) */
    int32_t *tgt; /* (N) a module's targets */
    float *losses;
    double loss[CFG_MAX_MTP];
} model_mtp;

/* model_trace.c: logging.trace's spans of each unit (op group) between its hooks; t is NULL when
 * tracing is off. */
typedef struct {
    struct ust_trace *t;
    char (*names)[48]; /* per unit: the common prefix of its parameters' names */
    double t0[8];      /* the open units' begin times, innermost last */
    int depth;
} model_tracing;

/* model.c: the micro-batch being computed (its slot's copies of the ust_batch). */
typedef struct {
    int32_t *rows;                  /* (B,Tl) its positions (the slot's pos) */
    cp_docs docs;                   /* its documents */
    cp_docs wdocs[CFG_MAX_WINDOWS]; /* model.sliding_window: its documents cut to each query's
                                     * window, one set per window size (cfg_windows) */
    int32_t *whost;                 /* (B,Tl) host scratch for the window starts */
} model_batch;

struct model {
    const ust_config *cfg;
    const ust_ops *ops;
    model_par par;
    model_shape shape;
    model_chunk *chunks; /* params_chunks; acts_alloc gives them their slots */
    int nchunks;
    model_table tab;
    model_weights w;
    model_vocab vc;
    model_moe moe;
    model_acts acts;
    model_batch batch;
    model_hooks hooks;
    model_tracing tracing;
    float *qk_max;      /* model_qk_track's table (NULL: the forwards track no logits) */
    double *act_sq;     /* model_act_track's table (NULL: the forwards add nothing) */
    uint16_t *act_host; /* bf16 activations: one residual tensor copied to the host */
    model_mtp mtp;
};

/* model_stats.c: layer l's output x (this rank's Nl rows) into model_act_track's table. */
void model_act_add(model *m, int l, const act *x);

/* model.mtp: module k's input embedding (Nl,C) behind the residual in a boundary tensor (a
 * chunk's input or output, (1 + D) x Nl x C), and its gradient behind the residual's in dy. */
static inline act *mtp_emb(const model *m, act *boundary, int k) {
    return act_at(m->ops, boundary, (int64_t)(1 + k) * m->shape.Nl * m->shape.C);
}

static inline int is_mla(const model *m) { return m->cfg->model.mla.enabled; }

static inline int is_moe(const model *m, int l) {
    /* model.mtp's blocks (layers n_layer + k) are MoE in a model with MoE layers */
    return m->moe.has_moe && moe_layer_is_moe(m->cfg, l);
}

/* model.mtp: the units each module takes (its block's experts open a second in a MoE model),
 * and module k's first in chunk ch (the head chunk) */
static inline int mtp_units(const model *m) { return 1 + is_moe(m, m->shape.L); }
static inline int mtp_unit(const model *m, const model_chunk *ch, int k) {
    return ch->mtp_u0 + k * mtp_units(m);
}

void model_trace_unit(model *m, int unit, model_phase phase, int after);

/* Calls the sharding layer's hook at a unit boundary (model_hooks); a traced unit's span holds
 * its hooks (a ZeRO-3 gather, a gradient reduction's post). */
static inline void model_hook(model *m, int unit, model_phase phase) {
    if (m->tracing.t) model_trace_unit(m, unit, phase, 0);
    if (m->hooks.unit) m->hooks.unit(m->hooks.ctx, unit, phase);
    if (m->tracing.t) model_trace_unit(m, unit, phase, 1);
}

#endif

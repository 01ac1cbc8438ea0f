/* train_data.c: the trainer's data feed: the datasets, each step's global batch, and this
 * rank's record of a micro-batch (of training or validation): its inputs, targets, positions
 * and document starts (ust_batch), made once here and read by every chunk it passes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "train_internal.h"

static int open_blend(data_blend **b, const ust_config *c, int val, ust_err *e) {
    cfg_dataset sets[CFG_MAX_BLEND];
    int n = cfg_data_sets(c, val, sets);
    return data_blend_open(b, sets, n, c->data.format, c->model.vocab_size, c->train.seq_len, e);
}

/* The shards' meta.json against the model, and the end-of-text id documents end with. */
static int check_meta(trainer *t, ust_err *e) { return data_check_meta(t->cfg, &t->feed.eot, e); }

/* data.packing: first_fit: whole examples packed into the windows (a pure function of the data
 * and these settings, so a sample count in state.json restores the packer exactly). */
static int pack(trainer *t, data_blend *b, const char *which, ust_err *e) {
    const ust_config *c = t->cfg;
    data_pack_stats st;
    if (!b || !c->data.packing) return 0;
    double t0 = log_now_s();
    if (data_blend_pack(b, c->train.seq_len, t->feed.eot, c->data.pack_buffer,
                        c->data.overlong == 1, &st, e))
        return -1;
    if (t->rank0)
        printf("data: %s: %lld examples packed first-fit into %lld windows of %d tokens: padding "
               "%.2f%%, %lld overlong %s (%.2f s)\n",
               which, (long long)st.examples, (long long)st.windows, c->train.seq_len + 1,
               100.0 * (double)st.pad / (double)(st.windows * (c->train.seq_len + 1)),
               (long long)(c->data.overlong == 1 ? st.dropped : st.split),
               c->data.overlong == 1 ? "dropped" : "split", log_now_s() - t0);
    return 0;
}

/* The datasets, and the assignment of the validation samples (the same every time:
 * cfg_val_micro_batches from the blend's start). */
int train_feed_open(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    int64_t G = c->train.global_batch_size,
            V = (int64_t)cfg_val_micro_batches(c) * c->train.micro_batch_size;
    t->feed.which = malloc((size_t)G * sizeof *t->feed.which);
    t->feed.index = malloc((size_t)G * sizeof *t->feed.index);
    UST_ASSERT(t->feed.which && t->feed.index, "out of memory");
    if (open_blend(&t->feed.train, c, 0, e) || check_meta(t, e) ||
        pack(t, t->feed.train, "train", e))
        return -1;
    if (c->data.val[0] && c->data.val_every > 0 && cfg_val_micro_batches(c) > 0) {
        if (open_blend(&t->feed.val, c, 1, e) || pack(t, t->feed.val, "val", e)) return -1;
        t->feed.val_which = malloc((size_t)V * sizeof *t->feed.val_which);
        t->feed.val_index = malloc((size_t)V * sizeof *t->feed.val_index);
        UST_ASSERT(t->feed.val_which && t->feed.val_index, "out of memory");
        data_blend_pos start = {0};
        data_blend_assign(t->feed.val, &start, 0, V, t->feed.val_which, t->feed.val_index);
        t->feed.val_masked = data_blend_has_mask(t->feed.val);
    }
    t->feed.masked = data_blend_has_mask(t->feed.train);
    return 0;
}

/* The target tokens of the step's whole global batch, the loss's denominator. Every rank counts
 * all G windows' flags itself (the assignment is every rank's already), so the number is the same
 * on every rank of every layout and micro-batch split without a collective; a token is a target
 * of input p when the flag of token p + 1 of its window is 1 (2: padding). */
static int64_t count_targets(trainer *t, int64_t *pad) {
    const ust_config *c = t->cfg;
    int64_t G = t->batch_size, T = c->train.seq_len, n = 0;
    *pad = 0;
    if (!t->feed.masked) return G * T;
    for (int64_t k = 0; k < G; k++) {
        data_blend_get_mask(t->feed.train, t->feed.which[k], t->feed.index[k], (int)T,
                            c->data.shuffle, c->run.seed, t->feed.flags);
        for (int64_t p = 0; p < T; p++)
            n += t->feed.flags[p + 1] == 1, *pad += t->feed.flags[p] == 2;
    }
    return n;
}

/* train.seq_len_warmup: the step's sequence length, announced when it changes. */
static void seq_len_at(trainer *t) {
    const ust_config *c = t->cfg;
    int64_t tokens = t->sample_index * c->train.seq_len;
    int L = cfg_seq_len_at(c, tokens);
    if (c->train.seq_len_warmup.start > 0 && L != t->feed.seq_len && t->rank0 && !t->eval)
        printf("seq_len warmup: sequences of %d tokens from step %lld (%lld tokens consumed)\n", L,
               (long long)t->step + 1, (long long)tokens);
    t->feed.seq_len = L;
}

int train_feed_ramp(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    int G = cfg_batch_at(c, t->sample_index * c->train.seq_len);
    if (t->batch_size &&
        G != t->batch_size) { /* the data position moves by another step from here */
        t->batch_since_step = t->step, t->batch_since_sample = t->sample_index;
        if (t->rank0 && !t->eval)
            printf("batch ramp: global batch %d from step %lld (%lld tokens consumed)\n", G,
                   (long long)t->step + 1, (long long)(t->sample_index * c->train.seq_len));
    }
    t->batch_size = G;
    seq_len_at(t);
    return pp_set_micro_batches(t->eng.pp, G / (c->train.micro_batch_size * c->parallel.dp), e);
}

/* The step's global batch: which dataset and sample each of its G samples is (every rank
 * computes all of them and reads its share); a dataset entering a new epoch is logged. */
void train_feed_assign(trainer *t) {
    const ust_config *c = t->cfg;
    int64_t G = t->batch_size;
    data_blend_assign(t->feed.train, &t->feed.pos, t->sample_index, G, t->feed.which,
                      t->feed.index);
    t->feed.step_targets = count_targets(t, &t->feed.step_pad);
    for (int64_t k = 0; k < G && t->rank0; k++) {
        int64_t S = data_blend_epoch_samples(t->feed.train, t->feed.which[k], c->train.seq_len);
        if (t->feed.index[k] > 0 && t->feed.index[k] % S == 0)
            printf("data: dataset %d (%s) starts epoch %lld at step %lld\n", t->feed.which[k],
                   data_blend_set(t->feed.train, t->feed.which[k])->path,
                   (long long)(t->feed.index[k] / S + 1), (long long)t->step + 1);
    }
}

/* Where the document of each of this rank's tokens begins, and its position. data.doc_mask: a
 * document ends with its end-of-text token (which predicts the next document's first), so input
 * t starts a new one when input t-1 is end of text. train.seq_len_warmup: the window is pieces of
 * L tokens, each a sequence of its own (masked apart, positions from 0), so input t's sequence
 * starts at the later of its document's start and its piece's. The positions are the window's,
 * whatever rank holds them. data.reset_positions: each token's position counts from that start;
 * else from its piece's. */
static void find_docs(trainer *t, int L) {
    const ust_config *c = t->cfg;
    int B = c->train.micro_batch_size, T = c->train.seq_len, Tl = t->feed.Tl;
    int docs = c->data.doc_mask || c->data.packing,
        reset = c->data.reset_positions || c->data.packing;
    int pieces = c->train.seq_len_warmup.start > 0, eot = docs || reset ? t->feed.eot : INT32_MIN;
    for (int b = 0; b < B; b++) {
        const int32_t *w = t->feed.samples + (int64_t)b * (T + 1);
        for (int p = 0, start = 0; p < T; p++) {
            int piece = p - p % L;
            t->feed.doc_scratch[p] = start > piece ? start : piece;
            if (w[p] == eot) start = p + 1;
        }
        for (int j = 0; j < Tl; j++) {
            int p = t->feed.layout[j], piece = p - p % L, at = t->feed.doc_scratch[p];
            /* the mask's start; pieces without data.doc_mask mask by the piece alone */
            t->feed.docs[b * Tl + j] = docs || !pieces ? at : piece;
            t->feed.rows[b * Tl + j] -= reset ? at : piece;
        }
    }
}

/* The record of B windows of T+1 tokens: this rank's tokens of each (all of them, or its
 * context-parallel chunks) as inputs, the token after each as its target (-1, not counted, where
 * masked: flags, when given), their positions and document starts; each window as sequences of
 * L tokens (train.seq_len_warmup; L = T: the whole window). */
/* model.mtp.depth D: module k's input at position p is t_{p+k+1} and its target t_{p+k+2}, from
 * the whole window, so the shifted tokens cross the context-parallel chunks' boundaries. Past the
 * window's T + 1 tokens an input is 0 and a target none: no later position has a target then, so
 * the filler gets no gradient. (config_validate refuses it with train.seq_len_warmup: L = T.) */
static void split_mtp(trainer *t, const uint8_t *flags) {
    int B = t->cfg->train.micro_batch_size, T = t->cfg->train.seq_len, Tl = t->feed.Tl;
    int D = t->cfg->model.mtp.depth;
    int32_t *tok = t->feed.mtp, *tgt = t->feed.mtp + (size_t)D * B * Tl;
    for (int k = 0; k < D; k++)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < Tl; j++) {
                int64_t w0 = (int64_t)b * (T + 1), p = t->feed.layout[j];
                int64_t i = ((int64_t)k * B + b) * Tl + j;
                const int32_t *w = t->feed.samples + w0;
                tok[i] = p + k + 1 <= T ? w[p + k + 1] : 0;
                tgt[i] =
                    p + k + 2 <= T && (!flags || flags[w0 + p + k + 2] == 1) ? w[p + k + 2] : -1;
            }
}

static ust_batch *split_windows(trainer *t, const uint8_t *flags, int L) {
    int B = t->cfg->train.micro_batch_size, T = t->cfg->train.seq_len, Tl = t->feed.Tl;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tl; j++) {
            int64_t at = (int64_t)b * (T + 1) + t->feed.layout[j];
            const int32_t *w = t->feed.samples + at;
            t->feed.tokens[b * Tl + j] = w[0];
            t->feed.targets[b * Tl + j] = !flags || flags[at + 1] == 1 ? w[1] : -1;
            t->feed.rows[b * Tl + j] = t->feed.layout[j];
        }
    if (t->feed.docs) find_docs(t, L);
    if (t->feed.mtp) split_mtp(t, flags);
    return &t->feed.batch;
}

/* The batch the feeders hand out: with model.mtp's shifted tokens (training and validation). */
static ust_batch *with_mtp(trainer *t, ust_batch *b) {
    int64_t n = (int64_t)t->cfg->model.mtp.depth * t->cfg->train.micro_batch_size * t->feed.Tl;
    b->mtp_tokens = t->feed.mtp;
    b->mtp_targets = t->feed.mtp ? t->feed.mtp + n : NULL;
    return b;
}

/* The first sample of micro-batch mb of this step on this rank: its data-parallel block of the
 * global batch starts at sample_index + dp_rank * G/dp. */
static int64_t first_sample(trainer *t, int mb) {
    const ust_config *c = t->cfg;
    int64_t G = t->batch_size, dp_rank = t->rt->topo.me.dp;
    return t->sample_index + dp_rank * (G / c->parallel.dp) +
           (int64_t)mb * c->train.micro_batch_size;
}

/* This rank's micro-batch mb of the step (of the validation set): the pipeline executor loads
 * through these. */
const ust_batch *train_feed_train(void *ctx, int mb) {
    trainer *t = ctx;
    const ust_config *c = t->cfg;
    int64_t g = first_sample(t, mb) - t->sample_index; /* in the step's global batch */
    int64_t at = (t->feed.fault_spike_step - 1) * c->train.global_batch_size;
    int poison = t->feed.fault_spike_step > 0 && g == 0 &&
                 (t->feed.fault_spike_on ? t->sample_index >= at : t->sample_index == at);
    int64_t W = c->train.seq_len + 1;
    for (int b = 0; b < c->train.micro_batch_size; b++) {
        data_blend_get(t->feed.train, t->feed.which[g + b], t->feed.index[g + b], c->train.seq_len,
                       c->data.shuffle, c->run.seed, t->feed.samples + b * W);
        if (t->feed.masked)
            data_blend_get_mask(t->feed.train, t->feed.which[g + b], t->feed.index[g + b],
                                c->train.seq_len, c->data.shuffle, c->run.seed,
                                t->feed.flags + b * W);
    }
    ust_batch *batch =
        with_mtp(t, split_windows(t, t->feed.masked ? t->feed.flags : NULL, t->feed.seq_len));
    /* test fault UST_FAULT_SPIKE_STEP=N: the first micro-batch of step N's data (samples from
     * (N-1) x global_batch_size: a rewind moves past them) learns garbage targets */
    for (int k = 0; poison && k < c->train.micro_batch_size * t->feed.Tl; k++)
        if (t->feed.targets[k] >= 0)
            t->feed.targets[k] =
                (int32_t)((t->feed.targets[k] * 7919LL + 13) % c->model.vocab_size);
    return batch;
}

/* eval.tasks' windows: whole, whatever the step's length; a scorer's forward runs no multi-token
 * prediction (the batch carries none). */
const ust_batch *train_feed_windows(trainer *t) {
    ust_batch *b = split_windows(t, t->feed.flags, t->cfg->train.seq_len);
    b->mtp_tokens = b->mtp_targets = NULL;
    return b;
}

const ust_batch *train_feed_val(void *ctx, int mb) {
    trainer *t = ctx;
    const ust_config *c = t->cfg;
    int B = c->train.micro_batch_size;
    int64_t W = c->train.seq_len + 1;
    for (int b = 0; b < B; b++) {
        int64_t k = (int64_t)mb * B + b;
        data_blend_get(t->feed.val, t->feed.val_which[k], t->feed.val_index[k], c->train.seq_len, 0,
                       c->run.seed, t->feed.samples + b * W);
        if (t->feed.val_masked)
            data_blend_get_mask(t->feed.val, t->feed.val_which[k], t->feed.val_index[k],
                                c->train.seq_len, 0, c->run.seed, t->feed.flags + b * W);
    }
    return with_mtp(t,
                    split_windows(t, t->feed.val_masked ? t->feed.flags : NULL, c->train.seq_len));
}

/* This rank's positions of each sequence (all of them, or its context-parallel chunks, as
 * parallel.cp_layout lays them out: the one source of the micro-batches' positions) and the
 * micro-batch record's buffers (document starts for data.doc_mask or reset_positions). */
void train_feed_layout(trainer *t) {
    const ust_config *cfg = t->cfg;
    int cp = cfg->parallel.cp;
    size_t N = (size_t)cfg->train.micro_batch_size * (cfg->train.seq_len / cp);
    train_feed *f = &t->feed;
    f->Tl = cfg->train.seq_len / cp;
    f->seq_len = cfg->train.seq_len; /* train_feed_ramp sets each step's */
    f->layout = malloc(f->Tl * sizeof(int32_t));
    cp_layout_positions(cfg->parallel.cp_layout, cfg->train.seq_len, cp,
                        comm_rank(t->rt->topo.comm[TOPO_CP]), f->layout);
    f->tokens = malloc(N * sizeof(int32_t));
    f->targets = malloc(N * sizeof(int32_t));
    f->rows = malloc(N * sizeof(int32_t));
    f->flags = malloc((size_t)cfg->train.micro_batch_size * (cfg->train.seq_len + 1));
    UST_ASSERT(f->layout && f->tokens && f->targets && f->rows && f->flags, "out of memory");
    if (cfg->data.doc_mask || cfg->data.reset_positions || cfg->data.packing ||
        cfg->train.seq_len_warmup.start > 0) {
        f->docs = malloc(N * sizeof(int32_t));
        f->doc_scratch = malloc((size_t)cfg->train.seq_len * sizeof(int32_t));
        UST_ASSERT(f->docs && f->doc_scratch, "out of memory");
    }
    f->batch = (ust_batch){
        .tokens = f->tokens, .targets = f->targets, .positions = f->rows, .doc_starts = f->docs};
    if (cfg->model.mtp.depth) {
        f->mtp = malloc(2 * cfg->model.mtp.depth * N * sizeof(int32_t));
        UST_ASSERT(f->mtp, "out of memory");
    }
}

void train_feed_close(trainer *t) {
    train_feed *f = &t->feed;
    data_blend_close(f->train);
    data_blend_close(f->val);
    free(f->which), free(f->index), free(f->val_which), free(f->val_index);
    free(f->docs), free(f->doc_scratch), free(f->mtp);
    free(f->samples), free(f->flags);
    free(f->layout), free(f->tokens), free(f->targets), free(f->rows);
}

/* train_task: multiple-choice tasks scored by the model (`ustrain eval --task`, and eval.tasks
 * during training). An item's choices are examples: the context's tokens then the choice's, the
 * choice's tokens its targets, each example alone at the start of a window of T+1 tokens,
 * micro_batch_size windows per micro-batch. An example's log-likelihood is the sum of its target
 * tokens' log-probabilities; acc takes the largest, acc_norm the largest per character of the
 * choice (lm-evaluation-harness's). Any layout gives one process's numbers. */
#ifndef UST_TRAIN_TASK_H
#define UST_TRAIN_TASK_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    int line, nchoices, label;
    int64_t first; /* its first example */
} task_item;

typedef struct {
    task_item *items;
    int n, eot;      /* eot: what each example ends with, and pads its window */
    int32_t *tokens; /* every example's tokens and flags back to back, each ended by eot */
    uint8_t *flags;  /* 1: a target (the choice's tokens) */
    int64_t ntok, nex;
    int64_t *start; /* per example: where its tokens begin (nex + 1 entries) */
    int *targets;   /* per example: its choice's tokens */
    int *chars;     /* per example: its choice's characters */
} task_set;

typedef struct {
    double acc, acc_norm;
    double loglik; /* the mean over items of the right choice's log-likelihood */
} task_scores;

/* From the examples' log-likelihoods: the scores; one JSON line per item ({"line", "label",
 * "loglik": [...], "pred", "pred_norm"}) to out when given. */
task_scores train_task_score(const task_set *s, const double *loglik, FILE *out);

#endif

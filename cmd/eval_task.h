/* eval_task: multiple-choice items for `ustrain eval --task FILE.jsonl`. An item is
 * {"context", "choices": [...], "label"} or llm.c's HellaSwag line {"ctx", "endings", "label"}
 * (each ending scored with a leading space, as llm.c does). Each (item, choice) becomes one
 * example: the context's tokens (cut from the left to fit a window) then the choice's, the
 * choice's tokens its targets; the evaluator scores each alone and these functions turn the
 * per-example mean losses into log-likelihoods, acc (the largest sum) and acc_norm (the largest
 * sum per character of the choice, lm-evaluation-harness's). */
#ifndef UST_EVAL_TASK_H
#define UST_EVAL_TASK_H

#include <stdint.h>

#include "error.h"
#include "tokenizer.h"

typedef struct {
    int line, nchoices, label;
    int64_t first; /* its first example */
} task_item;

typedef struct {
    task_item *items;
    int n;
    int32_t *tokens; /* every example's tokens and flags back to back, each ended by eot */
    uint8_t *flags;
    int64_t ntok, nex;
    int *targets; /* per example: its choice's tokens */
    int *chars;   /* per example: its choice's characters */
} task_set;

/* Reads and tokenizes FILE for windows of T+1 tokens; an item with a label out of range, fewer
 * than two choices, or no context is an error naming file:line. */
int task_load(task_set *s, const char *path, const tok_tokenizer *tok, int eot, int T, ust_err *e);
void task_free(task_set *s);
/* From the examples' mean losses: per-item predictions and the two accuracies; writes one JSON
 * line per item ({"line", "label", "loglik": [...], "pred", "pred_norm"}) to out when given. */
void task_score(const task_set *s, const double *mean, double *acc, double *acc_norm, FILE *out);

#endif

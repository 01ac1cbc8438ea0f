/* eval_task: multiple-choice items for `ustrain eval --task FILE.jsonl`. An item is
 * {"context", "choices": [...], "label"} or llm.c's HellaSwag line {"ctx", "endings", "label"}
 * (each ending scored with a leading space, as llm.c does). Each (item, choice) becomes one
 * example: the context's tokens (cut from the left to fit a window) then the choice's, the
 * choice's tokens its targets (core/train/train_task.h scores them). */
#ifndef UST_EVAL_TASK_H
#define UST_EVAL_TASK_H

#include <stdint.h>

#include "error.h"
#include "config.h"
#include "tokenizer.h"
#include "train_task.h"

/* Reads and tokenizes FILE for windows of T+1 tokens; an item with a label out of range, fewer
 * than two choices, or no context is an error naming file:line. */
int task_load(task_set *s, const char *path, const tok_tokenizer *tok, int eot, int T, ust_err *e);
void task_free(task_set *s);
/* eval.tasks of c for a run of c->train.seq_len: each task's file read with eval.tokenizer (else
 * the tokenizer the training data's meta.json names) into sets[i]; NULL without tasks. An
 * unreadable task or tokenizer is an error naming it. */
int task_load_all(const ust_config *c, task_set **sets, ust_err *e);
void task_free_all(const ust_config *c, task_set *sets);

#endif

/* eval_task: items to examples, and the examples' losses back to scores. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "data.h"
#include "eval_task.h"
#include "fs.h"

static void grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return;
    *cap = 2 * need + 1024;
    *p = realloc(*p, (size_t)*cap * size);
    UST_ASSERT(*p, "out of memory");
}

typedef struct {
    int64_t tok_cap, ex_cap, item_cap, start_cap;
    tok_work *w;
    tok_ids ctx, ch;
} loader;

/* Characters of UTF-8 text: the bytes that do not continue one. */
static int utf8_chars(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* One example: the last context tokens that fit with the choice, then the choice and the end of
 * text; the choice's tokens are the targets. -1 when the choice alone fills the window. */
static int add_example(task_set *s, loader *l, const tok_tokenizer *tok, int eot, int T,
                       const char *choice) {
    l->ch.n = 0;
    tok_encode(tok, l->w, choice, strlen(choice), &l->ch);
    int64_t room = T - l->ch.n; /* T+1 tokens: context, choice, end of text */
    if (room < 1 || l->ch.n < 1) return -1;
    int64_t nc = l->ctx.n < room ? l->ctx.n : room, n = nc + l->ch.n + 1;
    int64_t flag_cap = l->tok_cap; /* both arrays grow together */
    grow((void **)&s->tokens, &l->tok_cap, s->ntok + n, sizeof *s->tokens);
    grow((void **)&s->flags, &flag_cap, s->ntok + n, 1);
    int64_t at = s->ntok;
    memcpy(s->tokens + at, l->ctx.ids + l->ctx.n - nc, (size_t)nc * sizeof(int32_t));
    memcpy(s->tokens + at + nc, l->ch.ids, (size_t)l->ch.n * sizeof(int32_t));
    s->tokens[at + n - 1] = eot;
    for (int64_t i = 0; i < n; i++) s->flags[at + i] = i >= nc && i < n - 1;
    s->ntok += n;
    int64_t cap = l->ex_cap; /* both arrays grow together */
    grow((void **)&s->targets, &cap, s->nex + 1, sizeof *s->targets);
    grow((void **)&s->chars, &l->ex_cap, s->nex + 1, sizeof *s->chars);
    s->targets[s->nex] = (int)l->ch.n;
    s->chars[s->nex++] = utf8_chars(choice);
    grow((void **)&s->start, &l->start_cap, s->nex + 1, sizeof *s->start);
    s->start[s->nex] = s->ntok;
    return 0;
}

static const cJSON *field(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    return v ? v : cJSON_GetObjectItemCaseSensitive(o, b);
}

/* One line's item; the message (without file:line) in why. */
static int add_item(task_set *s, loader *l, const cJSON *o, const tok_tokenizer *tok, int eot,
                    int T, int line, char *why, size_t cap) {
    const cJSON *ctx = field(o, "context", "ctx"), *ch = field(o, "choices", "endings"),
                *lab = cJSON_GetObjectItemCaseSensitive(o, "label");
    bool hellaswag = !cJSON_GetObjectItemCaseSensitive(o, "choices");
    int nch = cJSON_IsArray(ch) ? cJSON_GetArraySize(ch) : 0;
    if (!cJSON_IsString(ctx) || !ctx->valuestring[0])
        return snprintf(why, cap, "no \"context\" (or \"ctx\") string"), -1;
    if (nch < 2)
        return snprintf(why, cap, "%d choices (\"choices\" or \"endings\": at least 2 strings)",
                        nch),
               -1;
    if (!cJSON_IsNumber(lab) || lab->valuedouble != (int)lab->valuedouble || lab->valuedouble < 0 ||
        lab->valuedouble >= nch)
        return snprintf(why, cap, "label %s is not a choice's index (0..%d)",
                        cJSON_IsNumber(lab) ? "out of range" : "missing", nch - 1),
               -1;
    l->ctx.n = 0;
    tok_encode(tok, l->w, ctx->valuestring, strlen(ctx->valuestring), &l->ctx);
    grow((void **)&s->items, &l->item_cap, s->n + 1, sizeof *s->items);
    s->items[s->n] = (task_item){line, nch, (int)lab->valuedouble, s->nex};
    for (int i = 0; i < nch; i++) {
        const cJSON *c = cJSON_GetArrayItem(ch, i);
        if (!cJSON_IsString(c)) return snprintf(why, cap, "choice %d is not a string", i), -1;
        char *text = malloc(strlen(c->valuestring) + 2);
        UST_ASSERT(text, "out of memory");
        sprintf(text, "%s%s", hellaswag ? " " : "", c->valuestring);
        int rc = add_example(s, l, tok, eot, T, text);
        free(text);
        if (rc) return snprintf(why, cap, "choice %d does not fit a window of %d tokens", i, T), -1;
    }
    s->n++;
    return 0;
}

int task_load(task_set *s, const char *path, const tok_tokenizer *tok, int eot, int T, ust_err *e) {
    memset(s, 0, sizeof *s);
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "rb", &inner);
    if (!f) return ust_errf(e, "%s", inner.msg);
    loader l = {.w = tok_work_new(tok)};
    s->eot = eot;
    grow((void **)&s->start, &l.start_cap, 1, sizeof *s->start);
    s->start[0] = 0;
    char *buf = NULL, why[256];
    size_t cap = 0;
    int rc = 0, line = 0;
    for (ssize_t n; rc == 0 && (n = getline(&buf, &cap, f)) >= 0;) {
        line++;
        if (strspn(buf, " \t\r\n") == (size_t)n) continue;
        cJSON *o = cJSON_ParseWithLength(buf, (size_t)n);
        if (!o || !cJSON_IsObject(o))
            rc = ust_errf(e, "%s:%d: not a JSON object", path, line);
        else if (add_item(s, &l, o, tok, eot, T, line, why, sizeof why))
            rc = ust_errf(e, "%s:%d: %s", path, line, why);
        cJSON_Delete(o);
    }
    if (rc == 0 && s->n == 0) rc = ust_errf(e, "%s: no items", path);
    free(buf), free(l.ctx.ids), free(l.ch.ids);
    tok_work_free(l.w);
    fclose(f);
    return rc;
}

void task_free(task_set *s) {
    free(s->items), free(s->tokens), free(s->flags), free(s->targets), free(s->chars);
    free(s->start);
}

/* eval.tokenizer, else the "tokenizer" of the meta.json beside data.train's (first) shards. */
static int task_tokenizer_of(const ust_config *c, tok_tokenizer **tok, ust_err *e) {
    char name[UST_PATH_MAX] = "";
    snprintf(name, sizeof name, "%s", c->eval.tokenizer);
    cfg_dataset sets[CFG_MAX_BLEND];
    if (!name[0] && cfg_data_sets(c, 0, sets) > 0) {
        data_meta meta;
        ust_err inner;
        if (data_meta_read(sets[0].path, &meta, &inner) < 0)
            return ust_errf(e, "eval.tasks: no eval.tokenizer, and data.train's %s", inner.msg);
        snprintf(name, sizeof name, "%s", meta.tokenizer);
    }
    if (!name[0])
        return ust_errf(e, "eval.tasks: no tokenizer: set eval.tokenizer (a tokenizer.json or "
                           "\"bytes\"); data.train's meta.json names none");
    if (!strcmp(name, "bytes")) return *tok = tok_bytes(), 0;
    ust_err inner;
    if (tok_load(tok, name, &inner)) return ust_errf(e, "eval.tokenizer: %s", inner.msg);
    return 0;
}

int task_load_all(const ust_config *c, task_set **sets, ust_err *e) {
    cfg_task t[CFG_MAX_TASKS];
    int n = cfg_eval_tasks(c, t);
    *sets = NULL;
    if (n == 0) return 0;
    tok_tokenizer *tok;
    if (task_tokenizer_of(c, &tok, e)) return -1;
    int eot = tok_eot(tok) >= 0 ? tok_eot(tok) : 0, rc = 0;
    *sets = calloc((size_t)n, sizeof **sets);
    UST_ASSERT(*sets, "out of memory");
    for (int i = 0; i < n && rc == 0; i++) {
        ust_err inner;
        rc = task_load(&(*sets)[i], t[i].path, tok, eot, c->train.seq_len, &inner);
        if (rc) ust_errf(e, "eval.tasks[%d] (%s): %s", i, t[i].name, inner.msg);
    }
    tok_free(tok);
    if (rc) task_free_all(c, *sets), *sets = NULL;
    return rc;
}

void task_free_all(const ust_config *c, task_set *sets) {
    cfg_task t[CFG_MAX_TASKS];
    int n = sets ? cfg_eval_tasks(c, t) : 0;
    for (int i = 0; i < n; i++) task_free(&sets[i]);
    free(sets);
}

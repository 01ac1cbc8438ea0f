/* prep_chat: each template is a list of literal strings around the message contents, written as
 * the family's Jinja template emits them; a turn's target range covers its content and the end
 * token that closes it (what a model learns to write), never the header before it. */
#include "prep_chat.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "config.h"
#include "fs.h"

const char *const CHAT_BUILTINS = "chatml, llama3, mistral, gemma3";

static const char *const NAMES[] = {"none", "auto", "chatml", "llama3", "mistral", "gemma3"};

/* The markers a template's text holds (each must be one added token), and what recognises the
 * family in a Jinja chat_template. */
static const char *const SPECIAL[][5] = {
    {NULL},
    {NULL},
    {"<|im_start|>", "<|im_end|>", NULL},
    {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", NULL},
    {"<s>", "</s>", "[INST]", "[/INST]", NULL},
    {"<bos>", "<start_of_turn>", "<end_of_turn>", NULL},
};
static const char *const MARKER[] = {
    NULL, NULL, "<|im_start|>", "<|start_header_id|>", "[INST]", "<start_of_turn>"};

int chat_kind_parse(const char *name, chat_kind *out) {
    for (int k = CHAT_AUTO; k <= CHAT_GEMMA3; k++)
        if (strcmp(name, NAMES[k]) == 0) {
            *out = (chat_kind)k;
            return 0;
        }
    return -1;
}

const char *chat_kind_name(chat_kind k) { return NAMES[k]; }

int chat_kind_auto(const char *tok_path, chat_kind *out, ust_err *e) {
    if (!tok_path) return ust_errf(e, "data prep: --chat auto needs --tokenizer");
    char path[UST_PATH_MAX + 32];
    const char *slash = strrchr(tok_path, '/');
    snprintf(path, sizeof path, "%.*s/tokenizer_config.json", slash ? (int)(slash - tok_path) : 1,
             slash ? tok_path : ".");
    char *buf = fs_read_file(path, 16 << 20, NULL, e);
    if (!buf) return -1;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    int rc = -1;
    if (!cJSON_IsString(t))
        ust_errf(e, "%s: no chat_template string; name the template with --chat (%s)", path,
                 CHAT_BUILTINS);
    for (int k = CHAT_CHATML; rc && cJSON_IsString(t) && k <= CHAT_GEMMA3; k++)
        if (strstr(t->valuestring, MARKER[k])) *out = (chat_kind)k, rc = 0;
    if (rc && cJSON_IsString(t))
        ust_errf(e,
                 "%s: its chat_template is none of the built-in templates (%s; ustrain has no "
                 "Jinja interpreter): name one with --chat if it renders the same",
                 path, CHAT_BUILTINS);
    cJSON_Delete(j);
    return rc;
}

int chat_check_tokens(chat_kind k, const tok_tokenizer *tok, ust_err *e) {
    tok_work *w = tok_work_new(tok);
    tok_ids ids = {0};
    int rc = 0;
    for (int i = 0; rc == 0 && SPECIAL[k][i]; i++) {
        const char *s = SPECIAL[k][i], *got;
        size_t len;
        ids.n = 0;
        tok_encode(tok, w, s, strlen(s), &ids);
        if (ids.n != 1 || tok_decode(tok, ids.ids[0], &got, &len) || len != strlen(s) ||
            memcmp(got, s, len) != 0)
            rc = ust_errf(e,
                          "data prep: --chat %s needs %s as one token of the tokenizer (it "
                          "encodes to %lld tokens): the template does not match this tokenizer",
                          NAMES[k], s, (long long)ids.n);
    }
    free(ids.ids);
    tok_work_free(w);
    return rc;
}

/* ------------------------------------------------------------------ rendering */

typedef struct {
    char *buf;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n) + 64;
        b->buf = realloc(b->buf, b->cap);
        UST_ASSERT(b->buf, "out of memory (%zu bytes)", b->cap);
    }
    memcpy(b->buf + b->n, s, n);
    b->n += n;
    b->buf[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Jinja's trim: leading and trailing whitespace. */
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && strchr(" \t\n\r\f\v", s[n - 1])) n--;
    while (n && strchr(" \t\n\r\f\v", *s)) s++, n--;
    put(b, s, n);
}

typedef struct {
    const char *role, *content;
} msg;

/* One piece: head (not a target), the content (trimmed or not), then the end token (with the
 * content, a target when this turn is one) and a tail (not a target). */
static void turn(chat_pieces *out, const char *head, const char *content, bool trim,
                 const char *end, const char *tail, bool target) {
    sbuf b = {0};
    puts_(&b, head);
    size_t t0 = b.n;
    trim ? put_trimmed(&b, content) : puts_(&b, content);
    puts_(&b, end);
    size_t t1 = b.n;
    puts_(&b, tail);
    if (out->n == out->cap) {
        out->cap = out->cap ? 2 * out->cap : 16;
        out->p = realloc(out->p, (size_t)out->cap * sizeof *out->p);
        UST_ASSERT(out->p, "out of memory");
    }
    out->p[out->n++] = (chat_piece){b.buf, b.n, target ? t0 : t1, t1};
}

/* Which turns are targets: every assistant turn, or only the last (completion); all marks every
 * byte of every piece afterwards. */
static bool is_target(chat_train_on on, const msg *m, int i, int n) {
    if (strcmp(m[i].role, "assistant") != 0) return false;
    return on != TRAIN_ON_COMPLETION || i == n - 1;
}

static void render_chatml(const msg *m, int n, chat_train_on on, chat_pieces *out) {
    for (int i = 0; i < n; i++) {
        char head[64];
        snprintf(head, sizeof head, "<|im_start|>%s\n", m[i].role);
        turn(out, head, m[i].content, false, "<|im_end|>", "\n", is_target(on, m, i, n));
    }
}

static void render_llama3(const msg *m, int n, chat_train_on on, chat_pieces *out) {
    for (int i = 0; i < n; i++) {
        char head[96];
        snprintf(head, sizeof head, "%s<|start_header_id|>%s<|end_header_id|>\n\n",
                 i == 0 ? "<|begin_of_text|>" : "", m[i].role);
        turn(out, head, m[i].content, true, "<|eot_id|>", "", is_target(on, m, i, n));
    }
}

/* Mistral and Gemma 3: an optional system message first, then user and assistant alternate
 * from a user turn; the system text joins the first user turn. */
static int alternate(const msg *m, int n, int first, char *why, size_t cap) {
    for (int i = first; i < n; i++) {
        const char *want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (strcmp(m[i].role, want) != 0) {
            snprintf(why, cap,
                     "message %d is %s where the template needs %s (after an optional system "
                     "message, user and assistant alternate)",
                     i + 1, m[i].role, want);
            return -1;
        }
    }
    return 0;
}

static void render_mistral(const msg *m, int n, chat_train_on on, chat_pieces *out) {
    int first = strcmp(m[0].role, "system") == 0;
    for (int i = first; i < n; i++) {
        bool lead = i == first;
        if (strcmp(m[i].role, "user") == 0) {
            sbuf h = {0};
            puts_(&h, lead ? "<s> [INST] " : " [INST] ");
            if (lead && first) puts_(&h, m[0].content), puts_(&h, "\n\n");
            turn(out, h.buf, m[i].content, false, " [/INST]", "", false);
            free(h.buf);
        } else {
            turn(out, " ", m[i].content, false, "</s>", "", is_target(on, m, i, n));
        }
    }
}

static void render_gemma3(const msg *m, int n, chat_train_on on, chat_pieces *out) {
    int first = strcmp(m[0].role, "system") == 0;
    for (int i = first; i < n; i++) {
        bool user = strcmp(m[i].role, "user") == 0;
        sbuf h = {0};
        if (i == first) puts_(&h, "<bos>");
        puts_(&h, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == first && first) puts_(&h, m[0].content), puts_(&h, "\n\n");
        turn(out, h.buf, m[i].content, true, "<end_of_turn>", "\n", is_target(on, m, i, n));
        free(h.buf);
    }
}

/* ------------------------------------------------------------------ the JSON line */

/* The messages of the line: "messages", or "prompt"/"completion" as a user and an assistant
 * turn. *n 0 and why set when malformed. */
static msg *read_messages(const cJSON *o, int *n, char *why, size_t cap) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt"),
                *c = cJSON_GetObjectItemCaseSensitive(o, "completion");
    *n = 0;
    if (!ms && cJSON_IsString(p) && cJSON_IsString(c)) {
        msg *m = malloc(2 * sizeof *m);
        UST_ASSERT(m, "out of memory");
        m[0] = (msg){"user", p->valuestring}, m[1] = (msg){"assistant", c->valuestring};
        *n = 2;
        return m;
    }
    if (!cJSON_IsArray(ms)) {
        snprintf(why, cap, "no \"messages\" array (nor \"prompt\" and \"completion\" strings)");
        return NULL;
    }
    int k = cJSON_GetArraySize(ms);
    if (k == 0) {
        snprintf(why, cap, "an empty conversation (\"messages\": [])");
        return NULL;
    }
    msg *m = calloc((size_t)k, sizeof *m);
    UST_ASSERT(m, "out of memory");
    for (int i = 0; i < k; i++) {
        const cJSON *it = cJSON_GetArrayItem(ms, i);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(it, "role"),
                    *t = cJSON_GetObjectItemCaseSensitive(it, "content");
        const char *role = cJSON_IsString(r) ? r->valuestring : "";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            snprintf(why, cap, "message %d: role \"%.40s\" is not system, user or assistant", i + 1,
                     role);
            free(m);
            return NULL;
        }
        if (!cJSON_IsString(t)) {
            snprintf(why, cap, "message %d (%s): content is not a string", i + 1, role);
            free(m);
            return NULL;
        }
        if (i > 0 && strcmp(role, "system") == 0) {
            snprintf(why, cap, "message %d: a system message after the first", i + 1);
            free(m);
            return NULL;
        }
        m[i] = (msg){role, t->valuestring};
    }
    *n = k;
    return m;
}

/* Without a template, "prompt" and "completion" are one text (the completion its target). */
static int render_plain(const msg *m, int n, chat_pieces *out, char *why, size_t cap) {
    if (n != 2 || strcmp(m[1].role, "assistant") != 0) {
        snprintf(why, cap, "\"messages\" need a chat template (--chat %s, or auto)", CHAT_BUILTINS);
        return -1;
    }
    turn(out, m[0].content, m[1].content, false, "", "", true);
    return 0;
}

int chat_render(chat_kind k, chat_train_on on, const void *obj, chat_pieces *out, char *why,
                size_t cap) {
    const cJSON *o = obj;
    int n, first = out->n, rc = 0;
    out->tools = cJSON_GetObjectItemCaseSensitive(o, "tools") != NULL;
    msg *m = read_messages(o, &n, why, cap);
    if (!m) return -1;
    bool system = m[0].role && strcmp(m[0].role, "system") == 0;
    if (k == CHAT_NONE && !cJSON_GetObjectItemCaseSensitive(o, "messages"))
        rc = render_plain(m, n, out, why, cap);
    else if (k == CHAT_NONE)
        rc = render_plain(m, 0, out, why, cap);
    else if ((k == CHAT_MISTRAL || k == CHAT_GEMMA3) && alternate(m, n, system, why, cap))
        rc = -1;
    else if (system && n == 1)
        snprintf(why, cap, "only a system message"), rc = -1;
    else if (k == CHAT_CHATML)
        render_chatml(m, n, on, out);
    else if (k == CHAT_LLAMA3)
        render_llama3(m, n, on, out);
    else if (k == CHAT_MISTRAL)
        render_mistral(m, n, on, out);
    else
        render_gemma3(m, n, on, out);
    bool any = false;
    for (int i = first; rc == 0 && i < out->n; i++) {
        if (on == TRAIN_ON_ALL) out->p[i].t0 = 0, out->p[i].t1 = out->p[i].len;
        any |= out->p[i].t1 > out->p[i].t0;
    }
    if (rc == 0 && !any) {
        snprintf(why, cap, "no assistant turn to train on (--train-on %s)",
                 on == TRAIN_ON_COMPLETION ? "completion" : "assistant");
        rc = -1;
    }
    if (rc) {
        for (int i = first; i < out->n; i++) free(out->p[i].text);
        out->n = first;
    }
    free(m);
    return rc;
}

void chat_pieces_clear(chat_pieces *ps) {
    for (int i = 0; i < ps->n; i++) free(ps->p[i].text);
    ps->n = 0;
}

/* prep_chat: conversations -> template text with target ranges, for `data prep --chat`.
 * A JSON line holds "messages" (role system/user/assistant, content a string; "tools" is ignored)
 * or "prompt"/"completion" strings (one user and one assistant turn). Built-in templates render
 * what the model family's Jinja chat_template renders (tokenized as one text by transformers'
 * apply_chat_template): ChatML (Qwen2/Qwen3), Llama 3, Mistral, Gemma 3; "auto" recognises the
 * family in the chat_template of the tokenizer_config.json beside tokenizer.json (no Jinja).
 * Each message is one piece; its target bytes [t0, t1) are the content and the turn's end token
 * per --train-on. A malformed line is a reason, never an exit: prep counts or refuses it. */
#ifndef UST_PREP_CHAT_H
#define UST_PREP_CHAT_H

#include <stddef.h>

#include "error.h"
#include "tokenizer.h"

typedef enum {
    CHAT_NONE,
    CHAT_AUTO,
    CHAT_CHATML,
    CHAT_LLAMA3,
    CHAT_MISTRAL,
    CHAT_GEMMA3
} chat_kind;
typedef enum { TRAIN_ON_ALL, TRAIN_ON_ASSISTANT, TRAIN_ON_COMPLETION } chat_train_on;

/* The names --chat takes: chatml, llama3, mistral, gemma3, auto. -1 for another. */
int chat_kind_parse(const char *name, chat_kind *out);
const char *chat_kind_name(chat_kind k);
extern const char *const CHAT_BUILTINS; /* "chatml, llama3, mistral, gemma3" */
/* auto: the template whose markers the chat_template string of tokenizer_config.json (in the
 * directory of tok_path) holds; an error naming the file and the built-ins when none. */
int chat_kind_auto(const char *tok_path, chat_kind *out, ust_err *e);
/* The template's special tokens (turn markers, bos/eos) must each be one added token of tok. */
int chat_check_tokens(chat_kind k, const tok_tokenizer *tok, ust_err *e);

typedef struct {
    char *text;
    size_t len, t0, t1; /* bytes [t0, t1) are targets (t0 == t1: none) */
} chat_piece;
typedef struct {
    chat_piece *p;
    int n, cap;
    int tools; /* the line had "tools" (ignored) */
} chat_pieces;

/* Renders one JSON line's object into out (appended; the caller frees each text). 0, or -1 with
 * why (the line's problem: a role not allowed, content not a string, no messages, roles out of
 * the template's order, no target under train_on). */
int chat_render(chat_kind k, chat_train_on on, const void *cjson_obj, chat_pieces *out, char *why,
                size_t cap);
void chat_pieces_clear(chat_pieces *ps);

#endif

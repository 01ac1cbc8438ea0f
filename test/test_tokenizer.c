/* test_tokenizer: the pre-tokenization scanners against the pieces the `tokenizers` library's
 * regex engine (Oniguruma) cuts from tricky strings; BPE merge order, added tokens, unknown bytes
 * and ignore_merges on a hand-written tokenizer.json; safe cuts never change the encoding; bad
 * files are refused with the reason; prep output does not depend on threads or cut size. The
 * token-for-token comparison with `tokenizers` on trained tokenizers is test/sh/data_prep_bpe.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prep.h"
#include "test.h"
#include "tokenizer.h"

static char g_tmp[256];

static void write_file(char *path, size_t n, const char *name, const char *text, size_t len) {
    snprintf(path, n, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, len, f);
    fclose(f);
}

/* Expected pieces: printed by tokenizers 0.23.3, pre_tokenizers.Split(Regex(pattern),
 * "isolated").pre_tokenize_str(s), for s = the first string of each row. */
static const char *const GPT2_CASES[][16] = {
    {"Hello world", "Hello", " world", NULL},
    {"I'm don't THEY'LL we'Ve '\305\277", "I", "'m", " don", "'t", " THEY", "'", "LL", " we", "'",
     "Ve", " '", "\305\277", NULL},
    {"   lead and trail   ", "  ", " lead", " and", " trail", "   ", NULL},
    {"a  \n\n  b\r\n\r\nc", "a", "  \n\n ", " b", "\r\n\r", "\n", "c", NULL},
    {"x\t\ty", "x", "\t", "\t", "y", NULL},
    {"1234567 12 3.5", "1234567", " 12", " 3", ".", "5", NULL},
    {"na\303\257ve caf\303\251 \346\227\245\346\234\254\350\252\236", "na\303\257ve",
     " caf\303\251", " \346\227\245\346\234\254\350\252\236", NULL},
    {"\360\237\221\215\360\237\217\275 emoji!!! ok", "\360\237\221\215\360\237\217\275", " emoji",
     "!!!", " ok", NULL},
    {"'s's ''s", "'s", "'s", " ''", "s", NULL},
    {"line\nnext\n", "line", "\n", "next", "\n", NULL},
    {" \302\240\343\200\200x", " \302\240", "\343\200\200", "x", NULL},
    {"\331\241\331\242\331\243\331\244 \342\205\253 \302\275", "\331\241\331\242\331\243\331\244",
     " \342\205\253", " \302\275", NULL},
    {"e\314\201t\314\201", "e", "\314\201", "t", "\314\201", NULL},
    {"?!\n\nfoo", "?!", "\n", "\n", "foo", NULL},
    {" ?!\n", " ?!", "\n", NULL},
    {"\342\200\250a\302\205b", "\342\200\250", "a", "\302\205", "b", NULL},
    {"x'\305\277a y'Sb\342\200\231s", "x", "'", "\305\277a", " y", "'", "Sb", "\342\200\231", "s",
     NULL},
};
static const char *const LLAMA3_CASES[][16] = {
    {"Hello world", "Hello", " world", NULL},
    {"I'm don't THEY'LL we'Ve '\305\277", "I", "'m", " don", "'t", " THEY", "'LL", " we", "'Ve",
     " '", "\305\277", NULL},
    {"   lead and trail   ", "  ", " lead", " and", " trail", "   ", NULL},
    {"a  \n\n  b\r\n\r\nc", "a", "  \n\n", " ", " b", "\r\n\r\n", "c", NULL},
    {"x\t\ty", "x", "\t", "\ty", NULL},
    {"1234567 12 3.5", "123", "456", "7", " ", "12", " ", "3", ".", "5", NULL},
    {"na\303\257ve caf\303\251 \346\227\245\346\234\254\350\252\236", "na\303\257ve",
     " caf\303\251", " \346\227\245\346\234\254\350\252\236", NULL},
    {"\360\237\221\215\360\237\217\275 emoji!!! ok", "\360\237\221\215\360\237\217\275", " emoji",
     "!!!", " ok", NULL},
    {"'s's ''s", "'s", "'s", " ''", "s", NULL},
    {"line\nnext\n", "line", "\n", "next", "\n", NULL},
    {" \302\240\343\200\200x", " \302\240", "\343\200\200x", NULL},
    {"\331\241\331\242\331\243\331\244 \342\205\253 \302\275", "\331\241\331\242\331\243",
     "\331\244", " ", "\342\205\253", " ", "\302\275", NULL},
    {"e\314\201t\314\201", "e", "\314\201t", "\314\201", NULL},
    {"?!\n\nfoo", "?!\n\n", "foo", NULL},
    {" ?!\n", " ?!\n", NULL},
    {"\342\200\250a\302\205b", "\342\200\250a", "\302\205b", NULL},
    {"x'\305\277a y'Sb\342\200\231s", "x", "'\305\277", "a", " y", "'S", "b", "\342\200\231s",
     NULL},
};

/* Runs the scanner over row[0] and compares every piece with row[1..]. */
static int check_pieces(tok_split kind, const char *const *row, char *why, size_t whyn) {
    const char *s = row[0];
    size_t n = strlen(s), i = 0;
    int k = 1;
    for (; i < n; k++) {
        size_t j = tok_pretok_next(kind, s, n, i);
        if (!row[k] || j <= i || strlen(row[k]) != j - i || memcmp(row[k], s + i, j - i)) {
            snprintf(why, whyn, "string %d piece %d: got '%.*s' (%zu bytes), expected '%s'", 0, k,
                     (int)(j - i), s + i, j - i, row[k] ? row[k] : "(end)");
            return -1;
        }
        i = j;
    }
    if (row[k]) {
        snprintf(why, whyn, "ended early, expected piece '%s'", row[k]);
        return -1;
    }
    return 0;
}

static void test_gpt2_pretokenizer_matches_tokenizers_on_tricky_strings(void) {
    char why[512];
    for (size_t r = 0; r < sizeof GPT2_CASES / sizeof GPT2_CASES[0]; r++)
        CHECK(check_pieces(TOK_SPLIT_GPT2, GPT2_CASES[r], why, sizeof why) == 0, "row %zu: %s", r,
              why);
}

static void test_llama3_pretokenizer_matches_tokenizers_on_tricky_strings(void) {
    char why[512];
    for (size_t r = 0; r < sizeof LLAMA3_CASES / sizeof LLAMA3_CASES[0]; r++)
        CHECK(check_pieces(TOK_SPLIT_LLAMA3, LLAMA3_CASES[r], why, sizeof why) == 0, "row %zu: %s",
              r, why);
}

/* Qwen2's pattern is Llama-3's with single digits. */
static void test_qwen2_pretokenizer_takes_digits_one_by_one(void) {
    static const char *const row[] = {"ab 123x", "ab", " ", "1", "2", "3", "x", NULL};
    char why[512];
    CHECK(check_pieces(TOK_SPLIT_QWEN2, row, why, sizeof why) == 0, "%s", why);
}

/* Bytes that are not UTF-8 (tokenizers refuses such text) count as punctuation, one by one. */
static void test_invalid_utf8_bytes_are_punctuation(void) {
    static const char *const row[] = {"a\377\376b c\300", "a", "\377\376", "b", " c", "\300", NULL};
    char why[512];
    CHECK(check_pieces(TOK_SPLIT_GPT2, row, why, sizeof why) == 0, "%s", why);
}

static void test_unicode_classes_follow_unicode_16(void) {
    struct {
        unsigned cp;
        int cls;
    } c[] = {{'a', 1},
             {'Z', 1},
             {'5', 2},
             {' ', 3},
             {'\t', 3},
             {'_', 0},
             {0x85, 3},
             {0xA0, 3},
             {0x3000, 3},
             {0x2028, 3},
             {0x200B, 0},
             {0x301, 0},
             {0xBD, 2},
             {0x216B, 2},
             {0x661, 2},
             {0x5D0, 1},
             {0x65E5, 1},
             {0x1F44D, 0},
             {0x1C89, 1} /* new in Unicode 16 */,
             {0x10FFFF, 0},
             {0xE000, 0}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        CHECK(tok_unicode_class(c[i].cp) == c[i].cls, "U+%04X: class %d, expected %d", c[i].cp,
              tok_unicode_class(c[i].cp), c[i].cls);
}

/* A GPT-2 style tokenizer.json over the bytes a b c d(missing) space(U+0120 in ByteLevel's
 * alphabet) with merges "b c" (rank 0), "a b" (1), "a bc" (2), and added tokens. */
static const char *TOY_JSON =
    "{\"version\": \"1.0\", \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": "
    "true},"
    " \"added_tokens\": ["
    "  {\"id\": 9, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false,"
    "   \"rstrip\": false, \"normalized\": false, \"special\": true},"
    "  {\"id\": 13, \"content\": \"<x>\", \"single_word\": false, \"lstrip\": %s,"
    "   \"rstrip\": true, \"normalized\": false, \"special\": true},"
    "  {\"id\": 99, \"content\": \"<x>>\", \"single_word\": false, \"lstrip\": false,"
    "   \"rstrip\": false, \"normalized\": false, \"special\": true}],"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"ignore_merges\": %s,"
    "  \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"<\": 4, \">\": 5, \"ab\": 6,"
    "   \"bc\": 7, \"abc\": 8, \"<|endoftext|>\": 9, \"x\": 10, \"cab\": 11, \"ca\": 12},"
    "  \"merges\": [\"b c\", \"a b\", \"a bc\", \"c a\", \"ca b\"]}}";

/* lstrip: whether <x> takes the whitespace before it (which makes documents uncuttable) */
static tok_tokenizer *load_toy(const char *lstrip, const char *ignore_merges, ust_err *e) {
    char json[4096], path[512];
    snprintf(json, sizeof json, TOY_JSON, lstrip, ignore_merges);
    write_file(path, sizeof path, "toy.json", json, strlen(json));
    tok_tokenizer *t = NULL;
    return tok_load(&t, path, e) == 0 ? t : NULL;
}

/* Encodes s and compares with want[] (terminated by -1). */
static int encodes_to(const tok_tokenizer *t, const char *s, const int *want, char *why, size_t n) {
    tok_work *w = tok_work_new(t);
    tok_ids ids = {0};
    tok_encode(t, w, s, strlen(s), &ids);
    int k = 0, bad = 0;
    for (; want[k] >= 0; k++) bad |= k >= ids.n || ids.ids[k] != want[k];
    bad |= ids.n != k;
    int off = snprintf(why, n, "'%s' ->", s);
    for (int64_t i = 0; i < ids.n && off < (int)n; i++)
        off += snprintf(why + off, n - off, " %d", ids.ids[i]);
    free(ids.ids);
    tok_work_free(w);
    return bad ? -1 : 0;
}

static void test_bpe_merges_lowest_rank_first_then_leftmost(void) {
    ust_err e;
    tok_tokenizer *t = load_toy("true", "false", &e);
    CHECK(t, "load: %s", e.msg);
    char why[256];
    struct {
        const char *s;
        int want[8];
    } c[] = {
        {"abc", {8, -1}},       /* b c (rank 0) first, then a bc */
        {"abab", {6, 6, -1}},   /* a b twice, leftmost first */
        {"cab", {2, 6, -1}},    /* a b (rank 1) beats c a (rank 3): never "cab" */
        {"aaa", {0, 0, 0, -1}}, /* no merge */
        {"adb", {6, -1}},       /* d is not in the vocabulary: dropped, a and b then merge */
        {"a b", {0, 3, 1, -1}}, /* " b" is a piece: space then b, no merge across pieces */
        {"ab<|endoftext|>c", {6, 9, 2, -1}},
        {"a  <x>  b", {0, 13, 1, -1}}, /* lstrip/rstrip take the spaces around <x> */
        {"<x>>b", {14, 1, -1}}, /* longest added token wins; its id is the next free one, as in
                                    tokenizers, not the file's 99 */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        CHECK(encodes_to(t, c[i].s, c[i].want, why, sizeof why) == 0, "case %zu: %s", i, why);
    CHECK(tok_eot(t) == 9 && tok_vocab_size(t) == 15, "eot %d vocab %d", tok_eot(t),
          tok_vocab_size(t));
    tok_free(t);
}

/* ignore_merges: a pre-token that is a vocabulary entry is taken whole (Llama-3 sets it). */
static void test_ignore_merges_takes_whole_vocabulary_words(void) {
    ust_err e;
    tok_tokenizer *t = load_toy("true", "true", &e);
    CHECK(t, "load: %s", e.msg);
    char why[256];
    CHECK(encodes_to(t, "cab", (int[]){11, -1}, why, sizeof why) == 0, "%s", why);
    CHECK(encodes_to(t, "caba", (int[]){2, 6, 0, -1}, why, sizeof why) == 0, "%s", why);
    tok_free(t);
}

/* Random text of letters, digits, punctuation, spaces and newlines: wherever tok_safe_cut cuts,
 * the two halves encode to exactly the whole. */
static void test_safe_cuts_never_change_the_encoding(void) {
    ust_err e;
    tok_tokenizer *t = load_toy("false", "false", &e);
    CHECK(t, "load: %s", e.msg);
    const char alphabet[] = "abc ab\n\n .,!x<>'s\t";
    tok_work *w = tok_work_new(t);
    srand(7);
    int cuts = 0;
    for (int trial = 0; trial < 300; trial++) {
        char s[200];
        int n = 20 + rand() % 150;
        for (int i = 0; i < n; i++) s[i] = alphabet[rand() % (sizeof alphabet - 1)];
        tok_ids whole = {0}, parts = {0};
        tok_encode(t, w, s, (size_t)n, &whole);
        size_t p = tok_safe_cut(t, s, (size_t)(n - rand() % 10));
        if (p == 0) {
            free(whole.ids);
            continue;
        }
        cuts++;
        tok_encode(t, w, s, p, &parts);
        tok_encode(t, w, s + p, (size_t)n - p, &parts);
        int same = whole.n == parts.n && !memcmp(whole.ids, parts.ids, (size_t)whole.n * 4);
        free(whole.ids);
        free(parts.ids);
        CHECK(same, "cut at %zu of '%.*s' changes the encoding", p, n, s);
    }
    CHECK(cuts > 50, "only %d cuts found", cuts);
    tok_work_free(w);
    tok_free(t);
}

static void test_unsupported_files_are_refused_with_the_reason(void) {
    struct {
        const char *from, *to, *msg;
    } c[] = {
        {"\"normalizer\": null",
         "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
         "{\"type\": \"Lowercase\"}]}",
         "normalizer.normalizers[1].type 'Lowercase' is not supported"},
        {"{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": "
         "\"Whitespace\"}]}",
         "pre_tokenizer.pretokenizers[1].type 'Whitespace' is not supported"},
        {"\"added_tokens\"", "\"decoder\": {\"type\": \"WordPiece\"}, \"added_tokens\"",
         "decoder.type 'WordPiece' is not supported"},
        {"{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}",
         "Split regex '\\w+' is not supported"},
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type 'WordPiece' is not supported"},
        {"\"ca b\"", "\"ca q\"", "merge 4 ('ca' 'q'): its right part"},
        /* an escaped NUL would cut "BPE\u0000Unigram" to "BPE" (issue 33) */
        {"\"type\": \"BPE\"", "\"type\": \"BPE\\u0000Unigram\"",
         "'type' holds an escaped NUL (\\u0000) in \"BPE\\u0000Unigram\""},
    };
    char base[4096], json[4096], path[512];
    snprintf(base, sizeof base, TOY_JSON, "true", "false");
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char *at = strstr(base, c[i].from);
        CHECK(at, "case %zu: '%s' not in the toy json", i, c[i].from);
        snprintf(json, sizeof json, "%.*s%s%s", (int)(at - base), base, c[i].to,
                 at + strlen(c[i].from));
        write_file(path, sizeof path, "bad.json", json, strlen(json));
        tok_tokenizer *t = NULL;
        ust_err e = {{0}};
        CHECK(tok_load(&t, path, &e) == -1 && strstr(e.msg, c[i].msg), "case %zu: %s", i, e.msg);
    }
}

static int read_all(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int n = (int)fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* The same shards whatever the thread count and however long documents are cut. */
static void test_prep_output_independent_of_threads_and_cuts(void) {
    ust_err e;
    tok_tokenizer *t = load_toy("false", "false", &e);
    CHECK(t, "load: %s", e.msg);
    static char text[20000], a[80000], b[80000];
    srand(11);
    const char alphabet[] = "abc ab\n\n .,!x<>'s";
    for (size_t i = 0; i < sizeof text; i++) text[i] = alphabet[rand() % (sizeof alphabet - 1)];
    char in[512], out[2][512], path[600];
    write_file(in, sizeof in, "doc.txt", text, sizeof text);
    const char *inputs[] = {in};
    int nbytes[2];
    for (int r = 0; r < 2; r++) {
        snprintf(out[r], sizeof out[r], "%s/prep%d", g_tmp, r);
        prep_args p = {.inputs = inputs,
                       .ninputs = 1,
                       .out_dir = out[r],
                       .tok = t,
                       .eot = PREP_EOT_DEFAULT,
                       .threads = r ? 4 : 1,
                       .chunk_bytes = r ? 64 : 1 << 20,
                       .val_fraction = -1};
        prep_result res;
        CHECK(prep_run(&p, &res, &e) == 0, "prep: %s", e.msg);
        snprintf(path, sizeof path, "%s/train_000.bin", out[r]);
        nbytes[r] = read_all(path, r ? b : a, sizeof a);
    }
    CHECK(nbytes[0] > 1024 && nbytes[0] == nbytes[1] && !memcmp(a, b, (size_t)nbytes[0]),
          "shards differ (%d and %d bytes)", nbytes[0], nbytes[1]);
    tok_free(t);
}

/* Concatenated tok_decode of ids: the bytes a tokenizer gives back. */
static size_t decode_all(const tok_tokenizer *t, const tok_ids *ids, char *out, size_t cap) {
    size_t n = 0;
    for (int64_t i = 0; i < ids->n; i++) {
        const char *s;
        size_t len;
        if (tok_decode(t, ids->ids[i], &s, &len) != 0 || n + len > cap) return (size_t)-1;
        memcpy(out + n, s, len);
        n += len;
    }
    return n;
}

static int round_trips(const tok_tokenizer *t, const char *text, size_t len) {
    tok_work *w = tok_work_new(t);
    tok_ids ids = {0};
    tok_encode(t, w, text, len, &ids);
    char back[4096];
    size_t n = decode_all(t, &ids, back, sizeof back);
    free(ids.ids);
    tok_work_free(w);
    return n == len && memcmp(back, text, len) == 0;
}

/* Raw bytes: id b is byte b, end of text (256) decodes to nothing, 257 is no token. */
static void test_bytes_decode_is_the_identity(void) {
    tok_tokenizer *t = tok_bytes();
    char all[256];
    for (int b = 0; b < 256; b++) all[b] = (char)b;
    CHECK(round_trips(t, all, sizeof all), "bytes 0..255 do not round-trip");
    const char *s;
    size_t len;
    CHECK(tok_decode(t, 256, &s, &len) == 0 && len == 0, "end of text decodes to %zu bytes", len);
    CHECK(tok_decode(t, 257, &s, &len) == -1 && tok_decode(t, -1, &s, &len) == -1,
          "ids outside the vocabulary decode");
    tok_free(t);
}

/* The toy tokenizer: merged tokens, the ByteLevel space (U+0120) and added tokens decode back to
 * the text they came from; an id with no token is refused. */
static void test_toy_decode_inverts_encode(void) {
    ust_err e;
    tok_tokenizer *t = load_toy("false", "false", &e);
    CHECK(t, "load: %s", e.msg);
    const char *text[] = {"abc", "cab ab", "a b<|endoftext|>bc", "ab<x>>c", "<x>"};
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++)
        CHECK(round_trips(t, text[i], strlen(text[i])), "'%s' does not round-trip", text[i]);
    const char *s;
    size_t len;
    CHECK(tok_decode(t, 3, &s, &len) == 0 && len == 1 && s[0] == ' ', "U+0120 is not a space");
    CHECK(tok_decode(t, 9, &s, &len) == 0 && len == 13 && !memcmp(s, "<|endoftext|>", 13),
          "the end-of-text token does not decode to its content");
    CHECK(tok_decode(t, 15, &s, &len) == -1, "id 15 (past the vocabulary) decodes");
    tok_free(t);
}

/* A byte-level BPE over every byte (GPT-2's bytes_to_unicode written out here, independently of
 * tokenizer.c) with a few merges: any bytes, multi-byte UTF-8 and invalid sequences included,
 * round-trip. */
static void test_full_byte_level_decode_inverts_encode(void) {
    static char json[65536];
    int off = snprintf(json, sizeof json,
                       "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                       "\"add_prefix_space\": false, \"use_regex\": true}, \"added_tokens\": [], "
                       "\"model\": {\"type\": \"BPE\", \"vocab\": {");
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)extra++;
        off += snprintf(json + off, sizeof json - off, "\"\\u%04x\": %d, ", cp, b);
    }
    off += snprintf(json + off, sizeof json - off,
                    "\"th\": 256, \"\\u0120th\": 257, \"\\u00c3\\u00a9\": 258}, \"merges\": "
                    "[\"t h\", \"\\u0120 th\", \"\\u00c3 \\u00a9\"]}}");
    char path[512];
    write_file(path, sizeof path, "full.json", json, (size_t)off);
    tok_tokenizer *t = NULL;
    ust_err e;
    CHECK(tok_load(&t, path, &e) == 0, "load: %s", e.msg);
    const char *text[] = {"the thin thread", "caf\xc3\xa9 \xe2\x82\xac 100 \xf0\x9f\x98\x80",
                          "\xff\xfe broken \xc3 utf-8 \x80", "\n\t  spaces  \r\n"};
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++)
        CHECK(round_trips(t, text[i], strlen(text[i])), "case %zu does not round-trip", i);
    tok_free(t);
}

/* `test_tokenizer decode TOK.json IN.ids OUT` (test/sh/tok_families.sh): for each document of
 * IN.ids (u32 n, u32 k, n ids) writes u32 len + tok_decode_text of the ids, then u32 len + the
 * tok_decode bytes of ids k.. (what generate prints after a k-token prompt). */
static int decode_tool(const char *tok_path, const char *in, const char *out) {
    tok_tokenizer *t = NULL;
    ust_err e;
    if (tok_load(&t, tok_path, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    FILE *f = fopen(in, "rb"), *g = fopen(out, "wb");
    if (!f || !g) return 2;
    uint32_t hdr[2];
    int32_t *ids = NULL;
    int rc = 0;
    while (!rc && fread(hdr, 4, 2, f) == 2) {
        ids = realloc(ids, (hdr[0] + 1) * sizeof *ids);
        if (fread(ids, 4, hdr[0], f) != hdr[0]) rc = 1;
        size_t len = 0;
        char *text = tok_decode_text(t, ids, hdr[0], &len);
        uint32_t n32 = (uint32_t)len;
        fwrite(&n32, 4, 1, g);
        fwrite(text, 1, len, g);
        free(text);
        tok_ids rest = {.ids = ids + hdr[1], .n = hdr[0] - hdr[1]};
        static char buf[1 << 24];
        size_t m = decode_all(t, &rest, buf, sizeof buf);
        n32 = (uint32_t)m;
        fwrite(&n32, 4, 1, g);
        fwrite(buf, 1, m, g);
        rc |= !text || m == (size_t)-1;
    }
    free(ids);
    fclose(f);
    rc |= fclose(g) != 0;
    tok_free(t);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "decode")) return decode_tool(argv[2], argv[3], argv[4]);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ust_test_tokenizer.XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    RUN_TEST(test_gpt2_pretokenizer_matches_tokenizers_on_tricky_strings);
    RUN_TEST(test_llama3_pretokenizer_matches_tokenizers_on_tricky_strings);
    RUN_TEST(test_qwen2_pretokenizer_takes_digits_one_by_one);
    RUN_TEST(test_invalid_utf8_bytes_are_punctuation);
    RUN_TEST(test_unicode_classes_follow_unicode_16);
    RUN_TEST(test_bpe_merges_lowest_rank_first_then_leftmost);
    RUN_TEST(test_ignore_merges_takes_whole_vocabulary_words);
    RUN_TEST(test_safe_cuts_never_change_the_encoding);
    RUN_TEST(test_unsupported_files_are_refused_with_the_reason);
    RUN_TEST(test_prep_output_independent_of_threads_and_cuts);
    RUN_TEST(test_bytes_decode_is_the_identity);
    RUN_TEST(test_toy_decode_inverts_encode);
    RUN_TEST(test_full_byte_level_decode_inverts_encode);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return TEST_SUMMARY();
}

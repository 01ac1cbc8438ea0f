/* prep: the reader hands out items (a document, or a piece of a long one cut at a safe point),
 * a batch of items is tokenized by the threads, and the main thread appends the batch's ids in
 * item order to a temporary token file under the output directory. Only when the total is known
 * can the stream be split into train and val, so the shards are cut from that file at the end. */
#include "prep.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt.h"
#include "data.h"
#include "fs.h"
#include "prep_chat.h"
#include "prep_input.h"
#include "sha256.h"

enum { BYTE_EOT = 256, MAX_THREADS = 256 };

typedef struct {
    char *text;
    size_t len;
    bool doc_end; /* the end-of-text token follows */
    tok_ids ids;
    size_t t0, t1; /* masked prep: the target bytes; ids [n0, n1) are targets once tokenized */
    int64_t n0, n1;
} item;

/* The input being read: one file at a time, plain text streamed in chunks or JSON lines. */
typedef struct {
    const prep_args *a;
    int file;
    prep_input *in; /* the current input, decompressed */
    FILE *f;        /* its text */
    bool jsonl;
    const char *field;
    int64_t line;
    char *carry; /* plain text read but not yet handed out */
    size_t carry_n, carry_cap;
    char *line_buf;
    size_t line_cap;
    int64_t bytes_done; /* of finished files, for the progress bar */
    bool sys_failed;    /* a read failed for the system's reason (memory, EIO), not the data's */
    chat_pieces pieces; /* masked prep: the line's rendered turns */
    int64_t skipped;    /* masked prep: malformed lines skipped */
    bool warned_tools;
} reader;

typedef struct {
    item *items;
    int n, cap;
    size_t bytes;
} batch;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void batch_add(batch *b, char *text, size_t len, bool doc_end) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->items = realloc(b->items, (size_t)b->cap * sizeof *b->items);
        UST_ASSERT(b->items, "out of memory (%d batch items)", b->cap);
    }
    b->items[b->n++] = (item){.text = text, .len = len, .doc_end = doc_end, .t1 = len};
    b->bytes += len;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    UST_ASSERT(p, "out of memory (%zu bytes)", n);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Adds one in-memory document, cut into pieces of about chunk bytes where the tokenizer allows. */
static void add_document(batch *b, const prep_args *a, const char *s, size_t n) {
    size_t chunk = (size_t)a->chunk_bytes;
    while (n > chunk) {
        size_t cut = 0;
        for (size_t w = chunk; !cut && w < n; w = w * 2 < n ? w * 2 : n)
            cut = tok_safe_cut(a->tok, s, w + 1 <= n ? w + 1 : n);
        if (!cut) break;
        batch_add(b, dup_bytes(s, cut), cut, false);
        s += cut;
        n -= cut;
    }
    batch_add(b, dup_bytes(s, n), n, true);
}

static int open_next(reader *r, ust_err *e) {
    const prep_args *a = r->a;
    const char *path = a->inputs[r->file];
    if (prep_input_open(&r->in, path, a->binary_ok, e)) return -1;
    r->f = prep_input_file(r->in);
    r->jsonl = a->jsonl_field || ends_with(path, ".jsonl") || prep_input_is_jsonl(r->in);
    r->field = a->jsonl_field ? a->jsonl_field : "text";
    if (a->masked && !r->jsonl)
        return ust_errf(e,
                        "%s: --chat and --train-on read JSON lines (\"messages\", or \"prompt\" "
                        "and \"completion\"), and this is not",
                        path);
    r->line = 0;
    r->carry_n = 0;
    return 0;
}

/* A read error of the current input: its decoder's reason (damaged or cut-short gzip/zstd, exit
 * 2), else the system's (out of memory for a long line, EIO: r->sys_failed, exit 1). err is errno
 * as the failed read left it. */
static int read_failed(reader *r, int err, ust_err *e) {
    ust_err why;
    if (prep_input_close(r->in, &why)) {
        r->in = NULL, r->f = NULL;
        return ust_errf(e, "%s", why.msg);
    }
    r->in = NULL, r->f = NULL;
    r->sys_failed = true;
    return ust_errf(e, "%s: read failed at line %lld: %s", r->a->inputs[r->file],
                    (long long)r->line + 1, err ? strerror(err) : "I/O error");
}

static int close_current(reader *r, ust_err *e) {
    r->bytes_done += prep_input_raw_bytes(r->in);
    int rc = prep_input_close(r->in, e);
    r->in = NULL;
    r->f = NULL;
    r->file++;
    return rc;
}

/* Plain text: reads about a chunk more and hands out everything up to the last safe cut; the
 * whole rest (with the end of text) at end of file. Returns 1 at end of file, 0 otherwise. */
static int read_plain(reader *r, batch *b, ust_err *e) {
    size_t chunk = (size_t)r->a->chunk_bytes;
    if (r->carry_cap < r->carry_n + chunk + 1) {
        r->carry_cap = 2 * (r->carry_n + chunk) + 1;
        r->carry = realloc(r->carry, r->carry_cap);
        UST_ASSERT(r->carry, "out of memory (%zu bytes)", r->carry_cap);
    }
    errno = 0;
    size_t got = fread(r->carry + r->carry_n, 1, chunk, r->f);
    r->carry_n += got;
    if (ferror(r->f)) return read_failed(r, errno, e);
    if (got < chunk && feof(r->f)) {
        batch_add(b, dup_bytes(r->carry, r->carry_n), r->carry_n, true);
        r->carry_n = 0;
        return 1;
    }
    size_t cut = tok_safe_cut(r->a->tok, r->carry, r->carry_n);
    if (cut) {
        batch_add(b, dup_bytes(r->carry, cut), cut, false);
        memmove(r->carry, r->carry + cut, r->carry_n - cut);
        r->carry_n -= cut;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * JSON strings with their length (cJSON's valuestring ends at an escaped NUL). The line is valid
 * JSON (cJSON parsed it first), so the scanner only has to find its way, not judge. */

static const char *json_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
    return p;
}

static unsigned json_hex4(const char *p, const char *end) {
    unsigned v = 0;
    for (int i = 0; i < 4 && p + i < end; i++) {
        char c = p[i];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static size_t utf8_put(char *out, unsigned cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 63));
        return out[2] = (char)(0x80 | (cp & 63)), 3;
    }
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 63));
    out[2] = (char)(0x80 | ((cp >> 6) & 63)), out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* The \u escape at p (past the "\u"): its code point, a surrogate pair joined; *p moves on. */
static unsigned json_u_escape(const char **p, const char *end) {
    unsigned cp = json_hex4(*p, end);
    *p += 4;
    if (cp >= 0xD800 && cp < 0xDC00 && *p + 6 <= end && (*p)[0] == '\\' && (*p)[1] == 'u') {
        unsigned lo = json_hex4(*p + 2, end);
        if (lo >= 0xDC00 && lo < 0xE000) {
            *p += 6;
            return 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
    }
    return cp >= 0xD800 && cp < 0xE000 ? 0xFFFD : cp;
}

/* Decodes the string whose opening quote is at p into out (room for end - p bytes); returns the
 * position past its closing quote and sets *len. */
static const char *json_string(const char *p, const char *end, char *out, size_t *len) {
    size_t k = 0;
    for (p++; p < end && *p != '"';) {
        if (*p != '\\') {
            out[k++] = *p++;
            continue;
        }
        char c = p + 1 < end ? p[1] : 0;
        p += 2;
        if (c == 'u') {
            k += utf8_put(out + k, json_u_escape(&p, end));
            continue;
        }
        out[k++] = c == 'b'   ? '\b'
                   : c == 'f' ? '\f'
                   : c == 'n' ? '\n'
                   : c == 'r' ? '\r'
                   : c == 't' ? '\t'
                              : c;
    }
    *len = k;
    return p < end ? p + 1 : end;
}

/* Skips one value (string, number, literal, object or array) at p. */
static const char *json_skip(const char *p, const char *end) {
    int depth = 0;
    do {
        if (*p == '"') {
            for (p++; p < end && *p != '"'; p++)
                if (*p == '\\') p++;
        } else if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            depth--;
        } else if (depth == 0) {
            while (p + 1 < end && !strchr(",}] \t\r\n", p[1])) p++;
        }
        p++;
    } while (p < end && depth > 0);
    return p;
}

/* The string value of the top-level key field (the first such key, as cJSON reads it) into a new
 * buffer *text of *len bytes; -1 when there is none, or it is not a string. */
static int json_field_text(const char *line, size_t n, const char *field, char **text,
                           size_t *len) {
    const char *p = json_ws(line, line + n), *end = line + n;
    char *buf = malloc(n + 1);
    UST_ASSERT(buf, "out of memory (%zu bytes)", n);
    if (p < end && *p == '{') p++;
    for (p = json_ws(p, end); p < end && *p == '"'; p = json_ws(p, end)) {
        size_t klen;
        p = json_ws(json_string(p, end, buf, &klen), end);
        bool match = klen == strlen(field) && memcmp(buf, field, klen) == 0;
        p = json_ws(p + 1, end); /* past the ':' */
        if (match && p < end && *p == '"') {
            json_string(p, end, buf, len);
            buf[*len] = 0;
            *text = buf;
            return 0;
        }
        if (match || p >= end) break;
        p = json_ws(json_skip(p, end), end);
        if (p < end && *p == ',') p++;
        p = json_ws(p, end);
    }
    free(buf);
    return -1;
}

/* Masked prep: the line's conversation as one item per turn with its target bytes, the last
 * ending the document. A malformed line is an error under --strict, else counted and named
 * (the first 20) and skipped. */
static int add_conversation(reader *r, batch *b, const cJSON *o, ust_err *e) {
    const char *path = r->a->inputs[r->file];
    char why[256];
    if (chat_render((chat_kind)r->a->chat, (chat_train_on)r->a->train_on, o, &r->pieces, why,
                    sizeof why)) {
        if (r->a->strict)
            return ust_errf(e, "%s:%lld: %s (--strict)", path, (long long)r->line, why);
        if (r->skipped++ < 20)
            fprintf(stderr, "ustrain: warning: %s:%lld: %s; line skipped\n", path,
                    (long long)r->line, why);
        return 0;
    }
    if (r->pieces.tools && !r->warned_tools) {
        r->warned_tools = true;
        fprintf(stderr,
                "ustrain: warning: %s:%lld: \"tools\" are ignored (the templates render "
                "messages only)\n",
                path, (long long)r->line);
    }
    for (int i = 0; i < r->pieces.n; i++) {
        chat_piece *p = &r->pieces.p[i];
        batch_add(b, p->text, p->len, i == r->pieces.n - 1);
        b->items[b->n - 1].t0 = p->t0, b->items[b->n - 1].t1 = p->t1;
    }
    r->pieces.n = 0; /* the texts now belong to the batch */
    return 0;
}

/* JSON lines: one document per non-blank line. Returns 1 at end of file, 0 otherwise. */
static int read_jsonl(reader *r, batch *b, ust_err *e) {
    const char *path = r->a->inputs[r->file];
    errno = 0;
    ssize_t n = getline(&r->line_buf, &r->line_cap, r->f);
    if (n < 0) { /* getline's ENOMEM sets neither flag: only feof means the end */
        if (ferror(r->f) || !feof(r->f)) return read_failed(r, errno, e);
        return 1;
    }
    r->line++;
    if (strspn(r->line_buf, " \t\r\n") == (size_t)n) return 0;
    cJSON *o = cJSON_ParseWithLength(r->line_buf, (size_t)n);
    if (!o) return ust_errf(e, "%s:%lld: not valid JSON", path, (long long)r->line);
    if (r->a->masked) {
        int rc = add_conversation(r, b, o, e);
        cJSON_Delete(o);
        return rc;
    }
    cJSON_Delete(o); /* valid: the field is read with its length (an escaped NUL is a byte) */
    char *text = NULL;
    size_t len = 0;
    if (json_field_text(r->line_buf, (size_t)n, r->field, &text, &len))
        return ust_errf(e, "%s:%lld: no string field \"%s\" (choose the field with --jsonl-field)",
                        path, (long long)r->line, r->field);
    add_document(b, r->a, text, len);
    free(text);
    return 0;
}

/* Fills b with at least `want` bytes of items unless the inputs run out. Returns 1 when they
 * have, 0 when there is more, -1 on error. */
static int fill_batch(reader *r, batch *b, size_t want, ust_err *e) {
    while (b->bytes < want) {
        if (!r->f) {
            if (r->file == r->a->ninputs) return 1;
            if (open_next(r, e)) return -1;
        }
        int rc = r->jsonl ? read_jsonl(r, b, e) : read_plain(r, b, e);
        if (rc < 0) return -1;
        if (rc == 1 && close_current(r, e)) return -1;
        if (r->jsonl && b->n > 4096) break; /* many short documents: keep batches small */
    }
    return r->file == r->a->ninputs && !r->f;
}

/* ---------------------------------------------------------------------------------------------
 * Threads: each takes the next untaken item of the batch. */

typedef struct {
    const tok_tokenizer *tok;
    tok_work *work;
    batch *b;
    atomic_int *next;
} worker;

/* How many leading ids of the whole text's encoding the encoding of its first `at` bytes shares:
 * a token that straddles `at` is the first one not shared. */
static int64_t shared_prefix(worker *w, const item *it, size_t at, tok_ids *scratch) {
    if (at == 0) return 0;
    if (at == it->len) return it->ids.n;
    scratch->n = 0;
    tok_encode(w->tok, w->work, it->text, at, scratch);
    int64_t k = 0;
    while (k < scratch->n && k < it->ids.n && scratch->ids[k] == it->ids.ids[k]) k++;
    return k;
}

/* Targets [n0, n1): the tokens from the one holding byte t0 (a token straddling the start of the
 * content counts as the content's) to the last that ends by t1. */
static void *work_loop(void *arg) {
    worker *w = arg;
    tok_ids scratch = {0};
    for (int i; (i = atomic_fetch_add(w->next, 1)) < w->b->n;) {
        item *it = &w->b->items[i];
        it->ids.n = 0;
        tok_encode(w->tok, w->work, it->text, it->len, &it->ids);
        it->n0 = it->n1 = 0;
        if (it->t1 > it->t0) {
            it->n0 = shared_prefix(w, it, it->t0, &scratch);
            it->n1 = shared_prefix(w, it, it->t1, &scratch);
        }
    }
    free(scratch.ids);
    return NULL;
}

static void tokenize_batch(const tok_tokenizer *tok, tok_work **works, int nthreads, batch *b) {
    atomic_int next = 0;
    worker w[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int t = 0; t < nthreads; t++) w[t] = (worker){tok, works[t], b, &next};
    /* a thread that cannot start leaves its share to the others */
    for (int t = 1; t < nthreads && t < b->n; t++)
        started[t] = pthread_create(&th[t], NULL, work_loop, &w[t]) == 0;
    work_loop(&w[0]);
    for (int t = 1; t < nthreads; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Output: the temporary token stream, then the shards cut from it. */

typedef struct {
    FILE *f;
    char path[UST_PATH_MAX + 64];
    int width;
    int64_t n;
    unsigned char buf[1 << 16];
    size_t fill;
    FILE *mf; /* masked prep: a byte per token, 1 for a target (the shards get its bits) */
    char mpath[UST_PATH_MAX + 64];
    unsigned char mbuf[1 << 16];
    size_t mfill;
    int64_t targets;
    int eot_target;    /* the separator's flag: 1 only with --train-on all */
    bool write_failed; /* the failure is the output's (a full disk), not the input's */
    bool read_failed;  /* an input could not be read for the system's reason (memory, EIO) */
} stream;

static int stream_flush(stream *s, ust_err *e) {
    if ((s->fill && fwrite(s->buf, 1, s->fill, s->f) != s->fill) ||
        (s->mfill && fwrite(s->mbuf, 1, s->mfill, s->mf) != s->mfill)) {
        s->write_failed = true;
        return ust_errf(e, "%s: write failed: %s", s->path, strerror(errno));
    }
    s->fill = s->mfill = 0;
    return 0;
}

static int stream_put(stream *s, int32_t id, int target, ust_err *e) {
    if ((s->fill + 4 > sizeof s->buf || s->mfill == sizeof s->mbuf) && stream_flush(s, e))
        return -1;
    if (s->mf) s->mbuf[s->mfill++] = (unsigned char)target, s->targets += target;
    if (s->width == 2) {
        uint16_t v = (uint16_t)id;
        memcpy(s->buf + s->fill, &v, 2);
    } else {
        memcpy(s->buf + s->fill, &id, 4); /* little-endian host, as the reader */
    }
    s->fill += (size_t)s->width;
    s->n++;
    return 0;
}

static int write_batch(stream *s, batch *b, int eot, int vocab, ust_err *e) {
    for (int i = 0; i < b->n; i++) {
        item *it = &b->items[i];
        for (int64_t k = 0; k < it->ids.n; k++) {
            UST_ASSERT(it->ids.ids[k] >= 0 && it->ids.ids[k] < vocab, "token %d outside vocab %d",
                       it->ids.ids[k], vocab);
            if (stream_put(s, it->ids.ids[k], k >= it->n0 && k < it->n1, e)) return -1;
        }
        /* the separator is no target of a conversation: nothing follows its last turn */
        if (it->doc_end && eot >= 0 && stream_put(s, eot, s->eot_target, e)) return -1;
    }
    return 0;
}

/* Shard k of a split: its name, and the temporary it is written under until every shard of both
 * splits is complete (then all are renamed, so a failure or a kill leaves the directory's earlier
 * shards as they were, and a symlink or FIFO planted at a shard's name is replaced, never
 * followed). */
static void shard_path(char *out, size_t n, const char *dir, const char *split, int k, int tmp) {
    if (tmp)
        snprintf(out, n, "%s/.%s_%03d.bin.tmp.%d", dir, split, k, (int)getpid());
    else
        snprintf(out, n, "%s/%s_%03d.bin", dir, split, k);
}

/* A new regular file for writing: whatever was at path (a stale temporary) is removed first and
 * O_EXCL makes sure nothing is followed. */
static FILE *create_new(const char *path, ust_err *e) {
    unlink(path);
    int fd = fs_open_regular(path, O_RDWR | O_CREAT | O_EXCL, 0666, e);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w+b");
    if (fd >= 0 && !f) {
        ust_errf(e, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* The target bits of tokens [first, first + m) after a shard's tokens: flags read in chunks of a
 * multiple of 8, so each chunk's packed bytes continue the last's. */
static int write_mask(stream *s, int64_t first, int64_t m, FILE *out) {
    _Static_assert(sizeof(((stream *)0)->mbuf) % 64 == 0, "whole bytes of bits per chunk");
    if (fseeko(s->mf, (off_t)first, SEEK_SET) != 0) return -1;
    unsigned char bits[sizeof s->mbuf / 8];
    for (int64_t left = m; left > 0;) {
        size_t k = left < (int64_t)sizeof s->mbuf ? (size_t)left : sizeof s->mbuf;
        if (fread(s->mbuf, 1, k, s->mf) != k) return -1;
        data_pack_mask(s->mbuf, (int64_t)k, bits);
        if (fwrite(bits, 1, (k + 7) / 8, out) != (k + 7) / 8) return -1;
        left -= (int64_t)k;
    }
    return 0;
}

/* Writes tokens [first, first+n) of the stream as the temporaries of SPLIT_000.bin, ... of
 * per_shard tokens; *nshards counts those begun (for out_discard). */
static int write_split(stream *s, const char *dir, const char *split, int64_t first, int64_t n,
                       int64_t per_shard, int *nshards, ust_err *e) {
    _Static_assert(sizeof(((stream *)0)->buf) % 4 == 0, "whole tokens per copy");
    if (fseeko(s->f, (off_t)(first * s->width), SEEK_SET) != 0)
        return ust_errf(e, "%s: seek failed: %s", s->path, strerror(errno));
    *nshards = 0;
    for (int64_t done = 0; done < n;) {
        int64_t m = n - done < per_shard ? n - done : per_shard;
        char path[UST_PATH_MAX + 64], tmp[UST_PATH_MAX + 64];
        shard_path(path, sizeof path, dir, split, *nshards, 0);
        shard_path(tmp, sizeof tmp, dir, split, *nshards, 1);
        int32_t hdr[256];
        if ((s->mf ? data_llmc_header_mask : data_llmc_header)(hdr, s->width, m, path, e))
            return -1;
        FILE *out = create_new(tmp, e);
        if (!out) return -1;
        (*nshards)++;
        int rc = fwrite(hdr, sizeof hdr, 1, out) == 1 ? 0 : -1;
        for (int64_t left = m * s->width; rc == 0 && left > 0;) {
            size_t k = left < (int64_t)sizeof s->buf ? (size_t)left : sizeof s->buf;
            rc = fread(s->buf, 1, k, s->f) == k && fwrite(s->buf, 1, k, out) == k ? 0 : -1;
            left -= (int64_t)k;
        }
        if (rc == 0 && s->mf) rc = write_mask(s, first + done, m, out);
        if (fflush(out) != 0 || fsync(fileno(out)) != 0) rc = -1;
        if (fclose(out) != 0) rc = -1;
        if (rc) return ust_errf(e, "%s: write failed: %s", tmp, strerror(errno));
        done += m;
    }
    return 0;
}

/* Publishes a split's nshards temporaries under their names, then removes the shards of an
 * earlier, longer run in the same directory (they would join this one's glob). */
static int publish_split(const char *dir, const char *split, int nshards, ust_err *e) {
    char path[UST_PATH_MAX + 64], tmp[UST_PATH_MAX + 64];
    for (int k = 0; k < nshards; k++) {
        shard_path(path, sizeof path, dir, split, k, 0);
        shard_path(tmp, sizeof tmp, dir, split, k, 1);
        if (rename(tmp, path) != 0)
            return ust_errf(e, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    }
    for (int k = nshards;; k++) {
        shard_path(path, sizeof path, dir, split, k, 0);
        if (unlink(path) != 0) break;
    }
    return 0;
}

static void discard_split(const char *dir, const char *split, int nshards) {
    char tmp[UST_PATH_MAX + 64];
    for (int k = 0; k < nshards; k++) {
        shard_path(tmp, sizeof tmp, dir, split, k, 1);
        unlink(tmp);
    }
}

/* The last frac of the stream goes to val (at least one token when frac > 0 so the val glob
 * matches), and with enough data (val still at most a quarter) a whole shard, as in llm.c's data
 * sets, so val loss is not measured on a sliver; train keeps at least one input/target pair. */
enum {
    PREP_MAX_SHARDS = 100000
}; /* shard names have 3+ digits; a directory of more is a mistake */
static int split_sizes(int64_t total, double frac, int64_t per_shard, int64_t *nval, ust_err *e) {
    *nval = (int64_t)(frac * (double)total + 0.5);
    if (frac > 0 && *nval < 1) *nval = 1;
    if (frac > 0 && *nval < per_shard && total >= 4 * per_shard) *nval = per_shard;
    if (total - *nval < 2)
        return ust_errf(e, "data prep: %lld tokens are too few to split into train and val",
                        (long long)total);
    int64_t files =
        (total - *nval + per_shard - 1) / per_shard + (*nval + per_shard - 1) / per_shard;
    if (files > PREP_MAX_SHARDS)
        return ust_errf(e,
                        "data prep: --shard-tokens %lld cuts %lld tokens into %lld files, more "
                        "than %d (give a larger --shard-tokens)",
                        (long long)per_shard, (long long)total, (long long)files, PREP_MAX_SHARDS);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Progress */

/* Bytes of the input files (compressed as they are), or -1 when standard input is among them. */
static int64_t input_bytes(const prep_args *a) {
    int64_t total = 0;
    for (int i = 0; i < a->ninputs; i++) {
        struct stat st;
        if (strcmp(a->inputs[i], "-") == 0) return -1;
        if (stat(a->inputs[i], &st) == 0) total += st.st_size;
    }
    return total;
}

static void progress(const reader *r, int64_t ntok, double t0, bool done) {
    int64_t total = input_bytes(r->a);
    int64_t at = r->bytes_done + (r->in ? prep_input_raw_bytes(r->in) : 0);
    if (total >= 0 && at > total) at = total;
    double dt = log_now_s() - t0, rate = dt > 0 ? (double)at / dt : 0;
    char where[96];
    if (total >= 0) {
        double frac = total > 0 ? (double)at / (double)total : 1;
        char bar[31];
        int k = (int)(30 * frac);
        for (int i = 0; i < 30; i++) bar[i] = i < k ? '#' : '.';
        bar[30] = 0;
        int eta = rate > 0 ? (int)((double)(total - at) / rate + 0.5) : 0;
        snprintf(where, sizeof where, "[%s] %3.0f%%  %.1f/%.1f MB  ETA %dm%02ds", bar, 100 * frac,
                 (double)at / 1e6, (double)total / 1e6, eta / 60, eta % 60);
    } else {
        snprintf(where, sizeof where, "%.1f MB", (double)at / 1e6);
    }
    fprintf(stderr, "\rdata prep %s  %.1f MB/s  %lld tokens  %.2fM tokens/s%s", where, rate / 1e6,
            (long long)ntok, dt > 0 ? (double)ntok / dt / 1e6 : 0.0, done ? "\n" : "");
}

/* ---------------------------------------------------------------------------------------------
 * The run */

static int check_inputs(const prep_args *a, int64_t *bytes, ust_err *e) {
    if (a->ninputs < 1) return ust_errf(e, "data prep: no input files");
    *bytes = 0;
    int stdin_uses = 0;
    for (int i = 0; i < a->ninputs; i++) {
        struct stat st;
        if (strcmp(a->inputs[i], "-") == 0) { /* standard input: a pipe, of unknown size */
            if (++stdin_uses > 1) return ust_errf(e, "data prep: \"-\" (standard input) twice");
            continue;
        }
        if (stat(a->inputs[i], &st) != 0)
            return ust_errf(e, "%s: cannot read: %s", a->inputs[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return ust_errf(e, "%s: not a regular file", a->inputs[i]);
        *bytes += st.st_size;
    }
    return 0;
}

static int resolve_eot(const prep_args *a, const tok_tokenizer *tok, int *eot, ust_err *e) {
    *eot = a->eot == PREP_EOT_DEFAULT ? tok_eot(tok) : a->eot;
    if (a->eot == PREP_EOT_DEFAULT && *eot < 0)
        return ust_errf(e, "data prep: the tokenizer has no <|endoftext|> or <|end_of_text|> "
                           "token; give the end-of-text id with --eot ID (or --eot none)");
    return 0;
}

/* --chat auto: the template tokenizer_config.json's chat_template names; a template's special
 * tokens must be the tokenizer's. */
static int resolve_chat(const prep_args *a, prep_args *args, ust_err *e) {
    if (a->chat == CHAT_NONE) return 0;
    if (!a->tok) return ust_errf(e, "data prep: --chat needs --tokenizer");
    chat_kind k = (chat_kind)a->chat;
    if (k == CHAT_AUTO && chat_kind_auto(a->tok_path, &k, e)) return -1;
    args->chat = (int)k;
    return chat_check_tokens(k, a->tok, e);
}

/* Tokenizes every input into the stream s; r gets the document and token counts. */
static int tokenize_all(const prep_args *a, const tok_tokenizer *tok, int nthreads, stream *s,
                        int eot, int vocab, prep_result *res, ust_err *e) {
    reader rd = {.a = a};
    tok_work *works[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) works[t] = tok_work_new(tok);
    batch b = {0};
    size_t want = (size_t)a->chunk_bytes * (size_t)(2 * nthreads);
    double t0 = log_now_s(), last = 0;
    int rc = 0, end = 0;
    while (rc == 0 && !end) {
        end = fill_batch(&rd, &b, want, e);
        if (end < 0) rc = -1;
        if (rc == 0) tokenize_batch(tok, works, nthreads, &b);
        if (rc == 0) rc = write_batch(s, &b, eot, vocab, e);
        for (int i = 0; i < b.n; i++) {
            res->ndocs += b.items[i].doc_end;
            free(b.items[i].text);
            free(b.items[i].ids.ids);
        }
        b.n = 0;
        b.bytes = 0;
        if (rc == 0 && a->progress && (log_now_s() - last > 0.2 || end)) {
            progress(&rd, s->n, t0, end && rc == 0);
            last = log_now_s();
        }
    }
    /* the bytes read, counted as they come: standard input has no size to stat */
    if (rc == 0) res->nbytes = rd.bytes_done;
    res->skipped = rd.skipped;
    chat_pieces_clear(&rd.pieces);
    free(rd.pieces.p);
    if (rd.in) {
        ust_err ignored; /* the error that stopped the loop is already in e */
        prep_input_close(rd.in, rc ? &ignored : e);
    }
    s->read_failed = rd.sys_failed;
    for (int t = 0; t < nthreads; t++) tok_work_free(works[t]);
    free(b.items);
    free(rd.carry);
    free(rd.line_buf);
    return rc;
}

static int threads_to_use(const prep_args *a) {
    int n = a->threads > 0 ? a->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

int prep_run(const prep_args *a, prep_result *res, ust_err *e) {
    prep_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    double t0 = log_now_s(), frac = a->val_fraction > 0 ? a->val_fraction : 0;
    if (frac >= 1) {
        ust_errf(e, "data prep: val_fraction must be below 1 (got %g)", frac);
        return UST_EXIT_USAGE;
    }
    int64_t per_shard = a->shard_tokens > 0 ? a->shard_tokens : 100000000;
    if (per_shard > INT32_MAX) per_shard = INT32_MAX;
    if (check_inputs(a, &res->nbytes, e)) return UST_EXIT_USAGE;
    tok_tokenizer *own = a->tok ? NULL : tok_bytes();
    const tok_tokenizer *tok = a->tok ? a->tok : own;
    prep_args args = *a;
    args.tok = tok;
    if (args.chunk_bytes <= 0) args.chunk_bytes = 1 << 20;
    int eot, rc = resolve_eot(a, tok, &eot, e);
    if (rc == 0) rc = resolve_chat(a, &args, e);
    res->chat = args.chat;
    int vocab = tok_vocab_size(tok) > eot + 1 ? tok_vocab_size(tok) : eot + 1;
    stream *s = calloc(1, sizeof *s);
    UST_ASSERT(s, "out of memory");
    s->width = vocab <= 65536 ? 2 : 4;
    snprintf(s->path, sizeof s->path, "%s/.prep_tokens.tmp.%d", a->out_dir, (int)getpid());
    int lock = -1;
    if (rc == 0) rc = ckpt_refuse_in_step(a->out_dir, "data prep: --out", e);
    if (rc == 0) rc = fs_mkdir_p(a->out_dir, e);
    if (rc == 0) rc = fs_lock_dir(a->out_dir, "data prep: --out", &lock, e);
    if (rc == 0 && !(s->f = create_new(s->path, e))) rc = -1;
    if (rc == 0 && a->masked) {
        snprintf(s->mpath, sizeof s->mpath, "%s/.prep_mask.tmp.%d", a->out_dir, (int)getpid());
        s->eot_target = a->train_on == TRAIN_ON_ALL;
        if (!(s->mf = create_new(s->mpath, e))) rc = -1;
    }
    res->threads = threads_to_use(a);
    if (rc == 0) rc = tokenize_all(&args, tok, res->threads, s, eot, vocab, res, e);
    if (rc == 0) rc = stream_flush(s, e);
    int64_t nval = 0;
    if (rc == 0) rc = split_sizes(s->n, frac, per_shard, &nval, e);
    bool runtime = s->write_failed || s->read_failed; /* from here every failure is the output's */
    if (rc == 0) {
        runtime = true;
        rc = write_split(s, a->out_dir, "train", 0, s->n - nval, per_shard, &res->ntrain_shards, e);
    }
    if (rc == 0)
        rc = write_split(s, a->out_dir, "val", s->n - nval, nval, per_shard, &res->nval_shards, e);
    if (s->f) fclose(s->f);
    if (s->f) unlink(s->path);
    if (s->mf) fclose(s->mf);
    if (s->mf) unlink(s->mpath);
    res->targets = s->targets;
    if (rc == 0) rc = publish_split(a->out_dir, "train", res->ntrain_shards, e);
    if (rc == 0) rc = publish_split(a->out_dir, "val", res->nval_shards, e);
    discard_split(a->out_dir, "train", res->ntrain_shards); /* what is left of a failure */
    discard_split(a->out_dir, "val", res->nval_shards);
    res->ntrain = s->n - nval;
    res->nval = nval;
    res->vocab_size = vocab;
    res->width = s->width;
    res->eot = eot;
    if (rc == 0)
        rc = prep_write_meta(a->out_dir, a->tok ? a->tok_path : NULL, eot, vocab, s->width, res, e);
    res->seconds = log_now_s() - t0;
    if (lock >= 0) close(lock);
    free(s);
    tok_free(own);
    return rc == 0 ? 0 : runtime ? UST_EXIT_RUNTIME : UST_EXIT_USAGE;
}

/* ---------------------------------------------------------------------------------------------
 * meta.json */

static cJSON *meta_json(const char *tok_path, int eot, int vocab, int width,
                        const prep_result *counts, ust_err *e) {
    cJSON *j = cJSON_CreateObject();
    if (tok_path) {
        char abs[PATH_MAX], hex[SHA256_HEX_LEN + 1];
        if (!realpath(tok_path, abs)) {
            ust_errf(e, "%s: %s", tok_path, strerror(errno));
            cJSON_Delete(j);
            return NULL;
        }
        if (sha256_file(abs, hex, e)) {
            cJSON_Delete(j);
            return NULL;
        }
        cJSON_AddStringToObject(j, "tokenizer", abs);
        cJSON_AddStringToObject(j, "tokenizer_sha256", hex);
    } else {
        cJSON_AddStringToObject(j, "tokenizer", "bytes");
    }
    if (eot >= 0)
        cJSON_AddNumberToObject(j, "eot_id", eot);
    else
        cJSON_AddNullToObject(j, "eot_id");
    cJSON_AddNumberToObject(j, "vocab_size", vocab);
    cJSON_AddNumberToObject(j, "token_bytes", width);
    cJSON_AddStringToObject(j, "format", "llmc");
    if (counts) { /* what the shards hold, without reading them */
        cJSON_AddNumberToObject(j, "train_tokens", (double)counts->ntrain);
        cJSON_AddNumberToObject(j, "val_tokens", (double)counts->nval);
        cJSON_AddNumberToObject(j, "documents", (double)counts->ndocs);
    }
    return j;
}

int prep_write_meta(const char *dir, const char *tok_path, int eot, int vocab, int width,
                    const prep_result *counts, ust_err *e) {
    cJSON *j = meta_json(tok_path, eot, vocab, width, counts, e);
    if (!j) return -1;
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    UST_ASSERT(text, "out of memory");
    char tmp[UST_PATH_MAX + 64], path[UST_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s/.meta.json.tmp.%d", dir, (int)getpid());
    snprintf(path, sizeof path, "%s/meta.json", dir);
    ust_err inner;
    FILE *f = fs_fopen_regular(tmp, "wb", &inner);
    int rc = f ? 0 : ust_errf(e, "%s", inner.msg);
    if (f && (fputs(text, f) < 0 || fputc('\n', f) < 0)) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    if (f && rc) ust_errf(e, "%s: write failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = ust_errf(e, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    free(text);
    return rc;
}

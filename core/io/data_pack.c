/* data_pack: first-fit-decreasing over a chunk keeps every window's open room in an array and
 * scans it in opening order, O(chunk x windows); the chunk bounds both, so the cost per example
 * stays constant however long the stream is. */
#include "data_pack.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t start; /* stream position of its first token */
    int32_t len;
} piece;

struct data_packer {
    int T, eot;
    int64_t nwin, npieces;
    int64_t *win_at; /* window w holds pieces [win_at[w], win_at[w + 1]) */
    piece *pieces;
};

typedef struct {
    piece *p;
    int64_t n, cap;
} piece_list;

static void push(piece_list *l, int64_t start, int32_t len) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->p = realloc(l->p, (size_t)l->cap * sizeof *l->p);
        UST_ASSERT(l->p, "out of memory (%lld pieces)", (long long)l->cap);
    }
    l->p[l->n++] = (piece){start, len};
}

/* The examples of the stream as pieces of at most T+1 tokens (overlong ones split or dropped). */
static void find_examples(const ust_dataset *d, int T, int eot, bool drop, piece_list *out,
                          data_pack_stats *st) {
    enum { CHUNK = 1 << 20 };
    int32_t *buf = malloc(CHUNK * sizeof *buf);
    UST_ASSERT(buf, "out of memory");
    int64_t n = data_num_tokens(d), begin = 0;
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t m = n - at < CHUNK ? n - at : CHUNK;
        data_read_tokens(d, at, m, buf);
        for (int64_t i = 0; i < m; i++) {
            if (buf[i] != eot) continue;
            int64_t end = at + i + 1, L = end - begin;
            st->examples++;
            if (L > T + 1 && drop) {
                st->dropped++;
            } else {
                st->split += L > T + 1;
                /* pieces start every T tokens: piece k's first token is piece k-1's last */
                for (int64_t s = begin; s == begin || s + 1 < end; s += T)
                    push(out, s, (int32_t)(end - s < T + 1 ? end - s : T + 1));
            }
            begin = end;
        }
    }
    if (begin < n) st->dropped++, st->examples++; /* no end of text: not a whole example */
    free(buf);
}

static int by_length(const void *a, const void *b) {
    const piece *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Packs pieces [0, n) of one chunk, appending its windows to p. */
static void pack_chunk(data_packer *p, piece *c, int64_t n, int64_t **room_buf, int64_t *room_cap,
                       piece_list *out, int64_t *win_cap) {
    qsort(c, (size_t)n, sizeof *c, by_length);
    int64_t first = p->nwin, *room = *room_buf, *owner = NULL;
    owner = malloc((size_t)(n ? n : 1) * sizeof *owner);
    UST_ASSERT(owner, "out of memory");
    int64_t open = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t w = 0;
        while (w < open && room[w] < c[i].len) w++;
        if (w == open) {
            if (open == *room_cap) {
                *room_cap = *room_cap ? 2 * *room_cap : 256;
                *room_buf = room = realloc(room, (size_t)*room_cap * sizeof *room);
                UST_ASSERT(room, "out of memory");
            }
            room[open++] = p->T + 1;
        }
        room[w] -= c[i].len;
        owner[i] = w;
    }
    /* the windows in opening order, each with its pieces in the order they went in */
    if (p->nwin + open + 1 > *win_cap) {
        *win_cap = 2 * (p->nwin + open + 1);
        p->win_at = realloc(p->win_at, (size_t)*win_cap * sizeof *p->win_at);
        UST_ASSERT(p->win_at, "out of memory");
    }
    for (int64_t w = 0; w < open; w++) {
        p->win_at[first + w] = out->n;
        for (int64_t i = 0; i < n; i++)
            if (owner[i] == w) push(out, c[i].start, c[i].len);
    }
    p->nwin += open;
    p->win_at[p->nwin] = out->n;
    free(owner);
}

int data_pack_build(data_packer **out, const ust_dataset *d, int T, int eot, int buffer, bool drop,
                    data_pack_stats *st, ust_err *e) {
    memset(st, 0, sizeof *st);
    *out = NULL;
    if (eot < 0) return ust_errf(e, "data.packing: first_fit needs the end-of-text id");
    piece_list ex = {0}, packed = {0};
    find_examples(d, T, eot, drop, &ex, st);
    data_packer *p = calloc(1, sizeof *p);
    UST_ASSERT(p, "out of memory");
    p->T = T, p->eot = eot;
    int64_t *room = NULL, room_cap = 0, win_cap = 0;
    for (int64_t at = 0; at < ex.n; at += buffer)
        pack_chunk(p, ex.p + at, ex.n - at < buffer ? ex.n - at : buffer, &room, &room_cap, &packed,
                   &win_cap);
    free(room);
    free(ex.p);
    p->pieces = packed.p;
    p->npieces = packed.n;
    st->windows = p->nwin;
    for (int64_t i = 0; i < packed.n; i++) st->tokens += packed.p[i].len;
    st->pad = p->nwin * (T + 1) - st->tokens;
    if (p->nwin == 0) {
        data_pack_free(p);
        return ust_errf(e, "data.packing: no whole example (ended by end of text %d) to pack", eot);
    }
    *out = p;
    return 0;
}

int64_t data_pack_windows(const data_packer *p) { return p->nwin; }

void data_pack_window(const data_packer *p, const ust_dataset *d, int64_t w, int32_t *tok,
                      uint8_t *flags) {
    UST_ASSERT(w >= 0 && w < p->nwin, "window %lld of %lld", (long long)w, (long long)p->nwin);
    int at = 0;
    for (int64_t i = p->win_at[w]; i < p->win_at[w + 1]; i++) {
        const piece *c = &p->pieces[i];
        if (tok) data_read_tokens(d, c->start, c->len, tok + at);
        if (flags) {
            data_read_flags(d, c->start, c->len, flags + at);
            flags[at] = 0;
        }
        at += c->len;
    }
    for (; at <= p->T; at++) {
        if (tok) tok[at] = p->eot;
        if (flags) flags[at] = 2;
    }
}

void data_pack_free(data_packer *p) {
    if (!p) return;
    free(p->win_at);
    free(p->pieces);
    free(p);
}

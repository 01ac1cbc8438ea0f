/* flight_diag: the reading half of the flight recorder (flight.h). It reads the rank_R.json files
 * flight.c writes (line by line: one header line, one line per group, one per entry) and, for
 * every group where some rank waits, names who that rank waits on and which of them never reached
 * the matching operation: for a collective, a member that posted fewer of the group's collectives;
 * for p2p, a peer that posted fewer messages to this rank (or took fewer from it) than the number
 * of the one waited on. A rank without a file is stopped, dead or unreachable. */
#include "flight_impl.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* One group as one rank saw it, and the oldest operation it has not completed there. */
typedef struct {
    char name[32];
    int n, me;
    int *members;
    uint64_t posted, done, colls, *sent, *recvd;
    int has_pend, waiting; /* an operation not completed; this rank waits in the group */
    flight_entry pend;     /* its p2p peers are global ranks */
    double since;          /* wall clock: the start of its oldest wait */
} dg_group;

typedef struct {
    int ok, rank, world, ng;
    char job[64], why[16];
    double written, timeout_s;
    dg_group *g;
} dg_rank;

/* ------------------------------------------------------------------ reading */

static const char *jfind(const char *s, const char *key) {
    char pat[48];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(s, pat);
    return p ? p + strlen(pat) : NULL;
}

static double jnum(const char *s, const char *key) {
    const char *p = jfind(s, key);
    return p ? strtod(p, NULL) : -1;
}

static void jstr(const char *s, const char *key, char *out, size_t cap) {
    const char *p = jfind(s, key);
    size_t n = 0;
    if (p && *p == '"')
        for (p++; *p && *p != '"' && n + 1 < cap; p++) out[n++] = *p;
    out[n] = 0;
}

/* The numbers of the array under key, up to n; returns how many. */
static int jarr(const char *s, const char *key, uint64_t *out, int n) {
    const char *p = jfind(s, key);
    if (!p || *p != '[') return 0;
    int k = 0;
    for (p++; *p && *p != ']' && k < n;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p) break;
        out[k++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return k;
}

static void read_group(dg_rank *r, const char *line) {
    dg_group *g = &r->g[r->ng];
    memset(g, 0, sizeof *g);
    jstr(line, "name", g->name, sizeof g->name);
    g->n = r->world;
    g->members = malloc(sizeof(int) * (size_t)r->world);
    g->sent = calloc((size_t)r->world, sizeof(uint64_t));
    g->recvd = calloc((size_t)r->world, sizeof(uint64_t));
    uint64_t *m = calloc((size_t)r->world, sizeof(uint64_t));
    UST_ASSERT(g->members && g->sent && g->recvd && m, "out of memory");
    g->n = jarr(line, "members", m, r->world);
    for (int j = 0; j < g->n; j++) g->members[j] = (int)m[j];
    free(m);
    g->me = (int)jnum(line, "me");
    g->posted = (uint64_t)jnum(line, "posted");
    g->done = (uint64_t)jnum(line, "done");
    g->colls = (uint64_t)jnum(line, "colls");
    jarr(line, "sent", g->sent, g->n);
    jarr(line, "recvd", g->recvd, g->n);
    if ((int)jnum(line, "id") == r->ng) r->ng++; /* ids are written in order from 0 */
}

static int kind_of(const char *name) {
    for (int k = 0; k < COMM_NKINDS; k++)
        if (!strcmp(name, comm_kind_name((comm_kind)k))) return k;
    return -1;
}

/* An entry line: the oldest one not completed of its group becomes the group's pend. */
static void read_entry(dg_rank *r, const char *line) {
    int gi = (int)jnum(line, "g");
    char state[16], kind[32];
    jstr(line, "state", state, sizeof state);
    if (gi < 0 || gi >= r->ng || !strcmp(state, "done")) return;
    dg_group *g = &r->g[gi];
    flight_entry x = {.group = gi, .seq = (uint64_t)jnum(line, "seq")};
    jstr(line, "kind", kind, sizeof kind);
    x.kind = kind_of(kind);
    x.coll = (uint64_t)jnum(line, "coll");
    x.state = strcmp(state, "waiting") ? FLIGHT_POSTED : FLIGHT_WAITING;
    x.t_wait = jnum(line, "t_wait");
    jstr(line, "label", x.label, sizeof x.label);
    const char *p = jfind(line, "p2p");
    for (p = p ? strchr(p, '[') : NULL; p && x.np2p < FLIGHT_P2P;) {
        flight_p2p t;
        char dir[8];
        unsigned long long msg;
        if (sscanf(p, "[%d, \"%7[a-z]\", %llu]", &t.peer, dir, &msg) != 3 &&
            sscanf(p, "[[%d, \"%7[a-z]\", %llu]", &t.peer, dir, &msg) != 3)
            break;
        t.send = !strcmp(dir, "send");
        t.msg = msg;
        x.p2p[x.np2p++] = t;
        p = strstr(p + 2, "[");
    }
    if (x.state == FLIGHT_WAITING && (!g->waiting || x.t_wait < g->since))
        g->waiting = 1, g->since = x.t_wait;
    if (!g->has_pend || x.seq < g->pend.seq) g->has_pend = 1, g->pend = x;
}

static int read_rank(const char *path, dg_rank *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    int first = 1;
    while (getline(&line, &cap, f) > 0) {
        if (first) {
            first = 0;
            if (!jfind(line, "flight")) break;
            r->rank = (int)jnum(line, "rank");
            r->world = (int)jnum(line, "world");
            r->written = jnum(line, "written");
            r->timeout_s = jnum(line, "timeout_s");
            jstr(line, "job", r->job, sizeof r->job);
            jstr(line, "why", r->why, sizeof r->why);
            if (r->world < 1 || r->world > (1 << 20) || r->rank < 0 || r->rank >= r->world) break;
            r->g = calloc(64, sizeof *r->g);
            UST_ASSERT(r->g, "out of memory");
            r->ok = 1;
        } else if (!strncmp(line, "{\"id\": ", 7) && r->ng < 64) {
            read_group(r, line);
        } else if (!strncmp(line, "{\"g\": ", 6)) {
            read_entry(r, line);
        }
    }
    free(line);
    fclose(f);
    return r->ok ? 0 : -1;
}

static void free_rank(dg_rank *r) {
    for (int i = 0; i < r->ng; i++) {
        free(r->g[i].members);
        free(r->g[i].sent);
        free(r->g[i].recvd);
    }
    free(r->g);
    memset(r, 0, sizeof *r);
}

/* A file counts for job when written since wall, or (a rank whose own wait timed out, which
 * wrote at once) within its timeout before. */
static int fresh(const dg_rank *r, const char *job, double wall) {
    if (!r->ok || (job && strcmp(r->job, job))) return 0;
    return wall <= 0 || r->written >= wall ||
           (!strcmp(r->why, "timeout") && r->written >= wall - r->timeout_s);
}

/* Every fresh file of job in dir, by rank (world entries in *out; job NULL: the newest job). */
static int read_all(const char *dir, const char *job, double wall, dg_rank **out, int *world) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *de;
    dg_rank *rs = NULL, r;
    char path[4400], newest[64] = "";
    double newest_t = -1;
    int n = 0;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "rank_", 5) || !strstr(de->d_name, ".json")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (read_rank(path, &r)) continue;
        if (!job && r.written > newest_t) newest_t = r.written, snprintf(newest, 64, "%s", r.job);
        rs = realloc(rs, sizeof *rs * (size_t)(n + 1));
        UST_ASSERT(rs, "out of memory");
        rs[n++] = r;
    }
    closedir(d);
    if (!job) job = newest;
    *world = 0;
    for (int i = 0; i < n; i++)
        if (fresh(&rs[i], job, wall) && rs[i].world > *world) *world = rs[i].world;
    dg_rank *by = calloc((size_t)(*world ? *world : 1), sizeof *by);
    UST_ASSERT(by, "out of memory");
    for (int i = 0; i < n; i++) {
        if (fresh(&rs[i], job, wall) && rs[i].world == *world && !by[rs[i].rank].ok)
            by[rs[i].rank] = rs[i];
        else
            free_rank(&rs[i]);
    }
    free(rs);
    *out = by;
    return 0;
}

int flight_fresh_files(const char *dir, const char *job, double wall, int world) {
    dg_rank *rs;
    int w, n = 0;
    if (read_all(dir, job, wall, &rs, &w)) return 0;
    for (int i = 0; i < w; i++) n += rs[i].ok, free_rank(&rs[i]);
    free(rs);
    return w == world ? n : 0;
}

/* ------------------------------------------------------------------ the diagnosis */

/* Rank r's view of the group named like g with g's members, or NULL. */
static const dg_group *view(const dg_rank *r, const dg_group *g) {
    if (!r->ok) return NULL;
    for (int i = 0; i < r->ng; i++) {
        const dg_group *h = &r->g[i];
        if (h->n == g->n && !strcmp(h->name, g->name) &&
            !memcmp(h->members, g->members, sizeof(int) * (size_t)g->n))
            return h;
    }
    return NULL;
}

static int local_of(const dg_group *g, int rank) {
    for (int j = 0; j < g->n; j++)
        if (g->members[j] == rank) return j;
    return -1;
}

/* "send_recv op #41 (recv act chunk 0 mb 5)" or "all_reduce #3 (op #45)". */
static void describe(const flight_entry *x, char *buf, size_t cap) {
    const char *k = x->kind >= 0 ? comm_kind_name((comm_kind)x->kind) : "?";
    if (x->kind == COMM_SENDRECV)
        snprintf(buf, cap, "%s op #%llu%s%s%s", k, (unsigned long long)x->seq,
                 x->label[0] ? " (" : "", x->label, x->label[0] ? ")" : "");
    else
        snprintf(buf, cap, "%s #%llu (op #%llu%s%s)", k, (unsigned long long)x->coll,
                 (unsigned long long)x->seq, x->label[0] ? ": " : "", x->label);
}

/* Where rank r is: in a wait (which group and operation), or in none. */
static void whereabouts(const dg_rank *r, char *buf, size_t cap) {
    if (!r->ok) {
        snprintf(buf, cap, "no record (stopped, dead or unreachable)");
        return;
    }
    for (int i = 0; i < r->ng; i++)
        if (r->g[i].waiting) {
            char what[160];
            describe(&r->g[i].pend, what, sizeof what);
            snprintf(buf, cap, "itself waits in group '%s' at %s", r->g[i].name, what);
            return;
        }
    snprintf(buf, cap, "in no wait (computing, or stopped between operations)");
}

static int in_wait(const dg_rank *r) {
    for (int i = 0; i < r->ng; i++)
        if (r->g[i].waiting) return 1;
    return 0;
}

/* Has member j of g reached what rank w waits at (w's pend)? For p2p, what j must have posted:
 * the message matching each of w's (its number from j's side of the pair). Fills `missing`. */
static int reached(const dg_rank *rs, const dg_group *gw, int w, int j, char *missing, size_t cap) {
    const dg_group *gj = view(&rs[j], gw);
    const flight_entry *x = &gw->pend;
    missing[0] = 0;
    if (x->kind != COMM_SENDRECV) {
        if (gj && gj->colls >= x->coll) return 1;
        snprintf(missing, cap, "%s #%llu", comm_kind_name((comm_kind)x->kind),
                 (unsigned long long)x->coll);
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < x->np2p; i++) {
        const flight_p2p *t = &x->p2p[i];
        if (t->peer != j) continue;
        int lw = gj ? local_of(gj, w) : -1;
        uint64_t have = lw < 0 ? 0 : t->send ? gj->recvd[lw] : gj->sent[lw];
        if (gj && lw >= 0 && have >= t->msg) continue;
        ok = 0;
        snprintf(missing, cap, "the %s #%llu %s rank %d", t->send ? "recv" : "send",
                 (unsigned long long)t->msg, t->send ? "from" : "to", w);
    }
    return ok;
}

/* One group: each rank waiting in it, on whom, and where each rank behind is. Marks the ranks
 * that hold the job up (behind and in no wait, or without a record) in root[]. */
static void diagnose_group(const dg_rank *rs, int world, const dg_group *g, FILE *out, char *root) {
    char *named = calloc((size_t)world, 1), what[200], miss[96], where[240];
    UST_ASSERT(named, "out of memory");
    for (int a = 0; a < g->n; a++) {
        int w = g->members[a];
        const dg_group *gw = view(&rs[w], g);
        if (!gw || !gw->waiting) continue;
        describe(&gw->pend, what, sizeof what);
        fprintf(out, "flight: group '%s': rank %d waits at %s since %.1f s", g->name, w, what,
                rs[w].written - gw->since);
        int any = 0;
        for (int b = 0; b < g->n; b++) {
            int j = g->members[b];
            if (j == w || reached(rs, gw, w, j, miss, sizeof miss)) continue;
            fprintf(out, "%s%d (never reached %s)", any++ ? ", rank " : "; behind: rank ", j, miss);
        }
        fprintf(out, "\n");
        for (int b = 0; b < g->n; b++) {
            int j = g->members[b];
            if (j == w || named[j] || reached(rs, gw, w, j, miss, sizeof miss)) continue;
            named[j] = 1;
            whereabouts(&rs[j], where, sizeof where);
            fprintf(out, "flight: group '%s': rank %d: %s\n", g->name, j, where);
            if (!rs[j].ok || !in_wait(&rs[j])) root[j] = 1;
        }
    }
    free(named);
}

int flight_diagnose_job(const char *dir, const char *job, double wall, FILE *out, ust_err *e) {
    dg_rank *rs;
    int world, n = 0;
    if (read_all(dir, job, wall, &rs, &world))
        return ust_errf(e, "cannot read the directory %s", dir);
    for (int i = 0; i < world; i++) n += rs[i].ok;
    if (!n) {
        free(rs);
        return ust_errf(e, "%s holds no flight recorder file (rank_R.json)%s", dir,
                        job ? " of this job" : "");
    }
    for (int i = 0; i < world && !job; i++)
        if (rs[i].ok) job = rs[i].job;
    fprintf(out, "flight: job %s, %d of %d ranks answered%s\n", job, n, world,
            n < world ? " (the others: stopped, dead or unreachable)" : "");
    char *root = calloc((size_t)world, 1);
    UST_ASSERT(root, "out of memory");
    /* each group once: the first rank's view of it that shows it */
    for (int r = 0; r < world; r++)
        for (int i = 0; i < rs[r].ng; i++) {
            const dg_group *g = &rs[r].g[i];
            int first = 1;
            for (int q = 0; q < r && first; q++) first = !view(&rs[q], g);
            if (first) diagnose_group(rs, world, g, out, root);
        }
    int any = 0;
    fprintf(out, "flight: diagnosis: ");
    for (int r = 0; r < world; r++)
        if (root[r]) fprintf(out, "%s%d", any++ ? "," : "the job waits on rank ", r);
    fprintf(out, "%s\n", any ? "" : "no rank is behind (no wait in the records)");
    free(root);
    for (int r = 0; r < world; r++) free_rank(&rs[r]); /* job may point into rs */
    free(rs);
    return 0;
}

int flight_diagnose_dir(const char *dir, FILE *out, ust_err *e) {
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/flight", dir);
    DIR *d = opendir(sub);
    if (d) closedir(d);
    return flight_diagnose_job(d ? sub : dir, NULL, 0, out, e);
}

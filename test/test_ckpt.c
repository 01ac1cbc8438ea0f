/* ckpt: slices written by several writers read back whole and by slices; the commit protocol
 * (latest, keep_last, abort, replacing a step, failures) never damages the previous checkpoint;
 * hostile safetensors headers give errors, not crashes. */
#include <math.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "test.h"

static char g_tmp[256];

static void path_in(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_tmp, name);
}

static bool exists(const char *dir, const char *name) {
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void read_text(const char *path, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t k = fread(out, 1, n - 1, f);
    out[k] = 0;
    fclose(f);
}

/* The model of these tests: A is 6 x 5, B is 7, C is 4 x 3. Element k of tensor i is
 * value(i, k), so any misplaced element shows. */
static const ckpt_tensor T3[3] = {{"model.layers.0.A.weight", 2, {6, 5}},
                                  {"model.norm.weight", 1, {7, 0}},
                                  {"lm_head.weight", 2, {4, 3}}};
static float value(int i, int64_t k, float salt) { return salt + 1000.0f * (float)i + (float)k; }

static void fill_whole(int i, float salt, float *out) {
    ckpt_slice s = ckpt_whole(&T3[i]);
    for (int64_t k = 0; k < s.flat1; k++) out[k] = value(i, k, salt);
}

/* The slice s of tensor i, as a rank holding it would have it in memory. */
static void fill_slice(int i, const ckpt_slice *s, float salt, float *out) {
    int64_t cols = T3[i].ndim == 2 ? T3[i].shape[1] : T3[i].shape[0];
    for (int64_t k = s->flat0; k < s->flat1; k++) {
        int64_t r = s->row0 + k / s->ncols, c = s->col0 + k % s->ncols;
        out[k - s->flat0] = value(i, r * cols + c, salt);
    }
}

static int write_slice(ckpt_writer *w, int file, int i, ckpt_slice s, float salt, ust_err *e) {
    float buf[64];
    fill_slice(i, &s, salt, buf);
    return ckpt_write_slice(w, file, T3[i].name, &s, buf, e);
}

/* A whole checkpoint from one writer; salt makes each step's values different. */
static int write_step(const char *dir, int64_t step, float salt, int keep_last, ust_err *e) {
    ckpt_writer *w = ckpt_begin(dir, step, 0, NULL, NULL, NULL, e);
    if (!w) return -1;
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, e);
    if (f < 0) {
        ckpt_abort(w);
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (write_slice(w, f, i, ckpt_whole(&T3[i]), salt, e)) {
            ckpt_abort(w);
            return -1;
        }
    char state[64];
    snprintf(state, sizeof state, "{\"step\": %lld}\n", (long long)step);
    return ckpt_commit(w, state, keep_last, e);
}

/* Reads tensor i of step_dir whole and compares with the values written with salt. */
static int check_step(const char *step_dir, float salt, char *why, size_t nwhy) {
    ust_err e;
    ckpt_reader *r = ckpt_open(step_dir, &e);
    if (!r) return snprintf(why, nwhy, "open: %.900s", e.msg), -1;
    for (int i = 0; i < 3; i++) {
        float got[64], want[64];
        ckpt_slice s = ckpt_whole(&T3[i]);
        fill_whole(i, salt, want);
        if (ckpt_read_slice(r, "model.safetensors", &T3[i], &s, got, &e)) {
            snprintf(why, nwhy, "read %.60s: %.900s", T3[i].name, e.msg);
            ckpt_close(r);
            return -1;
        }
        for (int64_t k = 0; k < s.flat1; k++)
            if (got[k] != want[k]) {
                snprintf(why, nwhy, "%s[%lld] = %g, expected %g", T3[i].name, (long long)k, got[k],
                         want[k]);
                ckpt_close(r);
                return -1;
            }
    }
    ckpt_close(r);
    return 0;
}

/* Writes the model in pieces the way a sharded layout holds it. */
static int write_in_pieces(ckpt_writer *w, int f, ust_err *e) {
    /* A: a TP-style column split; the second column box is further cut ZeRO-style into two
     * flat ranges that start and end mid-row (the box is 6 x 3 = 18 elements). */
    if (write_slice(w, f, 0, (ckpt_slice){0, 6, 0, 2, 0, 12}, 0, e)) return -1;
    if (write_slice(w, f, 0, (ckpt_slice){0, 6, 2, 3, 0, 7}, 0, e)) return -1;
    if (write_slice(w, f, 0, (ckpt_slice){0, 6, 2, 3, 7, 18}, 0, e)) return -1;
    /* B: 1-D, two flat ranges */
    if (write_slice(w, f, 1, (ckpt_slice){0, 1, 0, 7, 0, 3}, 0, e)) return -1;
    if (write_slice(w, f, 1, (ckpt_slice){0, 1, 0, 7, 3, 7}, 0, e)) return -1;
    /* C: a row split (PP/EP-like) */
    if (write_slice(w, f, 2, (ckpt_slice){0, 1, 0, 3, 0, 3}, 0, e)) return -1;
    return write_slice(w, f, 2, (ckpt_slice){1, 3, 0, 3, 0, 9}, 0, e);
}

static void test_slices_from_many_writers_read_back_whole_and_by_slice(void) {
    char dir[512], sd[600];
    path_in(dir, sizeof dir, "slices");
    ust_err e;
    ckpt_writer *w = ckpt_begin(dir, 3, 0, NULL, NULL, NULL, &e);
    CHECK(w, "begin: %.900s", e.msg);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    CHECK(f == 0, "add_file: %.900s", e.msg);
    int g = ckpt_add_file(w, "optimizer.safetensors", T3 + 2, 1, &e);
    CHECK(g == 1, "add_file: %.900s", e.msg);
    CHECK(!write_in_pieces(w, f, &e), "write: %.900s", e.msg);
    CHECK(!write_slice(w, g, 2, ckpt_whole(&T3[2]), 0.5f, &e), "opt: %.900s", e.msg);
    CHECK(ckpt_commit(w, "{\"step\": 3}", 0, &e) == 0, "commit: %.900s", e.msg);

    snprintf(sd, sizeof sd, "%s/step_3", dir);
    char why[1024];
    CHECK(check_step(sd, 0, why, sizeof why) == 0, "%.900s", why);
    ckpt_reader *r = ckpt_open(sd, &e);
    CHECK(r, "open: %.900s", e.msg);
    CHECK(!strcmp(ckpt_state_json(r), "{\"step\": 3}"), "state.json: %s", ckpt_state_json(r));
    /* a box in the middle of A, cut to a flat range that starts and ends mid-row */
    ckpt_slice s = {1, 3, 1, 3, 2, 8};
    float got[6], want[6];
    fill_slice(0, &s, 0, want);
    int rc = ckpt_read_slice(r, "model.safetensors", &T3[0], &s, got, &e);
    float opt[12], optw[12];
    int rc2 = ckpt_read_slice(r, "optimizer.safetensors", &T3[2], &(ckpt_slice){0, 4, 0, 3, 0, 12},
                              opt, &e);
    ckpt_close(r);
    CHECK(rc == 0 && rc2 == 0, "read: %.900s", e.msg);
    for (int k = 0; k < 6; k++)
        CHECK(got[k] == want[k], "slice[%d] = %g, expected %g", k, got[k], want[k]);
    fill_whole(2, 0.5f, optw);
    CHECK(!memcmp(opt, optw, sizeof opt), "optimizer tensor differs");
}

static void test_slice_outside_the_tensor_is_refused_and_fails_the_commit(void) {
    char dir[512];
    path_in(dir, sizeof dir, "badslice");
    ust_err e;
    ckpt_writer *w = ckpt_begin(dir, 1, 0, NULL, NULL, NULL, &e);
    CHECK(w, "begin: %.900s", e.msg);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    CHECK(f == 0, "add_file: %.900s", e.msg);
    float junk[64] = {0};
    ckpt_slice bad = {5, 2, 0, 5, 0, 10}; /* rows 5..6 of a 6-row tensor */
    int rc = ckpt_write_slice(w, f, T3[0].name, &bad, junk, &e);
    int msg_ok = rc == -1 && strstr(e.msg, "outside tensor 'model.layers.0.A.weight'");
    ckpt_slice flat = {0, 2, 0, 5, 3, 11}; /* flat range longer than the 2 x 5 box */
    rc = ckpt_write_slice(w, f, T3[0].name, &flat, junk, &e);
    msg_ok = msg_ok && rc == -1 && strstr(e.msg, "rows [5, +2)"); /* sticky: the first error */
    /* later writes are skipped and report the first error too */
    int later = write_in_pieces(w, f, &e) == -1 && strstr(e.msg, "rows [5, +2)");
    rc = ckpt_commit(w, "{}", 0, &e);
    CHECK(msg_ok, "bad slices accepted");
    CHECK(later, "a write after a failed one was not refused: %.900s", e.msg);
    CHECK(rc == -1 && strstr(e.msg, "rows [5, +2)") && !exists(dir, "step_1") &&
              !exists(dir, ".tmp_step_1"),
          "a writer with a refused slice committed: %.900s", e.msg);
}

static void test_file_is_standard_safetensors(void) {
    char p[600];
    path_in(p, sizeof p, "slices/step_3/model.safetensors");
    struct stat st;
    CHECK(stat(p, &st) == 0, "no %s", p);
    CHECK((st.st_mode & 0777) == 0644, "mode %o, expected 0644 under umask 022",
          (unsigned)(st.st_mode & 0777));
    FILE *f = fopen(p, "rb");
    CHECK(f, "open");
    uint64_t n;
    char hdr[4096];
    size_t got = fread(&n, 8, 1, f);
    got += n < sizeof hdr ? fread(hdr, 1, n, f) : 0;
    fclose(f);
    CHECK(got == 1 + n && n % 8 == 0, "header length %llu", (unsigned long long)n);
    cJSON *j = cJSON_ParseWithLength(hdr, n);
    CHECK(j, "header is not JSON");
    const cJSON *meta = cJSON_GetObjectItem(j, "__metadata__");
    const cJSON *fmt = meta ? cJSON_GetObjectItem(meta, "format") : NULL;
    const cJSON *c = cJSON_GetObjectItem(j, "lm_head.weight");
    const cJSON *off = c ? cJSON_GetObjectItem(c, "data_offsets") : NULL;
    int ok = cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "pt") && off &&
             cJSON_GetArrayItem(off, 0)->valuedouble == 4 * (30 + 7) &&
             cJSON_GetArrayItem(off, 1)->valuedouble == 4 * (30 + 7 + 12) &&
             !strcmp(j->child->string, "__metadata__");
    cJSON_Delete(j);
    CHECK(ok, "header fields wrong: %.*s", (int)n, hdr);
    CHECK(st.st_size == (off_t)(8 + n + 4 * 49), "file size %lld", (long long)st.st_size);
    ust_err e;
    st_file *s = st_open(p, &e);
    CHECK(s, "st_open: %.900s", e.msg);
    int ndim = 0;
    int64_t shape[4];
    const float *a = st_tensor(s, "model.layers.0.A.weight", &ndim, shape);
    int names_ok = st_count(s) == 3 && !strcmp(st_name(s, 0), T3[0].name) &&
                   !strcmp(st_name(s, 2), T3[2].name);
    int a_ok = a && ndim == 2 && shape[0] == 6 && shape[1] == 5 && a[29] == value(0, 29, 0);
    int miss = st_tensor(s, "nope", &ndim, shape) == NULL;
    st_close(s);
    CHECK(names_ok && a_ok && miss, "st_* view wrong (names %d, A %d, missing %d)", names_ok, a_ok,
          miss);
}

static void test_latest_is_updated_and_keep_last_prunes_older_steps(void) {
    char dir[512], out[600], text[64], p[600];
    path_in(dir, sizeof dir, "keep");
    ust_err e;
    for (int s = 1; s <= 4; s++)
        CHECK(write_step(dir, s * 10, (float)s, 2, &e) == 0, "step %d: %.900s", s, e.msg);
    CHECK(!exists(dir, "step_10") && !exists(dir, "step_20"), "old steps not pruned");
    CHECK(exists(dir, "step_30") && exists(dir, "step_40"), "kept steps missing");
    CHECK(!exists(dir, ".tmp_step_40") && !exists(dir, "latest.tmp"), "temporaries left behind");
    snprintf(p, sizeof p, "%s/latest", dir);
    read_text(p, text, sizeof text);
    CHECK(!strcmp(text, "step_40\n"), "latest = '%s'", text);
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1, "find_latest: %.900s", e.msg);
    snprintf(p, sizeof p, "%s/step_40", dir);
    CHECK(!strcmp(out, p), "latest found %s", out);
    char why[1024];
    CHECK(check_step(out, 4, why, sizeof why) == 0, "%.900s", why);
    /* keep_last 0 keeps everything */
    CHECK(write_step(dir, 50, 5, 0, &e) == 0, "%.900s", e.msg);
    CHECK(exists(dir, "step_30") && exists(dir, "step_40") && exists(dir, "step_50"),
          "pruned with keep_last 0");
}

static void test_find_latest_ignores_temporaries_and_recovers_from_bad_latest(void) {
    char dir[512], out[600], p[700], want[700];
    path_in(dir, sizeof dir, "find");
    ust_err e;
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 0, "missing dir should give 0");
    CHECK(write_step(dir, 4, 4, 0, &e) == 0, "%.900s", e.msg);
    CHECK(write_step(dir, 6, 6, 0, &e) == 0, "%.900s", e.msg);
    /* a crashed writer's temporary directory, even with a state.json, and an unfinished step */
    snprintf(p, sizeof p, "%s/.tmp_step_9", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/.tmp_step_9/state.json", dir);
    write_bytes(p, "{}", 2);
    snprintf(p, sizeof p, "%s/step_8", dir);
    mkdir(p, 0755);
    snprintf(want, sizeof want, "%s/step_6", dir);
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want), "got %s", out);
    snprintf(p, sizeof p, "%s/latest", dir);
    write_bytes(p, "step_99\n", 8); /* names a step that is gone */
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want), "got %s", out);
    write_bytes(p, "../../etc\n", 10); /* hostile */
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want), "got %s", out);
    unlink(p);
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want), "got %s", out);
    /* a stale temporary directory of the step being written is replaced */
    snprintf(p, sizeof p, "%s/.tmp_step_9/junk", dir);
    write_bytes(p, "x", 1);
    CHECK(write_step(dir, 9, 9, 0, &e) == 0, "%.900s", e.msg);
    CHECK(!exists(dir, "step_9/junk") && !exists(dir, ".tmp_step_9"), "stale tmp content survived");
    char small[8];
    CHECK(ckpt_find_latest(dir, small, sizeof small, &e) == -1, "short buffer accepted");
}

static void test_abort_leaves_the_previous_checkpoint_intact(void) {
    char dir[512], p[700], text[64], why[1024];
    path_in(dir, sizeof dir, "abort");
    ust_err e;
    CHECK(write_step(dir, 1, 1, 1, &e) == 0, "%.900s", e.msg);
    ckpt_writer *w = ckpt_begin(dir, 2, 0, NULL, NULL, NULL, &e);
    CHECK(w, "begin: %.900s", e.msg);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    CHECK(f == 0, "%.900s", e.msg);
    CHECK(!write_slice(w, f, 0, ckpt_whole(&T3[0]), 2, &e), "%.900s", e.msg);
    ckpt_abort(w);
    CHECK(!exists(dir, ".tmp_step_2") && !exists(dir, "step_2"), "abort left step 2 behind");
    snprintf(p, sizeof p, "%s/latest", dir);
    read_text(p, text, sizeof text);
    CHECK(!strcmp(text, "step_1\n"), "latest = '%s'", text);
    snprintf(p, sizeof p, "%s/step_1", dir);
    CHECK(check_step(p, 1, why, sizeof why) == 0, "%.900s", why);
}

static void test_rewriting_a_step_replaces_it_whole(void) {
    char dir[512], p[700], why[1024];
    path_in(dir, sizeof dir, "rewrite");
    ust_err e;
    CHECK(write_step(dir, 5, 1, 0, &e) == 0, "%.900s", e.msg);
    CHECK(write_step(dir, 5, 2, 0, &e) == 0, "%.900s", e.msg);
    snprintf(p, sizeof p, "%s/step_5", dir);
    CHECK(check_step(p, 2, why, sizeof why) == 0, "%.900s", why);
    CHECK(!exists(dir, ".old_step_5"), "old copy left behind");
}

static void test_shape_mismatch_and_missing_tensor_are_named(void) {
    char sd[600], want[1200];
    path_in(sd, sizeof sd, "slices/step_3");
    ust_err e;
    ckpt_reader *r = ckpt_open(sd, &e);
    CHECK(r, "open: %.900s", e.msg);
    ckpt_tensor other = {"model.layers.0.A.weight", 2, {6, 4}};
    float buf[64];
    ckpt_slice s = ckpt_whole(&other);
    int rc = ckpt_read_slice(r, "model.safetensors", &other, &s, buf, &e);
    snprintf(want, sizeof want,
             "checkpoint %s: tensor 'model.layers.0.A.weight' has shape [6, 5] but the model "
             "expects [6, 4]",
             sd);
    int shape_ok = rc == -1 && !strcmp(e.msg, want);
    char shape_msg[1024];
    snprintf(shape_msg, sizeof shape_msg, "%.1000s", e.msg);
    ckpt_tensor gone = {"model.layers.7.mlp.up_proj.weight", 2, {2, 2}};
    s = ckpt_whole(&gone);
    rc = ckpt_read_slice(r, "model.safetensors", &gone, &s, buf, &e);
    snprintf(want, sizeof want,
             "checkpoint %s: tensor 'model.layers.7.mlp.up_proj.weight' missing from "
             "model.safetensors",
             sd);
    int missing_ok = rc == -1 && !strcmp(e.msg, want);
    rc = ckpt_read_slice(r, "nonexistent.safetensors", &gone, &s, buf, &e);
    int nofile_ok = rc == -1 && strstr(e.msg, "nonexistent.safetensors");
    ckpt_close(r);
    CHECK(shape_ok, "shape message: %.900s", shape_msg);
    CHECK(missing_ok, "missing message: %.900s", e.msg);
    CHECK(nofile_ok, "missing file: %.900s", e.msg);
    path_in(sd, sizeof sd, "slices");
    CHECK(!ckpt_open(sd, &e) && strstr(e.msg, "state.json"), "a non-step dir opened: %.900s",
          e.msg);
}

/* Builds a file: 8-byte length (claimed), then the header text, then nbody data bytes. */
static void write_st(const char *path, uint64_t claimed, const char *hdr, size_t nbody) {
    size_t n = strlen(hdr);
    unsigned char *b = calloc(1, 8 + n + nbody);
    memcpy(b, &claimed, 8);
    memcpy(b + 8, hdr, n);
    write_bytes(path, b, 8 + n + nbody);
    free(b);
}

static void test_corrupt_headers_give_errors_not_crashes(void) {
    char p[600];
    path_in(p, sizeof p, "corrupt.safetensors");
    ust_err e;
    const char *good = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_st(p, strlen(good), good, 8);
    st_file *f = st_open(p, &e);
    CHECK(f && st_count(f) == 1, "the well-formed case failed: %.900s", e.msg);
    st_close(f);
    struct {
        uint64_t claimed; /* 0: the header's own length */
        const char *hdr;
        size_t nbody;
        const char *expect;
    } cases[] = {
        {1ull << 62, good, 8, "header length"},
        {4096, good, 8, "header length"},
        {0, "[1, 2, 3]", 0, "not a JSON object"},
        {0, "{\"t\": ", 0, "not valid JSON"},
        {0, "{} garbage", 0, "trailing"},
        {0, "{\"t\": 5}", 0, "not an object"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, "past the end"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "shape needs"},
        {0,
         "{\"t\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,4503599627370496],"
         "\"data_offsets\":[0,8]}}",
         8, "shape needs"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "data_offsets"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "data_offsets"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "bad shape"},
        {0, "{\"t\":{\"dtype\":\"X9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
        {0,
         "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, "appears twice"},
        /* the layout: tensors must tile the data section, as the format requires */
        {0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         16, "overlap"},
        {0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         16, "overlap"},
        {0,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
         24, "gap"},
        {0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "gap"},
        {0, good, 12, "cover 8 of the 12"},
        /* the header length one byte short of a padded header: data shifted by one */
        {strlen(good), "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} ", 8,
         "cover 8 of the 9"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(p, cases[i].claimed ? cases[i].claimed : strlen(cases[i].hdr), cases[i].hdr,
                 cases[i].nbody);
        f = st_open(p, &e);
        if (f) st_close(f);
        CHECK(!f && strstr(e.msg, cases[i].expect), "case %zu (%.200s): %.700s", i, cases[i].hdr,
              f ? "accepted" : e.msg);
    }
    write_bytes(p, "abc", 3);
    CHECK(!st_open(p, &e) && strstr(e.msg, "not a safetensors file"), "3 bytes: %.900s", e.msg);
    /* a real checkpoint file cut short: the last tensor now runs past the end */
    char src[600];
    path_in(src, sizeof src, "slices/step_3/model.safetensors");
    FILE *in = fopen(src, "rb");
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    write_bytes(p, buf, n - 4);
    CHECK(!st_open(p, &e) && strstr(e.msg, "past the end"), "truncated: %.900s", e.msg);
    /* mutations of every header byte: any outcome but a crash is acceptable */
    uint64_t x = 88172645463325252ull;
    for (int it = 0; it < 3000; it++) {
        unsigned char m[4096];
        memcpy(m, buf, n);
        for (int k = 0; k < 1 + it % 3; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t pos = (size_t)(x % 400);
            m[pos] = (unsigned char)(x >> 32);
        }
        write_bytes(p, m, n);
        f = st_open(p, &e);
        if (f) {
            int nd;
            int64_t sh[4];
            for (int i = 0; i < st_count(f); i++) {
                const float *t = st_tensor(f, st_name(f, i), &nd, sh);
                int64_t numel = 1;
                for (int d = 0; t && d < nd; d++) numel *= sh[d];
                volatile float sum = 0;
                for (int64_t k = 0; t && k < numel; k++) sum += t[k];
                (void)sum;
            }
            st_close(f);
        }
    }
}

static void test_unwritable_location_gives_clear_error_and_old_checkpoint_survives(void) {
    char file[512], dir[700], p[800], text[64], why[1024];
    ust_err e;
    /* the test runs as root, so permissions do not stop it: a parent that is a file does */
    path_in(file, sizeof file, "plainfile");
    write_bytes(file, "x", 1);
    snprintf(dir, sizeof dir, "%s/ckpt", file);
    CHECK(!ckpt_begin(dir, 1, 0, NULL, NULL, NULL, &e), "begin under a file succeeded");
    CHECK(strstr(e.msg, file) && strstr(e.msg, "Not a directory"), "message: %.900s", e.msg);
    CHECK(ckpt_find_latest(dir, p, sizeof p, &e) == -1 && strstr(e.msg, "Not a directory"),
          "find_latest: %.900s", e.msg);

    /* the temporary directory turns into something unwritable mid-checkpoint */
    path_in(dir, sizeof dir, "broken");
    CHECK(write_step(dir, 1, 1, 0, &e) == 0, "%.900s", e.msg);
    ckpt_writer *w = ckpt_begin(dir, 2, 0, NULL, NULL, NULL, &e);
    CHECK(w, "begin: %.900s", e.msg);
    snprintf(p, sizeof p, "%s/.tmp_step_2", dir);
    rmdir(p);
    write_bytes(p, "x", 1);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    int msg_ok = f == -1 && strstr(e.msg, "cannot create") &&
                 strstr(e.msg, ".tmp_step_2/model.safetensors") && strstr(e.msg, "Not a directory");
    ckpt_abort(w);
    CHECK(msg_ok, "add_file: %.900s", e.msg);
    /* the temporary directory disappears before the commit */
    w = ckpt_begin(dir, 2, 0, NULL, NULL, NULL, &e);
    CHECK(w, "begin: %.900s", e.msg);
    f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    CHECK(f == 0, "add_file: %.900s", e.msg);
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    CHECK(system(cmd) == 0, "rm");
    CHECK(ckpt_commit(w, "{}", 1, &e) == -1 && strstr(e.msg, "state.json"), "commit: %.900s",
          e.msg);
    CHECK(!exists(dir, "step_2"), "a failed commit published step 2");
    snprintf(p, sizeof p, "%s/latest", dir);
    read_text(p, text, sizeof text);
    CHECK(!strcmp(text, "step_1\n"), "latest = '%s'", text);
    snprintf(p, sizeof p, "%s/step_1", dir);
    CHECK(check_step(p, 1, why, sizeof why) == 0, "%.900s", why);
}

/* The writer's sync over the two threads: call k of each rank meets call k of the other, and
 * both learn the lowest failed rank and its reason. */
typedef struct {
    pthread_barrier_t b;
    int any[64][2];
    char why[64][2][512];
} shared_sync;
typedef struct {
    shared_sync *s;
    int rank, calls;
} rank_sync;

static int sync_two(void *arg, int failed, char *msg, size_t cap) {
    rank_sync *r = arg;
    int k = r->calls++;
    if (failed) {
        snprintf(r->s->why[k][r->rank], 512, "%s", msg ? msg : "");
        __atomic_store_n(&r->s->any[k][r->rank], 1, __ATOMIC_SEQ_CST);
    }
    pthread_barrier_wait(&r->s->b);
    for (int i = 0; i < 2; i++)
        if (__atomic_load_n(&r->s->any[k][i], __ATOMIC_SEQ_CST)) {
            if (msg && cap) snprintf(msg, cap, "%s", r->s->why[k][i]);
            return i;
        }
    return -1;
}

/* Two ranks as two threads on one barrier: the protocol of ckpt.h end to end. */
typedef struct {
    shared_sync *b;
    const char *dir;
    int rank, fail;
    int rc;
    char msg[1024];
} rank_arg;

static void *rank_main(void *va) {
    rank_arg *a = va;
    ust_err e;
    a->rc = -1;
    rank_sync rs = {a->b, a->rank, 0};
    ckpt_writer *w = ckpt_begin(a->dir, 7, a->rank, "job-7", sync_two, &rs, &e);
    if (!w) {
        snprintf(a->msg, sizeof a->msg, "%.1000s", e.msg);
        return NULL;
    }
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    int rc = f < 0;
    /* tensor parallel for A (column halves), ZeRO-style halves of B and C */
    if (!rc)
        rc = write_slice(w, f, 0,
                         (ckpt_slice){0, 6, a->rank ? 3 : 0, a->rank ? 2 : 3, 0, a->rank ? 12 : 18},
                         0, &e);
    if (!rc)
        rc =
            write_slice(w, f, 1, (ckpt_slice){0, 1, 0, 7, a->rank ? 4 : 0, a->rank ? 7 : 4}, 0, &e);
    if (!rc)
        rc = write_slice(w, f, 2, (ckpt_slice){0, 4, 0, 3, a->rank ? 5 : 0, a->rank ? 12 : 5}, 0,
                         &e);
    if (a->fail && a->rank == 1) {
        float x = 0;
        ckpt_write_slice(w, f, "no.such.tensor", &(ckpt_slice){0, 1, 0, 1, 0, 1}, &x, &e);
    }
    a->rc = ckpt_commit(w, a->rank == 0 ? "{\"step\": 7}" : NULL, 0, &e);
    snprintf(a->msg, sizeof a->msg, "%.1000s", a->rc ? e.msg : "");
    (void)rc;
    return NULL;
}

static void run_two_ranks(const char *dir, int fail, rank_arg a[2]) {
    shared_sync b = {0};
    pthread_barrier_init(&b.b, NULL, 2);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (rank_arg){.b = &b, .dir = dir, .rank = r, .fail = fail};
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&b.b);
}

static void test_two_ranks_write_their_shards_into_one_checkpoint(void) {
    char dir[512], p[700], why[1024];
    path_in(dir, sizeof dir, "ranks");
    rank_arg a[2];
    run_two_ranks(dir, 0, a);
    CHECK(a[0].rc == 0 && a[1].rc == 0, "rank 0: %.450s / rank 1: %.450s", a[0].msg, a[1].msg);
    snprintf(p, sizeof p, "%s/step_7", dir);
    CHECK(check_step(p, 0, why, sizeof why) == 0, "%.900s", why);
}

static void test_a_failed_rank_stops_the_commit(void) {
    char dir[512];
    path_in(dir, sizeof dir, "ranks_fail");
    rank_arg a[2];
    run_two_ranks(dir, 1, a);
    /* rank 1 reports its own first error; rank 0 quotes it */
    CHECK(a[1].rc == -1 && strstr(a[1].msg, "'no.such.tensor' was not declared"), "rank 1: %.900s",
          a[1].msg);
    CHECK(a[0].rc == -1 && strstr(a[0].msg, "rank 1 failed to write its part") &&
              strstr(a[0].msg, "'no.such.tensor' was not declared"),
          "rank 0: %.900s", a[0].msg);
    CHECK(!exists(dir, "step_7") && !exists(dir, ".tmp_step_7.job-7") && !exists(dir, "latest"),
          "a checkpoint with a failed rank was published, or its temporary directory left");
}

static void test_state_json_position_is_parsed_and_bad_ones_refused(void) {
    ckpt_state st;
    ust_err e;
    CHECK(ckpt_parse_state("{\"step\": 12, \"sample_index\": 96, \"loss\": 2.5}", "d", &st, &e) ==
                  0 &&
              st.step == 12 && st.sample_index == 96 && st.loss == 2.5,
          "valid state: %s", e.msg);
    CHECK(ckpt_parse_state("{\"step\": 3, \"sample_index\": 0}", "d", &st, &e) == 0 &&
              isnan(st.loss),
          "loss is optional");
    const char *bad[] = {"",
                         "{",
                         "[]",
                         "{\"step\": 1}",
                         "{\"step\": -1, \"sample_index\": 0}",
                         "{\"step\": 1.5, \"sample_index\": 0}",
                         "{\"step\": 1, \"sample_index\": 1e300}",
                         "{\"step\": \"1\", \"sample_index\": 0}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(ckpt_parse_state(bad[i], "run/step_1", &st, &e) == -1 &&
                  strstr(e.msg, "run/step_1/state.json"),
              "state '%s' accepted (or unnamed error: %s)", bad[i], e.msg);
}

static void test_state_json_must_agree_with_its_directory_and_batch(void) {
    ckpt_state st;
    ust_err e;
    const char *since = "{\"step\": 4, \"sample_index\": 28, \"batch_since\": {\"step\": 2, "
                        "\"sample_index\": 12, \"global_batch_size\": 8}}";
    CHECK(ckpt_parse_state(since, "ckpt/step_4", &st, &e) == 0 && st.batch_since_step == 2 &&
              st.batch_since_sample == 12 && st.batch_size == 8,
          "consistent state refused: %s", e.msg);
    CHECK(ckpt_parse_state(since, "ckpt/step_4/", &st, &e) == 0, "trailing slash: %s", e.msg);
    CHECK(ckpt_parse_state("{\"step\": 3, \"sample_index\": 24}", "ckpt/step_4", &st, &e) == -1 &&
              strstr(e.msg, "says step 3, but the directory is step 4"),
          "step 3 inside step_4: %s", e.msg);
    CHECK(ckpt_parse_state("{\"step\": 3, \"sample_index\": 24}", "ckpt/mine", &st, &e) == 0,
          "a directory of another name names no step: %s", e.msg);
    const char *off = "{\"step\": 4, \"sample_index\": 29, \"batch_since\": {\"step\": 2, "
                      "\"sample_index\": 12, \"global_batch_size\": 8}}";
    CHECK(ckpt_parse_state(off, "ckpt/step_4", &st, &e) == -1 &&
              strstr(e.msg, "sample_index 29 is not what step 4 implies"),
          "inconsistent sample index: %s", e.msg);
    const char *huge = "{\"step\": 9007199254740991, \"sample_index\": 0, \"batch_since\": "
                       "{\"step\": 0, \"sample_index\": 0, \"global_batch_size\": 8}}";
    CHECK(ckpt_parse_state(huge, "ckpt/step_9007199254740991", &st, &e) == -1, "2^53 - 1 steps");
}

/* mkfifo at dir/name */
static void make_fifo(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
    CHECK(mkfifo(p, 0644) == 0, "mkfifo %s", p);
}

static void test_fifos_and_directories_are_refused_not_waited_for(void) {
    char dir[512], p[700], out[700];
    path_in(dir, sizeof dir, "fifo");
    ust_err e;
    CHECK(write_step(dir, 1, 1, 0, &e) == 0, "%.900s", e.msg);
    make_fifo(dir, "latest");
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == -1 && strstr(e.msg, "latest is a FIFO"),
          "latest FIFO: %.900s", e.msg);
    snprintf(p, sizeof p, "%s/latest", dir);
    unlink(p);
    mkdir(p, 0755);
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == -1 &&
              strstr(e.msg, "latest is a directory"),
          "latest directory: %.900s", e.msg);
    rmdir(p);
    snprintf(p, sizeof p, "%s/step_1", dir);
    make_fifo(p, "state.json");
    CHECK(!ckpt_open(p, &e) && strstr(e.msg, "not a regular file (a FIFO)"), "state.json: %.900s",
          e.msg);
    make_fifo(p, "model.safetensors");
    snprintf(out, sizeof out, "%s/model.safetensors", p);
    CHECK(!st_open(out, &e) && strstr(e.msg, "not a regular file (a FIFO)"),
          "safetensors FIFO: %.900s", e.msg);
}

static void test_a_second_job_is_refused_until_the_first_ends(void) {
    char dir[512];
    path_in(dir, sizeof dir, "locked");
    ust_err e;
    ckpt_lock a, b;
    CHECK(ckpt_lock_dir(dir, &a, &e) == 0, "first lock: %.900s", e.msg);
    ckpt_lock_claim(&a); /* the run starts: the holder is recorded */
    char pid[64];
    snprintf(pid, sizeof pid, "pid %ld,", (long)getpid());
    CHECK(ckpt_lock_dir(dir, &b, &e) == -1 && strstr(e.msg, "in use by another job") &&
              strstr(e.msg, pid) && strstr(e.msg, "started "),
          "second lock: %.900s", e.msg);
    ckpt_unlock_dir(&a);
    CHECK(ckpt_lock_dir(dir, &b, &e) == 0, "after unlock: %.900s", e.msg);
    ckpt_unlock_dir(&b);
    /* a holder that dies (SIGKILL: no clean-up) never blocks the next job */
    int ready[2];
    CHECK(pipe(ready) == 0, "pipe");
    pid_t child = fork();
    if (child == 0) {
        ckpt_lock l;
        char c = ckpt_lock_dir(dir, &l, &e) == 0 ? 'y' : 'n';
        ckpt_lock_claim(&l);
        if (write(ready[1], &c, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1 && c == 'y', "the child could not lock");
    snprintf(pid, sizeof pid, "pid %ld,", (long)child);
    CHECK(ckpt_lock_dir(dir, &b, &e) == -1 && strstr(e.msg, pid), "child's lock: %.900s", e.msg);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK(ckpt_lock_dir(dir, &b, &e) == 0, "after the holder died: %.900s", e.msg);
    ckpt_unlock_dir(&b);
    close(ready[0]), close(ready[1]);
}

static void test_the_lock_checks_latest_and_clears_dead_jobs_temporaries(void) {
    char dir[512], p[700];
    path_in(dir, sizeof dir, "lockclean");
    ust_err e;
    ckpt_lock l;
    CHECK(write_step(dir, 1, 1, 0, &e) == 0, "%.900s", e.msg);
    snprintf(p, sizeof p, "%s/.tmp_step_3.deadjob", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/.tmp_step_3.deadjob/model.safetensors", dir);
    write_bytes(p, "x", 1);
    CHECK(ckpt_lock_dir(dir, &l, &e) == 0, "lock: %.900s", e.msg);
    CHECK(exists(dir, ".tmp_step_3.deadjob"), "the lock alone removed a temporary (a refused run "
                                              "must write nothing)");
    ckpt_lock_claim(&l);
    ckpt_unlock_dir(&l);
    CHECK(!exists(dir, ".tmp_step_3.deadjob") && exists(dir, "step_1"),
          "a dead job's temporary directory survived (or step_1 went)");
    snprintf(p, sizeof p, "%s/latest", dir);
    unlink(p);
    mkdir(p, 0755);
    CHECK(ckpt_lock_dir(dir, &l, &e) == -1 && strstr(e.msg, "latest is a directory"),
          "latest directory at start: %.900s", e.msg);
    rmdir(p);
    /* unique per job: two jobs' temporaries of one step never share a name */
    ckpt_writer *w = ckpt_begin(dir, 5, 0, "slurm 17/3", NULL, NULL, &e);
    CHECK(w && exists(dir, ".tmp_step_5.slurm_17_3"), "job-tagged temporary: %.900s", e.msg);
    ckpt_abort(w);
}

/* ---- manifests (issue 23): sealed steps, verification, async writes ---- */

static void flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void test_the_manifest_seals_every_file_and_a_flipped_byte_is_found(void) {
    char dir[512], sd[600], p[700];
    path_in(dir, sizeof dir, "seal");
    ust_err e;
    CHECK(write_step(dir, 5, 5, 0, &e) == 0, "%.900s", e.msg);
    snprintf(sd, sizeof sd, "%s/step_5", dir);
    CHECK(exists(sd, "manifest.json"), "no manifest.json");
    CHECK(ckpt_verify(sd, 0, 1, NULL, NULL, &e) == 0, "a fresh step fails: %.900s", e.msg);
    /* the last float of lm_head (the file's last 4 bytes) */
    snprintf(p, sizeof p, "%s/model.safetensors", sd);
    flip_byte(p, file_size(p) - 2);
    CHECK(ckpt_verify(sd, 0, 1, NULL, NULL, &e) == -1 && strstr(e.msg, "model.safetensors") &&
              strstr(e.msg, "'lm_head.weight'"),
          "flipped byte: %.900s", e.msg);
    /* two ranks split the blocks: model.safetensors is block 0 (rank 0), state.json block 1 */
    CHECK(ckpt_verify(sd, 1, 2, NULL, NULL, &e) == 0, "rank 1 verified another's block");
    CHECK(ckpt_verify(sd, 0, 2, NULL, NULL, &e) == -1, "rank 0 missed the flipped byte");
    flip_byte(p, file_size(p) - 2);
    CHECK(ckpt_verify(sd, 0, 1, NULL, NULL, &e) == 0, "restored: %.900s", e.msg);
    /* a file cut short, and state.json edited */
    snprintf(p, sizeof p, "%s/state.json", sd);
    write_bytes(p, "{\"step\": 5} ", 12);
    CHECK(ckpt_verify(sd, 0, 1, NULL, NULL, &e) == -1 && strstr(e.msg, "state.json"),
          "edited state.json: %.900s", e.msg);
}

static void test_a_step_without_a_valid_manifest_is_never_resumed_from(void) {
    char dir[512], out[600], p[700], want[700];
    path_in(dir, sizeof dir, "unsealed");
    ust_err e;
    CHECK(write_step(dir, 4, 4, 0, &e) == 0 && write_step(dir, 6, 6, 0, &e) == 0, "%.900s", e.msg);
    snprintf(want, sizeof want, "%s/step_4", dir);
    snprintf(p, sizeof p, "%s/step_6/manifest.json", dir);
    char keep[8192];
    read_text(p, keep, sizeof keep);
    unlink(p);
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want),
          "no manifest: got %s", out);
    write_bytes(p, "{\"format\": \"ustrain-manifest-1\", \"step\": 6", 41); /* cut */
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want),
          "damaged manifest: got %s", out);
    write_bytes(p, keep, strlen(keep));
    snprintf(want, sizeof want, "%s/step_6", dir);
    CHECK(ckpt_find_latest(dir, out, sizeof out, &e) == 1 && !strcmp(out, want), "got %s", out);
    snprintf(want, sizeof want, "%s/step_4", dir);
    CHECK(ckpt_find_latest_before(dir, 6, out, sizeof out, &e) == 1 && !strcmp(out, want),
          "before 6: %s", out);
    CHECK(ckpt_find_latest_before(dir, 4, out, sizeof out, &e) == 0, "before 4: %s", out);
}

static void test_bytes_no_rank_wrote_fail_the_commit(void) {
    char dir[512];
    path_in(dir, sizeof dir, "gap");
    ust_err e;
    ckpt_writer *w = ckpt_begin(dir, 3, 0, NULL, NULL, NULL, &e);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    CHECK(f == 0, "%.900s", e.msg);
    for (int i = 0; i < 2; i++) write_slice(w, f, i, ckpt_whole(&T3[i]), 0, &e);
    write_slice(w, f, 2, (ckpt_slice){0, 1, 0, 3, 0, 3}, 0, &e); /* C's rows 1..3 by nobody */
    CHECK(ckpt_commit(w, "{\"step\": 3}", 0, &e) == -1 && strstr(e.msg, "written by no rank"),
          "a hole was sealed: %.900s", e.msg);
    CHECK(!exists(dir, "step_3") && !exists(dir, "latest"), "a step with a hole was published");
}

static ckpt_writer *staged_writer(const char *dir, ckpt_stage *stage, ust_err *e) {
    ckpt_writer *w = ckpt_begin(dir, 3, 0, "job", NULL, NULL, e);
    if (!w) return NULL;
    ckpt_set_stage(w, stage);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, e);
    if (f < 0 || write_in_pieces(w, f, e)) {
        ckpt_abort(w);
        return NULL;
    }
    return w;
}

static bool same_file(const char *a, const char *b) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

static void test_async_writes_what_sync_writes_after_returning_at_once(void) {
    char sdir[512], adir[512], a[700], b[700], why[1024];
    path_in(sdir, sizeof sdir, "sync");
    path_in(adir, sizeof adir, "async");
    ust_err e;
    ckpt_writer *w = ckpt_begin(sdir, 3, 0, "job", NULL, NULL, &e);
    int f = ckpt_add_file(w, "model.safetensors", T3, 3, &e);
    CHECK(f == 0 && !write_in_pieces(w, f, &e), "%.900s", e.msg);
    CHECK(ckpt_commit(w, "{\"step\": 3}", 0, &e) == 0, "sync: %.900s", e.msg);

    ckpt_stage *stage = ckpt_stage_create((6 * 5 + 7 + 4 * 3) * 4, &e);
    CHECK(stage, "%.900s", e.msg);
    setenv("UST_FAULT_CKPT_SLEEP_MS", "400", 1); /* the writer thread holds on after a run */
    w = staged_writer(adir, stage, &e);
    CHECK(w && ckpt_commit_async(w, "{\"step\": 3}", 0, &e) == 0, "async: %.900s", e.msg);
    CHECK(ckpt_poll(w, 0, &e) == 1 && !exists(adir, "step_3"),
          "the save did not return before its writes (or published early)");
    CHECK(ckpt_poll(w, 1, &e) == 0, "async commit: %.900s", e.msg);
    unsetenv("UST_FAULT_CKPT_SLEEP_MS");
    snprintf(a, sizeof a, "%s/step_3/model.safetensors", sdir);
    snprintf(b, sizeof b, "%s/step_3/model.safetensors", adir);
    CHECK(same_file(a, b), "async and sync files differ");
    snprintf(a, sizeof a, "%s/step_3/manifest.json", sdir);
    snprintf(b, sizeof b, "%s/step_3/manifest.json", adir);
    CHECK(same_file(a, b), "async and sync manifests differ");
    snprintf(b, sizeof b, "%s/step_3", adir);
    CHECK(check_step(b, 0, why, sizeof why) == 0 && ckpt_verify(b, 0, 1, NULL, NULL, &e) == 0,
          "%.900s %.900s", why, e.msg);
    /* a stage too small for what the rank writes fails the save and publishes nothing */
    ckpt_stage *small = ckpt_stage_create(64, &e);
    path_in(adir, sizeof adir, "async_small");
    w = staged_writer(adir, small, &e);
    CHECK(!w && strstr(e.msg, "staging buffer (64 bytes) is too small"), "small stage: %.900s",
          e.msg);
    CHECK(!exists(adir, "step_3") && !exists(adir, ".tmp_step_3.job"), "a partial save remains");
    ckpt_stage_free(small);
    ckpt_stage_free(stage);
}

int main(void) {
    umask(022);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ust_test_ckpt.XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    RUN_TEST(test_slices_from_many_writers_read_back_whole_and_by_slice);
    RUN_TEST(test_file_is_standard_safetensors);
    RUN_TEST(test_slice_outside_the_tensor_is_refused_and_fails_the_commit);
    RUN_TEST(test_latest_is_updated_and_keep_last_prunes_older_steps);
    RUN_TEST(test_find_latest_ignores_temporaries_and_recovers_from_bad_latest);
    RUN_TEST(test_abort_leaves_the_previous_checkpoint_intact);
    RUN_TEST(test_rewriting_a_step_replaces_it_whole);
    RUN_TEST(test_shape_mismatch_and_missing_tensor_are_named);
    RUN_TEST(test_corrupt_headers_give_errors_not_crashes);
    RUN_TEST(test_unwritable_location_gives_clear_error_and_old_checkpoint_survives);
    RUN_TEST(test_two_ranks_write_their_shards_into_one_checkpoint);
    RUN_TEST(test_a_failed_rank_stops_the_commit);
    RUN_TEST(test_state_json_position_is_parsed_and_bad_ones_refused);
    RUN_TEST(test_state_json_must_agree_with_its_directory_and_batch);
    RUN_TEST(test_fifos_and_directories_are_refused_not_waited_for);
    RUN_TEST(test_a_second_job_is_refused_until_the_first_ends);
    RUN_TEST(test_the_lock_checks_latest_and_clears_dead_jobs_temporaries);
    RUN_TEST(test_the_manifest_seals_every_file_and_a_flipped_byte_is_found);
    RUN_TEST(test_a_step_without_a_valid_manifest_is_never_resumed_from);
    RUN_TEST(test_bytes_no_rank_wrote_fail_the_commit);
    RUN_TEST(test_async_writes_what_sync_writes_after_returning_at_once);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return TEST_SUMMARY();
}

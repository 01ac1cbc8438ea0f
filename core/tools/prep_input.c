/* prep_input: the file's bytes go through a small buffer into the decoder of their kind, and the
 * decoded text is handed to stdio through a fopencookie stream, so the reader in prep.c reads
 * plain, gzip and zstd input (and standard input) the same way. The first PEEK_CAP bytes of text
 * are decoded at open for the checks and served again before the rest. */
#include "prep_input.h"

#include "fs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

enum { RAW_CAP = 1 << 16, PEEK_CAP = 1 << 16 };
typedef enum { IN_TEXT, IN_GZIP, IN_ZSTD } in_kind;

struct prep_input {
    char path[512];
    FILE *raw;  /* the file's bytes */
    FILE *text; /* the decoded text, as handed out */
    in_kind kind;
    uint8_t raw_buf[RAW_CAP];
    size_t raw_pos, raw_len;
    int raw_eof;
    int64_t raw_bytes;
    z_stream z;
    int z_ready, z_member_done;
    ZSTD_DStream *zs;
    size_t zs_left; /* ZSTD_decompressStream's last hint: 0 once a frame is complete */
    char peek[PEEK_CAP];
    size_t peek_len, peek_pos;
    bool jsonl;
    char err[256]; /* the first decoding error */
};

static void set_error(prep_input *in, const char *what) {
    if (!in->err[0]) snprintf(in->err, sizeof in->err, "%s", what);
}

/* More raw bytes when the buffer is used up; 0 at the end of the file. */
static size_t raw_avail(prep_input *in) {
    if (in->raw_pos == in->raw_len && !in->raw_eof) {
        in->raw_len = fread(in->raw_buf, 1, RAW_CAP, in->raw);
        in->raw_pos = 0;
        in->raw_bytes += (int64_t)in->raw_len;
        if (in->raw_len == 0) {
            in->raw_eof = 1;
            if (ferror(in->raw)) set_error(in, strerror(errno));
        }
    }
    return in->raw_len - in->raw_pos;
}

static ssize_t decode_text(prep_input *in, char *out, size_t n) {
    size_t k = raw_avail(in);
    if (k > n) k = n;
    memcpy(out, in->raw_buf + in->raw_pos, k);
    in->raw_pos += k;
    return (ssize_t)k;
}

/* gzip members one after another (as `cat a.gz b.gz` makes) decode to their texts in order. */
static ssize_t decode_gzip(prep_input *in, char *out, size_t n) {
    z_stream *z = &in->z;
    z->next_out = (Bytef *)out;
    z->avail_out = (uInt)(n > (1u << 30) ? 1u << 30 : n);
    uInt want = z->avail_out;
    while (z->avail_out == want) {
        size_t k = raw_avail(in);
        if (k == 0) {
            if (!in->z_member_done) set_error(in, "the gzip stream is cut short");
            return in->err[0] ? -1 : 0;
        }
        if (in->z_member_done) { /* another member follows */
            inflateReset(z);
            in->z_member_done = 0;
        }
        z->next_in = in->raw_buf + in->raw_pos;
        z->avail_in = (uInt)k;
        int rc = inflate(z, Z_NO_FLUSH);
        in->raw_pos = in->raw_len - z->avail_in;
        if (rc == Z_STREAM_END)
            in->z_member_done = 1;
        else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            set_error(in, z->msg ? z->msg : "damaged gzip data");
            return -1;
        }
    }
    return (ssize_t)(want - z->avail_out);
}

static ssize_t decode_zstd(prep_input *in, char *out, size_t n) {
    ZSTD_outBuffer ob = {out, n, 0};
    while (ob.pos == 0) {
        size_t k = raw_avail(in);
        if (k == 0) {
            if (in->zs_left != 0) set_error(in, "the zstd stream is cut short");
            return in->err[0] ? -1 : 0;
        }
        ZSTD_inBuffer ib = {in->raw_buf, in->raw_len, in->raw_pos};
        size_t r = ZSTD_decompressStream(in->zs, &ob, &ib);
        in->raw_pos = ib.pos;
        if (ZSTD_isError(r)) {
            set_error(in, ZSTD_getErrorName(r));
            return -1;
        }
        in->zs_left = r;
    }
    return (ssize_t)ob.pos;
}

static ssize_t decode(prep_input *in, char *out, size_t n) {
    if (in->err[0]) return -1;
    return in->kind == IN_GZIP   ? decode_gzip(in, out, n)
           : in->kind == IN_ZSTD ? decode_zstd(in, out, n)
                                 : decode_text(in, out, n);
}

/* fopencookie's read: the text read ahead first, then the decoder. */
static ssize_t cookie_read(void *cookie, char *buf, size_t size) {
    prep_input *in = cookie;
    if (in->peek_pos < in->peek_len) {
        size_t k = in->peek_len - in->peek_pos;
        if (k > size) k = size;
        memcpy(buf, in->peek + in->peek_pos, k);
        in->peek_pos += k;
        return (ssize_t)k;
    }
    return decode(in, buf, size);
}

static int start_decoder(prep_input *in, ust_err *e) {
    const uint8_t *b = in->raw_buf;
    size_t k = raw_avail(in);
    if (k >= 2 && b[0] == 0x1f && b[1] == 0x8b) {
        in->kind = IN_GZIP;
        if (inflateInit2(&in->z, 15 + 16) != Z_OK)
            return ust_errf(e, "%s: zlib cannot start", in->path);
        in->z_ready = 1;
    } else if (k >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) {
        in->kind = IN_ZSTD;
        if (!(in->zs = ZSTD_createDStream()))
            return ust_errf(e, "%s: libzstd cannot start", in->path);
        in->zs_left = 1;
    }
    return 0;
}

/* The first line is a JSON object: JSON lines, whatever the name (.json from HF's to_json,
 * Megatron's tools). */
static bool looks_like_jsonl(const char *s, size_t n) {
    size_t i = 0;
    if (n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) i = 3; /* a UTF-8 byte order mark */
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    if (i >= n || s[i] != '{') return false;
    const char *nl = memchr(s + i, '\n', n - i);
    size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
    if (!nl && n == PEEK_CAP) return true; /* a first line longer than the look-ahead */
    cJSON *j = cJSON_ParseWithLength(s + i, len);
    bool obj = cJSON_IsObject(j);
    cJSON_Delete(j);
    return obj;
}

static int read_ahead(prep_input *in, bool binary_ok, ust_err *e) {
    while (in->peek_len < PEEK_CAP) {
        ssize_t got = decode(in, in->peek + in->peek_len, PEEK_CAP - in->peek_len);
        if (got < 0) return ust_errf(e, "%s: %s", in->path, in->err);
        if (got == 0) break;
        in->peek_len += (size_t)got;
    }
    /* Parquet (magic PAR1 at both ends) is columnar and usually compressed per page: data prep
     * does not read it; its text column streams in through the converter. */
    if (!binary_ok && in->kind == IN_TEXT && in->peek_len >= 4 && !memcmp(in->peek, "PAR1", 4))
        return ust_errf(
            e,
            "%s: a Parquet file; data prep reads text, JSON lines, gzip or zstd: stream "
            "its text column in with scripts/parquet-text.py [--column text] %s | "
            "ustrain data prep --out DIR -",
            in->path, in->path);
    const char *nul = memchr(in->peek, 0, in->peek_len);
    if (nul && !binary_ok)
        return ust_errf(e,
                        "%s: binary input (a NUL byte at offset %lld of its %s); data prep reads "
                        "text, JSON lines, gzip or zstd (--binary-ok tokenizes it anyway)",
                        in->path, (long long)(nul - in->peek),
                        in->kind == IN_TEXT ? "bytes" : "decompressed text");
    in->jsonl = looks_like_jsonl(in->peek, in->peek_len);
    return 0;
}

static FILE *open_raw(const char *path, ust_err *e) {
    if (strcmp(path, "-") == 0) {
        int fd = dup(0);
        FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
        if (!f) ust_errf(e, "standard input: %s", strerror(errno));
        return f;
    }
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "rb", &inner);
    if (!f) ust_errf(e, "%s", inner.msg);
    return f;
}

int prep_input_open(prep_input **out, const char *path, bool binary_ok, ust_err *e) {
    *out = NULL;
    prep_input *in = calloc(1, sizeof *in);
    if (!in) return ust_errf(e, "%s: out of memory", path);
    snprintf(in->path, sizeof in->path, "%s", strcmp(path, "-") ? path : "standard input");
    cookie_io_functions_t io = {.read = cookie_read};
    int rc = (in->raw = open_raw(path, e)) ? 0 : -1;
    if (rc == 0) rc = start_decoder(in, e);
    if (rc == 0) rc = read_ahead(in, binary_ok, e);
    if (rc == 0 && !(in->text = fopencookie(in, "rb", io)))
        rc = ust_errf(e, "%s: %s", in->path, strerror(errno));
    if (rc) {
        ust_err ignored;
        prep_input_close(in, &ignored);
        return -1;
    }
    *out = in;
    return 0;
}

FILE *prep_input_file(prep_input *in) { return in->text; }
bool prep_input_is_jsonl(const prep_input *in) { return in->jsonl; }
int64_t prep_input_raw_bytes(const prep_input *in) { return in->raw_bytes; }

const char *prep_input_kind(const prep_input *in) {
    return in->kind == IN_GZIP ? "gzip" : in->kind == IN_ZSTD ? "zstd" : "text";
}

int prep_input_close(prep_input *in, ust_err *e) {
    if (!in) return 0;
    int rc = in->err[0] ? ust_errf(e, "%s: %s", in->path, in->err) : 0;
    if (in->text) fclose(in->text);
    if (in->raw) fclose(in->raw);
    if (in->z_ready) inflateEnd(&in->z);
    if (in->zs) ZSTD_freeDStream(in->zs);
    free(in);
    return rc;
}

/* libFuzzer target: the Hugging Face importer (core/io/hf_import.c): config.json parsing, the
 * checks of the safetensors files against hf_map's table, and hf_read_slice. Input layout: bytes
 * 0-3 are config.json's length (little-endian, cut to what is there), then config.json, then
 * model.safetensors. An accepted directory must apply to a default config and let every ustrain
 * tensor be read whole and in an inner box without leaving the mapping. */
#include "fuzz_util.h"

#include "config.h"
#include "error.h"
#include "hf_import.h"
#include "hf_map.h"

static void read_box(hf_model *h, const ckpt_tensor *t, const ckpt_slice *s) {
    ust_err e;
    float *buf = malloc((size_t)(s->flat1 > 0 ? s->flat1 : 1) * sizeof *buf);
    if (!buf) abort();
    /* random tensor bytes hold NaN and Inf: refused by name (model.allow_nonfinite off), and
     * read when allowed */
    if (hf_read_slice(h, t, s, buf, &e) != 0) {
        if (!strstr(e.msg, "non-finite")) abort();
        hf_allow_nonfinite(h, 1);
        int rc = hf_read_slice(h, t, s, buf, &e);
        hf_allow_nonfinite(h, 0);
        if (rc != 0) abort();
    }
    free(buf);
}

static void read_all(hf_model *h) {
    ust_err e;
    ust_config c;
    cfg_defaults(&c);
    c.model.arch = ARCH_AUTO;
    if (hf_apply_config(h, &c, &e) != 0) abort(); /* nothing set explicitly: nothing disagrees */
    hf_table t;
    if (hf_table_build(&t, &c, &e) != 0) abort();
    for (int r = 0; r < t.n; r++)
        for (int j = 0; j < t.t[r].nsrc; j++) {
            const ckpt_tensor *x = &t.t[r].src[j];
            ckpt_slice s = ckpt_whole(x);
            if (s.flat1 > (1 << 20)) continue;
            read_box(h, x, &s);
            if (s.nrows > 1 && s.ncols > 1) { /* an inner box, cut to a flat range */
                ckpt_slice in = {1, s.nrows - 1, 1, s.ncols - 1, 1, (s.nrows - 1) * (s.ncols - 1)};
                read_box(h, x, &in);
            }
        }
    hf_table_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t cl = size >= 4 ? fuzz_le32(data) : 0;
    data += size >= 4 ? 4 : size, size -= size >= 4 ? 4 : size;
    if (cl > size) cl = size;
    fuzz_file(0, "config.json", data, cl);
    fuzz_file(1, "model.safetensors", data + cl, size - cl);
    ust_err e;
    hf_model *h = hf_open(fuzz_dir(), &e);
    if (!h) {
        if (!e.msg[0]) abort();
        return 0;
    }
    read_all(h);
    hf_close(h);
    return 0;
}

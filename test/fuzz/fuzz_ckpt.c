/* libFuzzer target: the checkpoint readers of core/io/ckpt.c: st_open (safetensors header and
 * tensor table) and ckpt_open + ckpt_parse_state + ckpt_read_slice (a step directory with
 * state.json and model.safetensors). Input layout: bytes 0-3 are the state.json length
 * (little-endian, cut to what is there), then state.json, then model.safetensors. Every tensor the
 * reader lists is read back whole and in a slice: an accepted file must never let a read leave its
 * mapping. */
#include "fuzz_util.h"

#include "ckpt.h"
#include "error.h"

static void read_tensors(const char *step, const st_file *f) {
    ust_err e;
    ckpt_reader *r = ckpt_open(step, &e);
    if (!r) {
        if (!e.msg[0]) abort();
        return;
    }
    ckpt_state st; /* what the trainer does with it first */
    ust_err se;
    if (ckpt_parse_state(ckpt_state_json(r), step, &st, &se) == 0)
        UST_ASSERT(st.step >= 0 && st.sample_index >= 0, "negative position from state.json");
    for (int i = 0; i < st_count(f) && i < 64; i++) {
        const char *name = st_name(f, i);
        int ndim = 0;
        int64_t shape[4];
        if (!name || !st_tensor(f, name, &ndim, shape) || ndim < 1 || ndim > 2) continue;
        ckpt_tensor t = {.ndim = ndim, .shape = {shape[0], ndim == 2 ? shape[1] : 0}};
        if (strlen(name) >= CKPT_NAME_MAX) continue;
        strcpy(t.name, name);
        ckpt_slice s = ckpt_whole(&t);
        int64_t numel = s.flat1;
        if (numel > (1 << 20)) continue;
        float *buf = malloc((size_t)(numel ? numel : 1) * sizeof *buf);
        if (!buf) abort();
        if (ckpt_read_slice(r, "model.safetensors", &t, &s, buf, &e) != 0) abort();
        if (s.nrows > 1 && s.ncols > 1) { /* an inner box, cut to a flat range */
            ckpt_slice in = {1, s.nrows - 1, 1, s.ncols - 1, 1, (s.nrows - 1) * (s.ncols - 1)};
            if (ckpt_read_slice(r, "model.safetensors", &t, &in, buf, &e) != 0) abort();
        }
        free(buf);
    }
    ckpt_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t sl = size >= 4 ? fuzz_le32(data) : 0;
    data += size >= 4 ? 4 : size, size -= size >= 4 ? 4 : size;
    if (sl > size) sl = size;
    static char step[512];
    if (!step[0]) snprintf(step, sizeof step, "%s", fuzz_dir());
    fuzz_file(0, "state.json", data, sl);
    const char *model = fuzz_file(1, "model.safetensors", data + sl, size - sl);
    ust_err e;
    st_file *f = st_open(model, &e);
    if (!f) {
        if (!e.msg[0]) abort();
        return 0;
    }
    for (int i = 0; i < st_count(f); i++) {
        int ndim;
        int64_t shape[4];
        const float *p = st_tensor(f, st_name(f, i), &ndim, shape);
        if (p) {
            volatile float sink = 0;
            int64_t n = 1;
            for (int d = 0; d < ndim; d++) n *= shape[d];
            if (n > 0) sink += p[0] + p[n - 1]; /* first and last element lie in the file */
            (void)sink;
        }
    }
    read_tensors(step, f);
    st_close(f);
    return 0;
}

/* libFuzzer target: data prep's input reader (core/tools/prep_input.c: gzip and zstd streams, binary
 * detection, JSON-lines detection) and meta.json (core/io/data.c data_meta_read). Input layout: byte
 * 0 picks the target (% 2: an input file, a meta.json) and, for inputs, whether binary is allowed
 * (bit 1); the rest is the file. An opened input must read to its end or report an error, never
 * more bytes than a decoder produced; meta.json must be refused or give values in range. */
#include "fuzz_util.h"

#include "data.h"
#include "prep_input.h"

static void read_input(const char *path, bool binary_ok) {
    prep_input *in = NULL;
    ust_err e;
    if (prep_input_open(&in, path, binary_ok, &e) != 0) {
        if (!e.msg[0] || in) abort();
        return;
    }
    char buf[4096];
    size_t total = 0, got;
    FILE *f = prep_input_file(in);
    while ((got = fread(buf, 1, sizeof buf, f)) > 0 && total < (64u << 20)) total += got;
    int failed = ferror(f) != 0;
    int rc = prep_input_close(in, &e);
    if (failed && rc == 0) abort(); /* a read error must come with its reason */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int target = data[0] % 2, binary_ok = data[0] >> 1 & 1;
    if (target == 0) {
        read_input(fuzz_file(0, "input", data + 1, size - 1), binary_ok);
        return 0;
    }
    fuzz_file(0, "meta.json", data + 1, size - 1);
    char glob[600];
    snprintf(glob, sizeof glob, "%s/train_*.bin", fuzz_dir());
    data_meta meta;
    ust_err e;
    int rc = data_meta_read(glob, &meta, &e);
    if (rc < 0 && !e.msg[0]) abort();
    if (rc == 1 && (meta.vocab_size < -1 || meta.eot_id < -1)) abort();
    return 0;
}

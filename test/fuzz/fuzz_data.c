/* libFuzzer target: the token-shard readers of core/io/data.c (llm.c and nanoGPT headers, Megatron
 * .bin + .idx). Input layout: byte 0 picks the format (% 3: llm.c, nanoGPT, Megatron) and the
 * vocabulary checked against (byte 0 / 3 % 3: none, 512, 65536); for Megatron bytes 1-4 are the
 * .idx length (little-endian, cut to what is there), then the .idx, then the .bin; otherwise the
 * rest is the shard. An accepted dataset must hand out samples without reading past a shard. */
#include "fuzz_util.h"

#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const int vocabs[3] = {0, 512, 65536};
    ust_data_format fmt = (ust_data_format)(data[0] % 3);
    int vocab = vocabs[data[0] / 3 % 3];
    data++, size--;
    const char *bin;
    if (fmt == DATA_MEGATRON) {
        size_t il = size >= 4 ? fuzz_le32(data) : 0;
        data += size >= 4 ? 4 : size, size -= size >= 4 ? 4 : size;
        if (il > size) il = size;
        fuzz_file(1, "shard.idx", data, il);
        bin = fuzz_file(0, "shard.bin", data + il, size - il);
    } else {
        bin = fuzz_file(0, "shard.bin", data, size);
    }
    ust_dataset *d = NULL;
    ust_err e;
    if (data_open(&d, bin, fmt, vocab, &e) != 0) {
        if (!e.msg[0] || d) abort();
        return 0;
    }
    const int T = 4;
    if (data_check_seq_len(d, T, &e) == 0) {
        int32_t out[3 * (T + 1)];
        int64_t S = data_num_samples(d, T);
        data_get_samples(d, 0, 3, T, false, 1, out);
        data_get_samples(d, S > 0 ? S - 1 : 0, 3, T, true, 7, out);
        for (int i = 0; i < 3 * (T + 1); i++)
            if (vocab && (out[i] < 0 || out[i] >= vocab)) abort();
    }
    data_close(d);
    return 0;
}

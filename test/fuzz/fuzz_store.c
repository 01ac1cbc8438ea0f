/* libFuzzer target: the frame parser of the bootstrap TCP key-value store
 * (parallel/comm/bootstrap_store.c, the bytes rank 0's server reads from any client that connects).
 * The input is a byte stream as a socket would deliver it: frames are parsed one after another
 * until the parser needs more bytes or rejects the stream. Every accepted frame must re-encode to
 * exactly the bytes it came from, and every prefix of a frame must ask for more bytes (never
 * accept or over-read). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_impl.h"

static uint8_t out[4 + STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t off = 0;
    while (off < size) {
        store_msg m;
        size_t used = 0;
        char why[256] = "";
        int r = store_msg_parse(data + off, size - off, &m, &used, why, sizeof why);
        if (r < 0) {
            if (!why[0]) abort(); /* a rejection must say why */
            break;
        }
        if (r == 0) break;
        if (used < 4 + STORE_HDR || used > size - off) abort();
        size_t n = store_msg_encode(out, sizeof out, m.op, m.a, m.b, m.key[0] ? m.key : NULL, m.val,
                                    m.vallen);
        if (n != used || memcmp(out, data + off, n) != 0) abort(); /* parse o encode = identity */
        /* A strict prefix of a valid frame is never a frame. */
        store_msg m2;
        size_t used2;
        if (store_msg_parse(data + off, used - 1, &m2, &used2, why, sizeof why) == 1) abort();
        off += used;
    }
    return 0;
}

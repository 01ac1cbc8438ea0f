/* data_pack: whole examples packed into windows (data.packing: first_fit), for data.c.
 * An example is a run of the token stream ended by the end-of-text token (a trailing run without
 * one is dropped). Examples are taken in stream order in chunks of `buffer`; each chunk is packed
 * first-fit-decreasing (longest first, ties in stream order, each into the first window with
 * room) into windows of T+1 tokens, the windows numbered in chunk order, then by opening order.
 * The result is a pure function of the stream, T, buffer and the overlong rule, so a sample index
 * restores it exactly. An example longer than T+1 is split into pieces of T+1 overlapping by one
 * token (each token a target once) or dropped. A window is its pieces in order, then end-of-text
 * padding; flags: 1 target, 0 not (a piece's first token: its context is another example), 2 pad.
 */
#ifndef UST_DATA_PACK_H
#define UST_DATA_PACK_H

#include "data.h"

typedef struct data_packer data_packer;

int data_pack_build(data_packer **out, const ust_dataset *d, int T, int eot, int buffer, bool drop,
                    data_pack_stats *st, ust_err *e);
int64_t data_pack_windows(const data_packer *p);
/* Window w: T+1 tokens and their flags. */
void data_pack_window(const data_packer *p, const ust_dataset *d, int64_t w, int32_t *tok,
                      uint8_t *flags);
void data_pack_free(data_packer *p);

#endif

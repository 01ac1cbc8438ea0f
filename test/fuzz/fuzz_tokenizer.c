/* libFuzzer target: the Hugging Face tokenizer.json loader of core/tools/tokenizer.c (tok_load), then
 * encoding a fixed text with whatever it accepted. Input: the file's bytes. An accepted file must
 * encode without reading outside its tables, and every id it emits must be below its vocabulary
 * size; a refused one must say why. */
#include "fuzz_util.h"

#include "error.h"
#include "tokenizer.h"

static const char TEXT[] = "Hello world! It's 2026: naïve café, 12345 tokens\n\n  <|endoftext|>x";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, "tokenizer.json", data, size);
    tok_tokenizer *t = NULL;
    ust_err e;
    e.msg[0] = 0;
    if (tok_load(&t, path, &e)) {
        if (!e.msg[0]) abort(); /* a refusal names its reason */
        return 0;
    }
    tok_work *w = tok_work_new(t);
    tok_ids ids = {0};
    tok_encode(t, w, TEXT, sizeof TEXT - 1, &ids);
    int vocab = tok_vocab_size(t);
    for (int64_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= vocab) abort();
    free(ids.ids);
    tok_work_free(w);
    tok_free(t);
    return 0;
}

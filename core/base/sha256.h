/* sha256: the SHA-256 digest of a file, as lower-case hex (OpenSSL's libcrypto computes it).
 * Data prep records the tokenizer file's digest in meta.json, training copies it into the
 * checkpoint's state.json, and export checks the file still has it before copying the file. */
#ifndef UST_SHA256_H
#define UST_SHA256_H

#include "error.h"

enum { SHA256_HEX_LEN = 64 };

/* hex gets 64 hex digits and a NUL. Returns 0, or -1 with a message naming the file. */
int sha256_file(const char *path, char hex[SHA256_HEX_LEN + 1], ust_err *e);

#endif

/* sha256: a file's SHA-256 through libcrypto's EVP interface (the low-level SHA256_* calls are
 * deprecated in OpenSSL 3). The file is streamed, so a large tokenizer is not held in memory. */
#include "sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "fs.h"

int sha256_file(const char *path, char hex[SHA256_HEX_LEN + 1], ust_err *e) {
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "rb", &inner);
    if (!f) return ust_errf(e, "%s", inner.msg);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    unsigned char buf[1 << 16], md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, f)) > 0;)
        ok = EVP_DigestUpdate(ctx, buf, n);
    int read_error = ferror(f);
    ok = ok && !read_error && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen == 32;
    EVP_MD_CTX_free(ctx);
    fclose(f);
    if (read_error) return ust_errf(e, "%s: read error: %s", path, strerror(errno));
    if (!ok) return ust_errf(e, "%s: SHA-256 failed (libcrypto)", path);
    for (unsigned i = 0; i < mdlen; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

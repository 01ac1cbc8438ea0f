#include "fs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int fs_mkdir_p(const char *dir, ust_err *e) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return ust_errf(e, "%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return ust_errf(e, "cannot create directory %s: %s", buf, strerror(errno));
        struct stat st;
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
            return ust_errf(e, "cannot create directory %s: %s", buf, strerror(ENOTDIR));
        *p = c;
        if (!c) break;
    }
    return 0;
}

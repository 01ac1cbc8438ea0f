/* fs: the file-system helper every writer shares (checkpoints, data shards, metrics, the
 * effective config): mkdir -p with a clear message naming the path that failed. */
#ifndef UST_FS_H
#define UST_FS_H

#include "error.h"

/* Creates dir and its missing parents (mode 0777 & ~umask). Fails, naming the path, when a
 * component cannot be created or exists and is not a directory. */
int fs_mkdir_p(const char *dir, ust_err *e);

#endif

/* dynlib: the CUDA and NCCL libraries, opened with dlopen only when a CUDA backend or an NCCL
 * communicator is made, so the binaries start (and run CPU configs) where they are missing.
 * A library is looked up in $UST_CUDA_LIB_DIR (colon-separated), then by the standard search
 * (LD_LIBRARY_PATH, ld.so.cache), then in the toolkit the build used; a miss names the library
 * and every place searched. Before the CUDA runtime, the driver (libcuda.so.1) is checked: when
 * it is older than the runtime and the toolkit has compat/libcuda.so.1, that one is loaded in its
 * place. Opened libraries stay loaded for the life of the process (RTLD_GLOBAL, so a later
 * dlopen of the same soname, e.g. by the backend plugin, gets them). */
#ifndef UST_DYNLIB_H
#define UST_DYNLIB_H

#include <stddef.h>

#include "error.h"

/* The handle of library soname (e.g. "libnccl.so.2"), opened as above; NULL with a message
 * naming it, the search path and the loader's reasons. */
void *dynlib_open(const char *soname, ust_err *e);
/* Symbol name of the library soname opened as h: NULL with a message naming both when absent. */
void *dynlib_sym(void *h, const char *soname, const char *name, ust_err *e);
/* The CUDA runtime (libcudart.so.<major of the toolkit built against>), after the driver check
 * above; the note (may be NULL) gets what that check found ("" when nothing to say). */
void *dynlib_cudart(ust_err *e, char *note, size_t note_size);
/* The soname of a CUDA toolkit library built against: stem "libcublas" -> "libcublas.so.13". */
const char *dynlib_cuda_soname(const char *stem, char *buf, size_t size);

#endif

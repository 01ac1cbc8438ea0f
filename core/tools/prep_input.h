/* prep_input: one input of `ustrain data prep` as a stream of text. A file, or "-" for standard
 * input; gzip and zstd are recognised by their magic bytes (not the name) and decompressed as
 * they are read (zlib, libzstd; concatenated members and frames included); the first 64 KiB of
 * the text are read ahead to refuse binary input (a NUL byte) unless binary_ok, and to recognise
 * JSON lines by content (the first line is a JSON object), whatever the file is called. The text
 * is read with stdio from prep_input_file; a damaged compressed stream is an error at the read
 * that meets it, reported by prep_input_close. */
#ifndef UST_PREP_INPUT_H
#define UST_PREP_INPUT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

typedef struct prep_input prep_input;

int prep_input_open(prep_input **out, const char *path, bool binary_ok, ust_err *e);
FILE *prep_input_file(prep_input *in);
bool prep_input_is_jsonl(const prep_input *in);
const char *prep_input_kind(const prep_input *in);  /* "text", "gzip" or "zstd" */
int64_t prep_input_raw_bytes(const prep_input *in); /* of the file itself, read so far */
/* Closes it; -1 with the reason when the compressed stream was damaged or cut short. */
int prep_input_close(prep_input *in, ust_err *e);

#endif

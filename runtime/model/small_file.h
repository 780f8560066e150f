/*
 * small_file.h - reading a whole small text file (configs, profiles) into
 * memory, refusing anything that is not a regular file of at most max_bytes,
 * and writing one atomically.
 */
#ifndef KT_SMALL_FILE_H
#define KT_SMALL_FILE_H

#include <stddef.h>

#include "status.h"

/* *text (malloc'd, not NUL-terminated) and *len; errors name the path. */
kt_status kt_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len, kt_err *err);

/* Writes len bytes to path atomically: a temporary file beside it (same
 * folder, so the rename cannot cross file systems), fsync, then rename over
 * path.  On any failure the temporary file is removed and an earlier file at
 * path is left as it was; errors name the path. */
kt_status kt_write_file_atomic(const char *path, const void *data, size_t len, kt_err *err);

#endif

/*
 * small_file.h - reading a whole small text file (configs, profiles) into
 * memory, refusing anything that is not a regular file of at most max_bytes.
 */
#ifndef KT_SMALL_FILE_H
#define KT_SMALL_FILE_H

#include <stddef.h>

#include "status.h"

/* *text (malloc'd, not NUL-terminated) and *len; errors name the path. */
kt_status kt_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len, kt_err *err);

#endif

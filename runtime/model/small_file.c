/*
 * small_file.c - see small_file.h.
 */
#include "small_file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

kt_status kt_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len, kt_err *err)
{
    *text = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kt_err_set(err, KT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (unsigned long long)st.st_size > max_bytes) {
        fclose(f);
        return kt_err_set(err, KT_ERR_IO, "%s: not a regular file of at most %zu MiB", path, max_bytes >> 20);
    }
    const size_t n = (size_t)st.st_size;
    char *buf = malloc(n ? n : 1);
    if (!buf) {
        fclose(f);
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    }
    const bool ok = fread(buf, 1, n, f) == n;
    fclose(f);
    if (!ok) {
        free(buf);
        return kt_err_set(err, KT_ERR_IO, "%s: short read", path);
    }
    *text = buf;
    *len = n;
    return KT_OK;
}

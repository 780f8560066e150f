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
#include <unistd.h>

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

kt_status kt_write_file_atomic(const char *path, const void *data, size_t len, kt_err *err)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + 16);
    if (!tmp)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, n + 16, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        kt_status st = kt_err_set(err, KT_ERR_IO, "%s: cannot create a temporary file beside it: %s", path,
                                  strerror(errno));
        free(tmp);
        return st;
    }
    const char *p = data;
    size_t left = len;
    bool ok = true;
    while (ok && left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        ok = w > 0;
        if (ok) {
            p += w;
            left -= (size_t)w;
        }
    }
    int saved = errno;
    ok = ok && fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    if (!ok)
        saved = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        saved = errno;
    }
    kt_status st = KT_OK;
    if (!ok) {
        unlink(tmp);
        st = kt_err_set(err, KT_ERR_IO, "%s: cannot write: %s", path, strerror(saved));
    }
    free(tmp);
    return st;
}

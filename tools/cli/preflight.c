/*
 * preflight.c - checks made before any weight is read (see preflight.h).
 */
#include "preflight.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

kt_status kt_tool_check_writable(const char *option, const char *path, kt_err *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = 0; /* "/x" -> "/" */
    const char *folder = slash ? dir : ".";
    struct stat st;
    if (!path[0] || (path[strlen(path) - 1] == '/'))
        return kt_err_set(err, KT_ERR_INVALID, "%s '%s' names a folder: give a file name", option, path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return kt_err_set(err, KT_ERR_INVALID, "%s %s is a folder: give a file name (e.g. %s/out)", option, path, path);
    if (stat(folder, &st) != 0)
        return kt_err_set(err, KT_ERR_IO, "%s %s: the folder %s: %s: create it first, or give a path in a folder "
                                          "that exists",
                          option, path, folder, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return kt_err_set(err, KT_ERR_IO, "%s %s: %s is a file, not a folder: give a path in a folder", option, path,
                          folder);
    if (access(folder, W_OK | X_OK) != 0)
        return kt_err_set(err, KT_ERR_IO, "%s %s: cannot write into %s: %s: give a path in a folder you can write to",
                          option, path, folder, strerror(errno));
    if (access(path, F_OK) == 0 && access(path, W_OK) != 0)
        return kt_err_set(err, KT_ERR_IO, "%s %s: the file exists and cannot be written: %s", option, path,
                          strerror(errno));
    return KT_OK;
}

uint32_t kt_tool_context(const struct kt_model *m, uint32_t ctx)
{
    if (ctx)
        return ctx;
    return m->hp.n_ctx_train && m->hp.n_ctx_train < KT_TOOL_DEFAULT_CTX ? m->hp.n_ctx_train : KT_TOOL_DEFAULT_CTX;
}

kt_status kt_tool_check_context(const char *option, uint32_t ctx, const struct kt_model *m, const char *path,
                                kt_err *err)
{
    const uint32_t train = m->hp.n_ctx_train;
    if (ctx && train && ctx > train)
        return kt_err_set(err, KT_ERR_INVALID,
                          "%s %u is more than %s was trained for (context_length %u): give %s %u or less", option,
                          ctx, path, train, option, train);
    return KT_OK;
}

kt_status kt_tool_check_positions(const char *what, uint64_t positions, const struct kt_model *m, const char *path,
                                  const char *fix, kt_err *err)
{
    const uint32_t train = m->hp.n_ctx_train;
    const uint64_t most = train && train < KT_TOOL_MAX_CTX ? train : KT_TOOL_MAX_CTX;
    if (positions <= most)
        return KT_OK;
    if (most == train)
        return kt_err_set(err, KT_ERR_INVALID, "%s need %llu positions, more than %s was trained for "
                          "(context_length %u): %s", what, (unsigned long long)positions, path, train, fix);
    return kt_err_set(err, KT_ERR_INVALID, "%s need %llu positions, more than the engine holds (%u): %s", what,
                      (unsigned long long)positions, KT_TOOL_MAX_CTX, fix);
}

/*
 * test_layering.c - the subsystems' floors hold in the source, not only in the
 * build: every #include "..." of kernels/, runtime/<subsystem>/ and placement/
 * names a header of its own subsystem or of one it may use (docs/architecture.md):
 *
 *   kernels                      nothing of ours
 *   runtime/model, runtime/host  kernels
 *   runtime/text                 model
 *   runtime/forward              model, host
 *   runtime/dist                 forward (and what it uses)
 *   runtime/serve                forward, text (and what they use)
 *   placement                    forward (and what it uses)
 *   tools                        all of them, except the engine's test knobs (engine_test.h)
 *
 * The build already refuses an upward include (each library's only public include
 * path is its own folder); this also catches one spelled as a relative path
 * ("../serve/x.h"), which the compiler would find.  No subsystem may use one
 * that uses it, so no circle can join files of different subsystems.
 */
#include "testlib.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { KERNELS, MODEL, HOST, TEXT, FORWARD, DIST, SERVE, PLACEMENT, TOOLS, N_SUBSYSTEMS };

static const struct subsystem {
    const char *dir;        /* relative to the source tree */
    unsigned may_use;       /* bit s: may include subsystem s's headers */
} subsystems[N_SUBSYSTEMS] = {
    [KERNELS] = {"kernels", 1u << KERNELS},
    [MODEL] = {"runtime/model", 1u << KERNELS | 1u << MODEL},
    [HOST] = {"runtime/host", 1u << KERNELS | 1u << HOST},
    [TEXT] = {"runtime/text", 1u << KERNELS | 1u << MODEL | 1u << TEXT},
    [FORWARD] = {"runtime/forward", 1u << KERNELS | 1u << MODEL | 1u << HOST | 1u << FORWARD},
    [DIST] = {"runtime/dist", 1u << KERNELS | 1u << MODEL | 1u << HOST | 1u << FORWARD | 1u << DIST},
    [SERVE] = {"runtime/serve",
               1u << KERNELS | 1u << MODEL | 1u << HOST | 1u << TEXT | 1u << FORWARD | 1u << SERVE},
    [PLACEMENT] = {"placement", 1u << KERNELS | 1u << MODEL | 1u << HOST | 1u << FORWARD | 1u << PLACEMENT},
    [TOOLS] = {"tools", ~0u},
};

#define MAX_HEADERS 512

/* Every header of the subsystems: its path relative to its subsystem's folder. */
static struct header {
    char path[256];
    int owner;
} headers[MAX_HEADERS];
static int n_headers;

typedef void (*file_fn)(const char *root, int subsystem, const char *rel);

/* Calls fn for every .c/.h/.cu/.cuh file under root/dir (rel: path below dir). */
static void walk(const char *root, int subsystem, const char *rel, file_fn fn)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s%s%s", root, subsystems[subsystem].dir, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    KT_CHECK(d != NULL, "cannot open %s", path);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
        char full[1536];
        snprintf(full, sizeof full, "%s/%s", path, de->d_name);
        struct stat st;
        if (stat(full, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            walk(root, subsystem, sub, fn);
            continue;
        }
        const char *dot = strrchr(de->d_name, '.');
        if (dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") || !strcmp(dot, ".cuh")))
            fn(root, subsystem, sub);
    }
    closedir(d);
}

static void add_header(const char *root, int subsystem, const char *rel)
{
    (void)root;
    const char *dot = strrchr(rel, '.');
    if (strcmp(dot, ".h") != 0 && strcmp(dot, ".cuh") != 0)
        return;
    KT_CHECK(n_headers < MAX_HEADERS, "more than %d headers: raise MAX_HEADERS", MAX_HEADERS);
    if (n_headers >= MAX_HEADERS)
        return;
    snprintf(headers[n_headers].path, sizeof headers[n_headers].path, "%s", rel);
    headers[n_headers++].owner = subsystem;
}

/* The subsystem whose header `name` is: one whose path ends in "/name" or is
 * "name" (includes name headers below an include directory: "cpu/dispatch.h",
 * "kt_cuda.h" of kernels/cuda).  -1: none; -2: headers of several subsystems. */
static int owner_of(const char *name)
{
    int owner = -1;
    const size_t n = strlen(name);
    for (int i = 0; i < n_headers; i++) {
        const char *p = headers[i].path;
        const size_t len = strlen(p);
        if (len < n || strcmp(p + len - n, name) != 0 || (len > n && p[len - n - 1] != '/'))
            continue;
        if (owner >= 0 && owner != headers[i].owner)
            return -2;
        owner = headers[i].owner;
    }
    return owner;
}

static int n_includes, n_files;

static void check_file(const char *root, int subsystem, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", root, subsystems[subsystem].dir, rel);
    FILE *f = fopen(path, "r");
    KT_CHECK(f != NULL, "cannot read %s", path);
    if (!f)
        return;
    n_files++;
    char line[1024];
    for (int lineno = 1; fgets(line, sizeof line, f); lineno++) {
        const char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "#include \"", 10) != 0)
            continue;
        char name[256];
        const char *end = strchr(p + 10, '"');
        if (!end || (size_t)(end - p - 10) >= sizeof name)
            continue;
        memcpy(name, p + 10, (size_t)(end - p - 10));
        name[end - p - 10] = 0;
        n_includes++;
        KT_CHECK(strstr(name, "..") == NULL, "%s/%s:%d includes \"%s\": a path through \"..\" skips the floors",
                     subsystems[subsystem].dir, rel, lineno, name);
        KT_CHECK(subsystem == FORWARD || strcmp(name, "engine_test.h") != 0,
                 "%s/%s:%d includes engine_test.h: its knobs are for tests only", subsystems[subsystem].dir, rel,
                 lineno);
        const int owner = owner_of(name);
        if (owner == -1)
            continue; /* a header of no subsystem (a generated or system one): not ours to check */
        KT_CHECK(owner != -2, "%s/%s:%d: \"%s\" names headers in several subsystems", subsystems[subsystem].dir,
                     rel, lineno, name);
        if (owner >= 0)
            KT_CHECK(subsystems[subsystem].may_use & (1u << owner),
                         "%s/%s:%d includes \"%s\" of %s, which %s may not use", subsystems[subsystem].dir, rel,
                         lineno, name, subsystems[owner].dir, subsystems[subsystem].dir);
    }
    fclose(f);
}

static const char *source_root;

static void subsystems_include_only_lower_floors(void)
{
    const char *root = source_root;
    for (int s = 0; s < N_SUBSYSTEMS; s++)
        walk(root, s, "", add_header);
    for (int s = 0; s < N_SUBSYSTEMS; s++)
        walk(root, s, "", check_file);
    /* The walk saw the tree: the engine's header, the GGUF reader's, the scheduler's. */
    KT_CHECK(owner_of("engine.h") == FORWARD, "engine.h: %d", owner_of("engine.h"));
    KT_CHECK(owner_of("gguf.h") == MODEL, "gguf.h: %d", owner_of("gguf.h"));
    KT_CHECK(owner_of("scheduler.h") == SERVE, "scheduler.h: %d", owner_of("scheduler.h"));
    KT_CHECK(owner_of("cpu/dispatch.h") == KERNELS, "cpu/dispatch.h: %d", owner_of("cpu/dispatch.h"));
    KT_CHECK(n_files > 50 && n_includes > 100, "%d files, %d includes", n_files, n_includes);
    printf("layering: %d files, %d includes checked\n", n_files, n_includes);
}

/* The rules themselves: upward is refused, downward allowed, no two subsystems use each other. */
static void floors_form_no_circle(void)
{
    KT_CHECK(!(subsystems[MODEL].may_use & (1u << SERVE)), "the model's floor may use the serving core");
    KT_CHECK(subsystems[SERVE].may_use & (1u << MODEL), "the serving core may not use the model");
    /* No pair of subsystems may use each other: the floors form no circle. */
    for (int a = 0; a < TOOLS; a++)
        for (int b = 0; b < TOOLS; b++)
            if (a != b)
                KT_CHECK(!((subsystems[a].may_use >> b) & 1u && (subsystems[b].may_use >> a) & 1u),
                             "%s and %s may use each other", subsystems[a].dir, subsystems[b].dir);
}

int main(void)
{
    source_root = getenv("KT_SOURCE_DIR");
    if (!source_root)
        return kt_test_skip("KT_SOURCE_DIR is not set (ctest sets it)");
    KT_RUN(subsystems_include_only_lower_floors);
    KT_RUN(floors_form_no_circle);
    return kt_test_finish();
}

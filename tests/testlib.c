/*
 * testlib.c - harness helpers for kt tests (see testlib.h).
 */
#include "testlib.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int kt_test_failures;
int kt_test_checks;

int kt_test_finish(void)
{
    printf("%d checks, %d failed\n", kt_test_checks, kt_test_failures);
    return kt_test_failures ? 1 : 0;
}

int kt_test_skip(const char *reason)
{
    printf("skipped: %s\n", reason);
    return 77;
}

const char *kt_test_path(const char *name)
{
    static char buf[8][1024];
    static int next;
    char *out = buf[next++ % 8];
    const char *dir = getenv("KT_TEST_TMP");
    snprintf(out, sizeof buf[0], "%s/%s.%d", dir && *dir ? dir : "/tmp", name, (int)getpid());
    return out;
}

const char *kt_test_tool(const char *name)
{
    static char buf[4][1024];
    static int next;
    char *out = buf[next++ % 4];
    const char *dir = getenv("KT_BIN_DIR");
    snprintf(out, sizeof buf[0], "%s/%s", dir && *dir ? dir : ".", name);
    return out;
}

int kt_test_system(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc == -1)
        return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

void *kt_test_read_file(const char *path, size_t *bytes)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    void *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    ((char *)buf)[n] = 0;
    *bytes = (size_t)n;
    return buf;
}

unsigned long long kt_test_rand_u64(unsigned long long *state)
{
    unsigned long long z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

float kt_test_rand_uniform(unsigned long long *state, float lo, float hi)
{
    double u = (double)(kt_test_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

float kt_test_rand_normal(unsigned long long *state)
{
    double u1 = ((double)(kt_test_rand_u64(state) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(kt_test_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

bool kt_test_write_tree_file(const char *root, const char *rel, const char *text)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", root, rel) >= (int)sizeof path)
        return false;
    mkdir(root, 0755);
    for (char *slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        mkdir(path, 0755); /* an existing folder is fine; a real failure shows at fopen */
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    const bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

bool kt_test_files_equal(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *pa = kt_test_read_file(a, &na), *pb = kt_test_read_file(b, &nb);
    bool eq = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return eq;
}

void *kt_test_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/*
 * cgroup.c - cgroup v1 and v2 memory and CPU limits, read from the files the
 * kernel exports (see cgroup.h).  Small text files only, parsed strictly: a
 * value that is not what the kernel writes is an error quoting the file,
 * never a guess, and never a crash.  Nothing is cached: limits and usage
 * change under us.
 */
#include "cgroup.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest file read whole (memory.stat is the longest, ~2 KiB). */
#define SMALL_FILE_BYTES 16384
/* cgroup v1 writes PAGE_COUNTER_MAX pages (~2^63 bytes) for "no limit". */
#define V1_NO_LIMIT_BYTES (1ull << 62)
/* Cap on CPU numbers in a list: far above any kernel's NR_CPUS. */
#define MAX_CPU_NUMBER (1u << 20)

/* ---- files ------------------------------------------------------------------------------ */

/* s as a message quotes it: at most 48 bytes, control and non-ASCII bytes as '?'. */
static const char *quoted(const char *s, char out[64])
{
    size_t n = 0;
    for (; s[n] && n < 48; n++)
        out[n] = s[n] >= 0x20 && s[n] < 0x7f ? s[n] : '?';
    strcpy(out + n, s[n] ? "..." : "");
    return out;
}

/* dir + "/" + name into out; false when it does not fit. */
static bool join(char *out, size_t size, const char *dir, const char *name)
{
    const size_t d = strlen(dir), n = strlen(name);
    if (d + 1 + n >= size)
        return false;
    memmove(out, dir, d);
    out[d] = '/';
    memcpy(out + d + 1, name, n + 1);
    return true;
}

/* Reads path whole into buf, NUL-terminated, trailing white space cut.  A
 * file that is not there sets *missing; one that cannot be read, is longer
 * than buf or holds a NUL byte is an error. */
static kt_status read_small(const char *path, char *buf, size_t size, bool *missing, kt_err *err)
{
    *missing = false;
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) {
            *missing = true;
            return KT_OK;
        }
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    size_t n = fread(buf, 1, size - 1, f);
    const bool longer = n == size - 1 && fgetc(f) != EOF;
    const bool failed = ferror(f);
    fclose(f);
    if (failed)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot read", path);
    if (longer)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: longer than %zu bytes, not what the kernel writes there", path,
                          size - 1);
    if (memchr(buf, 0, n))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: holds a NUL byte, not what the kernel writes there", path);
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = 0;
    return KT_OK;
}

/* A whole decimal number, no sign, nothing after it. */
static bool parse_u64(const char *s, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        const unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (*s)
        return false;
    *out = v;
    return true;
}

/* Counts the CPUs of a kernel CPU list ("0-3,8,10-11"); false for anything else. */
static bool count_cpu_list(const char *s, int *count)
{
    *count = 0;
    if (!*s)
        return false;
    for (;;) {
        char *end;
        if (*s < '0' || *s > '9')
            return false;
        unsigned long a = strtoul(s, &end, 10), b = a;
        s = end;
        if (*s == '-') {
            if (s[1] < '0' || s[1] > '9')
                return false;
            b = strtoul(s + 1, &end, 10);
            s = end;
        }
        if (a > b || b >= MAX_CPU_NUMBER)
            return false;
        *count += (int)(b - a + 1);
        if (!*s)
            return true;
        if (*s++ != ',')
            return false;
    }
}

/* The value of "key N" in a memory.stat text; *found false when absent. */
static bool stat_value(const char *text, const char *key, uint64_t *v, bool *found)
{
    *found = false;
    const size_t k = strlen(key);
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        const size_t len = eol ? (size_t)(eol - line) : strlen(line);
        if (len > k && !strncmp(line, key, k) && line[k] == ' ') {
            char num[32];
            const size_t n = len - k - 1;
            if (n == 0 || n >= sizeof num)
                return false;
            memcpy(num, line + k + 1, n);
            num[n] = 0;
            *found = true;
            return parse_u64(num, v);
        }
        line += len + (eol != NULL);
    }
    return true;
}

/* ---- where this process's groups are ------------------------------------------------------ */

/* One controller's hierarchy as this process sees it. */
struct place {
    int version;                       /* 0: not found (no limits known), 1 or 2 */
    char leaf[KT_CGROUP_PATH_MAX];     /* this process's group's directory, root prefix included */
    size_t top_len;                    /* leaf[0..top_len) is the mount point: walking up stops there */
    char note[KT_CGROUP_PATH_MAX + 128]; /* why the group's files cannot be read, if so */
};

/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
    char *o = s;
    for (const char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' && p[3] <= '7') {
            *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
}

/* True when the comma-separated list holds item exactly. */
static bool list_has(const char *list, const char *item)
{
    const size_t n = strlen(item);
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && !strncmp(p, item, n))
            return true;
        p += len + (comma != NULL);
    }
    return false;
}

/* From proc/self/cgroup: this process's group in the v1 hierarchy holding
 * controller (v1_path) and in the v2 one (v2_path); "" where it has none.
 * *exists false when the file is not there (no cgroups). */
static kt_status read_self_cgroup(const char *prefix, const char *controller, char *v1_path, char *v2_path,
                                  bool *exists, kt_err *err)
{
    char path[KT_CGROUP_PATH_MAX];
    v1_path[0] = v2_path[0] = 0;
    *exists = false;
    if (!join(path, sizeof path, prefix, "proc/self/cgroup"))
        return kt_err_set(err, KT_ERR_INVALID, "cgroup: root %s is too long a path", prefix);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            return KT_OK;
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    *exists = true;
    kt_status st = KT_OK;
    char line[2 * KT_CGROUP_PATH_MAX];
    for (int no = 1; fgets(line, sizeof line, f); no++) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        char q[64];
        if (!c2 || c2[1] != '/' || strlen(c2 + 1) >= KT_CGROUP_PATH_MAX) {
            st = kt_err_set(err, KT_ERR_FORMAT,
                            "%s:%d: \"%s\" is not ID:CONTROLLERS:/PATH, not what the kernel writes there", path, no,
                            quoted(line, q));
            break;
        }
        *c1 = *c2 = 0;
        if (!strcmp(line, "0") && c1[1] == 0)
            strcpy(v2_path, c2 + 1);
        else if (list_has(c1 + 1, controller))
            strcpy(v1_path, c2 + 1);
    }
    fclose(f);
    return st;
}

/* Finds the mount of the hierarchy (v1 with controller, or v2) in
 * proc/self/mountinfo: its root within the hierarchy and its mount point. */
static kt_status find_mount(const char *prefix, int version, const char *controller, char *mnt_root,
                            char *mnt_point, bool *found, kt_err *err)
{
    char path[KT_CGROUP_PATH_MAX];
    *found = false;
    if (!join(path, sizeof path, prefix, "proc/self/mountinfo"))
        return kt_err_set(err, KT_ERR_INVALID, "cgroup: root %s is too long a path", prefix);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            return KT_OK;
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    while (!*found && getline(&line, &cap, f) > 0) {
        /* ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS */
        char *field[64];
        int n = 0;
        for (char *save = NULL, *tok = strtok_r(line, " \n", &save); tok && n < 64; tok = strtok_r(NULL, " \n", &save))
            field[n++] = tok;
        int dash = 6;
        while (dash < n && strcmp(field[dash], "-"))
            dash++;
        if (dash + 3 >= n)
            continue; /* not a line this reader understands: it cannot be a cgroup mount */
        const char *fstype = field[dash + 1], *super = field[dash + 3];
        const bool match = version == 2 ? !strcmp(fstype, "cgroup2")
                                        : !strcmp(fstype, "cgroup") && list_has(super, controller);
        if (!match || strlen(field[3]) >= KT_CGROUP_PATH_MAX || strlen(field[4]) >= KT_CGROUP_PATH_MAX)
            continue;
        strcpy(mnt_root, field[3]);
        strcpy(mnt_point, field[4]);
        unescape(mnt_root);
        unescape(mnt_point);
        *found = true;
    }
    free(line);
    fclose(f);
    return KT_OK;
}

/* Where controller's files for this process are: the v1 hierarchy that holds
 * it, else the v2 one. */
static kt_status find_place(const char *root, const char *controller, struct place *p, kt_err *err)
{
    memset(p, 0, sizeof *p);
    char prefix[KT_CGROUP_PATH_MAX];
    snprintf(prefix, sizeof prefix, "%s", root ? root : "");
    size_t plen = strlen(prefix);
    while (plen > 0 && prefix[plen - 1] == '/')
        prefix[--plen] = 0;

    char v1_path[KT_CGROUP_PATH_MAX], v2_path[KT_CGROUP_PATH_MAX];
    bool exists;
    kt_status st = read_self_cgroup(prefix, controller, v1_path, v2_path, &exists, err);
    if (st != KT_OK || !exists || (!v1_path[0] && !v2_path[0]))
        return st;
    const int version = v1_path[0] ? 1 : 2;
    const char *group = version == 1 ? v1_path : v2_path;
    char mnt_root[KT_CGROUP_PATH_MAX], mnt_point[KT_CGROUP_PATH_MAX];
    bool found;
    if ((st = find_mount(prefix, version, controller, mnt_root, mnt_point, &found, err)) != KT_OK)
        return st;
    if (!found) {
        snprintf(p->note, sizeof p->note,
                 "this process is in %s group %s, but %s/proc/self/mountinfo shows no %s filesystem%s%s: its %s "
                 "limits cannot be read",
                 version == 1 ? "cgroup v1" : "cgroup v2", group, prefix, version == 1 ? "cgroup" : "cgroup2",
                 version == 1 ? " with " : "", version == 1 ? controller : "", controller);
        return KT_OK;
    }
    /* The group's path below the mount's root; a mount of another part of
     * the tree (a container's own group mounted at the top) is the group. */
    const size_t rlen = strcmp(mnt_root, "/") ? strlen(mnt_root) : 0;
    const char *rel = "";
    if (rlen == 0)
        rel = group;
    else if (!strncmp(group, mnt_root, rlen) && (group[rlen] == '/' || group[rlen] == 0))
        rel = group + rlen;
    int n = snprintf(p->leaf, sizeof p->leaf, "%s%s", prefix, mnt_point);
    while (n > 0 && p->leaf[n - 1] == '/')
        p->leaf[--n] = 0;
    p->top_len = (size_t)n;
    if (!strcmp(rel, "/"))
        rel = "";
    if (n < 0 || (size_t)n + strlen(rel) >= sizeof p->leaf)
        return kt_err_set(err, KT_ERR_INVALID, "cgroup: %s%s%s is too long a path", prefix, mnt_point, rel);
    strcat(p->leaf, rel);
    p->version = version;
    struct stat sb;
    if (stat(p->leaf, &sb) != 0 || !S_ISDIR(sb.st_mode))
        snprintf(p->note, sizeof p->note, "%s: not found (this process's %s group); only the groups above it are read",
                 p->leaf, controller);
    return KT_OK;
}

/* The parent of dir, cut in place; false at the mount point. */
static bool up(char *dir, size_t top_len)
{
    const size_t n = strlen(dir);
    if (n <= top_len)
        return false;
    char *slash = strrchr(dir, '/');
    if (!slash || (size_t)(slash - dir) < top_len)
        dir[top_len] = 0;
    else
        *slash = 0;
    return true;
}

/* ---- memory ---------------------------------------------------------------------------- */

/* One group's limit, usage and room; *limited false when it sets none. */
static kt_status group_memory(const char *dir, int version, struct kt_cgroup_memory *g, bool *limited, kt_err *err)
{
    const char *limit_name = version == 2 ? "memory.max" : "memory.limit_in_bytes";
    const char *usage_name = version == 2 ? "memory.current" : "memory.usage_in_bytes";
    char path[KT_CGROUP_PATH_MAX], text[SMALL_FILE_BYTES], q[64];
    bool missing;
    *limited = false;
    if (!join(path, sizeof path, dir, limit_name))
        return kt_err_set(err, KT_ERR_INVALID, "cgroup: %s is too long a path", dir);
    kt_status st = read_small(path, text, sizeof text, &missing, err);
    if (st != KT_OK || missing || (version == 2 && !strcmp(text, "max")))
        return st;
    uint64_t limit, usage, inactive = 0;
    if (!parse_u64(text, &limit))
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: \"%s\" is not a byte count%s, not what the kernel writes there: kt cannot tell how "
                          "much memory this process may use (is a cgroup filesystem mounted there?)",
                          path, quoted(text, q), version == 2 ? " or \"max\"" : "");
    if (version == 1 && limit >= V1_NO_LIMIT_BYTES)
        return KT_OK;
    snprintf(g->limit_path, sizeof g->limit_path, "%s", path);
    g->limit_bytes = limit;

    join(path, sizeof path, dir, usage_name); /* no longer than the limit's path */
    if ((st = read_small(path, text, sizeof text, &missing, err)) != KT_OK)
        return st;
    if (missing)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: missing beside %s (a limit of %llu bytes): kt cannot tell how much of the limit is "
                          "in use",
                          path, g->limit_path, (unsigned long long)limit);
    if (!parse_u64(text, &usage))
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: \"%s\" is not a byte count, not what the kernel writes there: kt cannot tell how much "
                          "of the limit in %s is in use",
                          path, quoted(text, q), g->limit_path);

    /* Inactive page cache is reclaimed before the OOM killer acts. */
    join(path, sizeof path, dir, "memory.stat");
    if ((st = read_small(path, text, sizeof text, &missing, err)) != KT_OK)
        return st;
    bool found = false;
    if (!missing && version == 1 && !stat_value(text, "total_inactive_file", &inactive, &found))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: total_inactive_file is not a byte count", path);
    if (!missing && !found && !stat_value(text, "inactive_file", &inactive, &found))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: inactive_file is not a byte count", path);
    g->used_bytes = usage - (inactive < usage ? inactive : usage);
    g->room_bytes = limit > g->used_bytes ? limit - g->used_bytes : 0;
    g->version = version;
    *limited = true;
    return KT_OK;
}

kt_status kt_cgroup_memory_read(const char *root, struct kt_cgroup_memory *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    struct place p;
    kt_status st = find_place(root, "memory", &p, err);
    if (st != KT_OK)
        return st;
    snprintf(out->note, sizeof out->note, "%s", p.note);
    if (!p.version)
        return KT_OK;
    char dir[KT_CGROUP_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", p.leaf);
    do {
        struct kt_cgroup_memory g = {0};
        bool limited;
        if ((st = group_memory(dir, p.version, &g, &limited, err)) != KT_OK)
            return st;
        if (limited && (!out->limited || g.room_bytes < out->room_bytes)) {
            out->limited = true;
            out->version = g.version;
            out->limit_bytes = g.limit_bytes;
            out->used_bytes = g.used_bytes;
            out->room_bytes = g.room_bytes;
            snprintf(out->limit_path, sizeof out->limit_path, "%s", g.limit_path);
        }
    } while (up(dir, p.top_len));
    return KT_OK;
}

/* ---- CPUs -------------------------------------------------------------------------------- */

/* One group's CPU quota in CPUs (0: none), with the file and its text. */
static kt_status group_quota(const char *dir, int version, double *cpus, char *path, char *text, kt_err *err)
{
    char q[64], period_path[KT_CGROUP_PATH_MAX], period_text[64];
    bool missing;
    uint64_t quota, period = 100000;
    *cpus = 0;
    if (!join(path, KT_CGROUP_PATH_MAX, dir, version == 2 ? "cpu.max" : "cpu.cfs_quota_us"))
        return kt_err_set(err, KT_ERR_INVALID, "cgroup: %s is too long a path", dir);
    kt_status st = read_small(path, text, 64, &missing, err);
    if (st != KT_OK || missing)
        return st;
    if (version == 2) {
        /* "QUOTA PERIOD", QUOTA "max" for none */
        char quota_s[32] = "", period_s[32] = "", extra[2] = "";
        const int n = sscanf(text, "%31s %31s %1s", quota_s, period_s, extra);
        const bool ok = (n == 1 || n == 2) && (n == 1 || (parse_u64(period_s, &period) && period > 0)) &&
                        (!strcmp(quota_s, "max") || (parse_u64(quota_s, &quota) && quota > 0));
        if (!ok)
            return kt_err_set(err, KT_ERR_FORMAT,
                              "%s: \"%s\" is not \"QUOTA PERIOD\" (microseconds, QUOTA a number or \"max\"), not what "
                              "the kernel writes there: kt cannot tell how many CPUs this process may use "
                              "(give the thread count explicitly)",
                              path, quoted(text, q));
        if (strcmp(quota_s, "max"))
            *cpus = (double)quota / (double)period;
        return KT_OK;
    }
    if (!strcmp(text, "-1"))
        return KT_OK;
    if (!parse_u64(text, &quota) || quota == 0)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: \"%s\" is not -1 or a positive number of microseconds, not what the kernel writes "
                          "there: kt cannot tell how many CPUs this process may use (give the thread count explicitly)",
                          path, quoted(text, q));
    join(period_path, sizeof period_path, dir, "cpu.cfs_period_us"); /* no longer than path */
    if ((st = read_small(period_path, period_text, sizeof period_text, &missing, err)) != KT_OK)
        return st;
    if (missing || !parse_u64(period_text, &period) || period == 0)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: %s, beside a quota of %llu us in %s: kt cannot tell how many CPUs this process may "
                          "use (give the thread count explicitly)",
                          period_path, missing ? "missing" : "not a positive number of microseconds",
                          (unsigned long long)quota, path);
    snprintf(text + strlen(text), 64 - strlen(text), " / %llu", (unsigned long long)period);
    *cpus = (double)quota / (double)period;
    return KT_OK;
}

/* The CPUs of the cpuset nearest this process's group (0: none found). */
static kt_status cgroup_cpuset(const char *root, int *cpus, char *path, char *text, kt_err *err)
{
    struct place p;
    *cpus = 0;
    kt_status st = find_place(root, "cpuset", &p, err);
    if (st != KT_OK || !p.version)
        return st;
    static const char *const names_v2[] = {"cpuset.cpus.effective"};
    static const char *const names_v1[] = {"cpuset.effective_cpus", "cpuset.cpus"};
    const char *const *names = p.version == 2 ? names_v2 : names_v1;
    const int n_names = p.version == 2 ? 1 : 2;
    char dir[KT_CGROUP_PATH_MAX], q[64];
    snprintf(dir, sizeof dir, "%s", p.leaf);
    do {
        for (int i = 0; i < n_names; i++) {
            bool missing;
            if (!join(path, KT_CGROUP_PATH_MAX, dir, names[i]))
                return kt_err_set(err, KT_ERR_INVALID, "cgroup: %s is too long a path", dir);
            if ((st = read_small(path, text, SMALL_FILE_BYTES, &missing, err)) != KT_OK)
                return st;
            if (missing)
                continue;
            if (!count_cpu_list(text, cpus))
                return kt_err_set(err, KT_ERR_FORMAT,
                                  "%s: \"%s\" is not a CPU list such as 0-3,8, not what the kernel writes there: kt "
                                  "cannot tell how many CPUs this process may use (give the thread count explicitly)",
                                  path, quoted(text, q));
            return KT_OK;
        }
    } while (up(dir, p.top_len));
    return KT_OK;
}

kt_status kt_cpu_budget_read(const char *root, struct kt_cpu_budget *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    out->online_cpus = online > 0 ? (int)online : 1;
    out->cpus = out->online_cpus;

    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < out->cpus) {
        out->cpus = CPU_COUNT(&set);
        snprintf(out->why, sizeof out->why,
                 "this process may run on %d of them (its CPU affinity: taskset, numactl or a cpuset)", out->cpus);
    }

    char path[KT_CGROUP_PATH_MAX], text[SMALL_FILE_BYTES], q[64];
    int cpuset_cpus;
    kt_status st = cgroup_cpuset(root, &cpuset_cpus, path, text, err);
    if (st != KT_OK)
        return st;
    /* The cpuset is what limits the affinity: name it when it says the same. */
    if (cpuset_cpus > 0 && (cpuset_cpus < out->cpus || (cpuset_cpus == out->cpus && out->cpus < out->online_cpus))) {
        out->cpus = cpuset_cpus;
        snprintf(out->why, sizeof out->why, "the cgroup's cpuset allows %d CPU%s (%s: %s)", cpuset_cpus,
                 cpuset_cpus == 1 ? "" : "s", path, quoted(text, q));
    }

    struct place p;
    if ((st = find_place(root, "cpu", &p, err)) != KT_OK || !p.version)
        return st;
    char dir[KT_CGROUP_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", p.leaf);
    do {
        double quota;
        char qtext[64];
        if ((st = group_quota(dir, p.version, &quota, path, qtext, err)) != KT_OK)
            return st;
        const double threads = ceil(quota - 1e-9);
        if (quota > 0 && threads < out->cpus) {
            out->cpus = threads < 1 ? 1 : (int)threads;
            snprintf(out->why, sizeof out->why, "the cgroup's CPU quota is %.2f CPUs (%s: %s)", quota, path,
                     quoted(qtext, q));
        }
    } while (up(dir, p.top_len));
    return KT_OK;
}

/*
 * test_cgroup_live.c - kt-run inside a real memory cgroup: with a limit far
 * below what the load needs it must refuse before loading, exit 1 and name
 * the limit and its file (not be killed by the kernel half way, exit 137);
 * with room it must run, and --info must report the group's limit.  Where a
 * CPU quota can be set too, kt-run must run fewer threads and say why.
 *
 * It makes a child group for itself (cgroup v2 under this process's group or
 * the hierarchy's top, with the memory controller enabled there; else cgroup
 * v1's memory hierarchy), moves a forked child into it and runs kt-run
 * there; it removes the group afterwards.  Where no group can be made (not
 * root, no writable cgroup filesystem, no memory controller) it skips, saying
 * why each way failed.  This file finds the groups with its own small
 * readers, not the library's, so the two do not share a mistake.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

#define PATH_BYTES 2048
#define WHY_BYTES (3 * PATH_BYTES)

struct live_group {
    int version;                 /* 1 or 2 */
    char dir[PATH_BYTES];        /* the group made for the test */
    char limit_file[PATH_BYTES]; /* its memory limit: memory.max or memory.limit_in_bytes */
};

/* ---- finding and making groups ------------------------------------------------------------ */

/* dir/name into out; false when it does not fit. */
static bool path_in(char *out, size_t size, const char *dir, const char *name)
{
    const size_t d = strlen(dir), n = strlen(name);
    if (d + 1 + n >= size)
        return false;
    memcpy(out, dir, d);
    out[d] = '/';
    memcpy(out + d + 1, name, n + 1);
    return true;
}

static bool write_text(const char *path, const char *text, char *why, size_t why_size)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_size, "%s: %s", path, strerror(errno));
        return false;
    }
    const ssize_t n = write(fd, text, strlen(text));
    const int saved = errno;
    close(fd);
    if (n != (ssize_t)strlen(text)) {
        snprintf(why, why_size, "writing '%s' to %s: %s", text, path, n < 0 ? strerror(saved) : "short write");
        return false;
    }
    return true;
}

static bool read_line(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    const bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return ok;
}

static bool word_in(const char *list, const char *word, const char *seps)
{
    char copy[1024], *save = NULL;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *w = strtok_r(copy, seps, &save); w; w = strtok_r(NULL, seps, &save))
        if (!strcmp(w, word))
            return true;
    return false;
}

/* This process's group path in the v2 hierarchy ("0::PATH") or in the v1
 * one holding controller. */
static bool self_group(int version, const char *controller, char *out, size_t size)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return false;
    char line[PATH_BYTES];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = 0;
        if (version == 2 ? !strcmp(line, "0") && c1[1] == 0 : word_in(c1 + 1, controller, ","))
            found = snprintf(out, size, "%s", c2 + 1) < (int)size;
    }
    fclose(f);
    return found;
}

/* The mount point of the v2 hierarchy, or of the v1 one holding controller
 * (mounted at its top: root field "/"). */
static bool mount_point(int version, const char *controller, char *out, size_t size)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return false;
    char line[4 * PATH_BYTES];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char root[PATH_BYTES], point[PATH_BYTES], fstype[64], super[1024];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %2047s %2047s", root, point) != 2 ||
            sscanf(dash + 3, "%63s %*s %1023s", fstype, super) != 2 || strchr(point, '\\') || strcmp(root, "/"))
            continue;
        if (version == 2 ? !strcmp(fstype, "cgroup2") : !strcmp(fstype, "cgroup") && word_in(super, controller, ","))
            found = snprintf(out, size, "%s", point) < (int)size;
    }
    fclose(f);
    return found;
}

/* A new child group of parent (v2: memory enabled in parent's subtree first). */
static bool make_child(int version, const char *parent, struct live_group *g, char *why, size_t why_size)
{
    if (version == 2) {
        char path[PATH_BYTES], line[1024] = "";
        snprintf(path, sizeof path, "%s/cgroup.subtree_control", parent);
        read_line(path, line, sizeof line);
        if (!word_in(line, "memory", " ") && !write_text(path, "+memory", why, why_size))
            return false;
    }
    int n = snprintf(g->dir, sizeof g->dir, "%s/kt-test-live-%d", parent, (int)getpid());
    if (n < 0 || n >= (int)sizeof g->dir || (mkdir(g->dir, 0755) != 0 && errno != EEXIST)) {
        snprintf(why, why_size, "mkdir %s: %s", g->dir, strerror(errno));
        return false;
    }
    if (!path_in(g->limit_file, sizeof g->limit_file, g->dir, version == 2 ? "memory.max" : "memory.limit_in_bytes") ||
        access(g->limit_file, W_OK) != 0) {
        snprintf(why, why_size, "%s: %s", g->limit_file, strerror(errno));
        rmdir(g->dir);
        return false;
    }
    g->version = version;
    return true;
}

static bool make_v2(struct live_group *g, char *why, size_t why_size)
{
    char mnt[PATH_BYTES], self[PATH_BYTES], path[2 * PATH_BYTES + 32], controllers[1024] = "";
    if (!mount_point(2, NULL, mnt, sizeof mnt) || !self_group(2, NULL, self, sizeof self)) {
        snprintf(why, why_size, "no cgroup2 filesystem mounted, or this process is in no v2 group");
        return false;
    }
    snprintf(path, sizeof path, "%s/cgroup.controllers", mnt);
    read_line(path, controllers, sizeof controllers);
    if (!word_in(controllers, "memory", " ")) {
        snprintf(why, why_size, "the cgroup2 hierarchy at %s has no memory controller (cgroup.controllers: '%s')",
                 mnt, controllers);
        return false;
    }
    /* Under this process's own group, else at the top (which may hold processes). */
    char own[2 * PATH_BYTES];
    snprintf(own, sizeof own, "%s%s", mnt, strcmp(self, "/") ? self : "");
    char why_own[WHY_BYTES];
    if (make_child(2, own, g, why_own, sizeof why_own))
        return true;
    char why_top[WHY_BYTES];
    if (strcmp(own, mnt) && make_child(2, mnt, g, why_top, sizeof why_top))
        return true;
    snprintf(why, why_size, "%s", why_own);
    return false;
}

static bool make_v1(struct live_group *g, char *why, size_t why_size)
{
    char mnt[PATH_BYTES], self[PATH_BYTES], parent[2 * PATH_BYTES];
    if (!mount_point(1, "memory", mnt, sizeof mnt) || !self_group(1, "memory", self, sizeof self)) {
        snprintf(why, why_size, "no cgroup v1 memory hierarchy mounted at its top, or this process is in none");
        return false;
    }
    snprintf(parent, sizeof parent, "%s%s", mnt, strcmp(self, "/") ? self : "");
    return make_child(1, parent, g, why, why_size);
}

/* A group for the CPU quota: v2 beside the memory one (the same group), v1
 * in the cpu hierarchy; NULL dir when none can be made. */
static bool make_cpu_group(const struct live_group *mem, char *dir, size_t size, char *why, size_t why_size)
{
    if (mem->version == 2) {
        char path[PATH_BYTES + 32], line[1024] = "";
        snprintf(path, sizeof path, "%s/../cgroup.subtree_control", mem->dir);
        read_line(path, line, sizeof line);
        if (!word_in(line, "cpu", " ") && !write_text(path, "+cpu", why, why_size))
            return false;
        snprintf(dir, size, "%s", mem->dir);
        return true;
    }
    char mnt[PATH_BYTES], self[PATH_BYTES];
    if (!mount_point(1, "cpu", mnt, sizeof mnt) || !self_group(1, "cpu", self, sizeof self)) {
        snprintf(why, why_size, "no cgroup v1 cpu hierarchy mounted at its top");
        return false;
    }
    int n = snprintf(dir, size, "%s%s/kt-test-live-%d", mnt, strcmp(self, "/") ? self : "", (int)getpid());
    if (n < 0 || n >= (int)size || (mkdir(dir, 0755) != 0 && errno != EEXIST)) {
        snprintf(why, why_size, "mkdir %s: %s", dir, strerror(errno));
        return false;
    }
    return true;
}

/* ---- running kt-run in the group --------------------------------------------------------- */

/* Runs `sh -c cmd` in a child that first moves itself into each group of
 * procs (cgroup.procs files, NULL-terminated); returns its wait status. */
static int run_in_groups(const char *const *procs, const char *cmd)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char why[WHY_BYTES], me[32];
        snprintf(me, sizeof me, "%d", (int)getpid());
        for (int i = 0; procs[i]; i++)
            if (!write_text(procs[i], me, why, sizeof why)) {
                fprintf(stderr, "cannot join the group: %s\n", why);
                _exit(120);
            }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(121);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return status;
}

static char *slurp(const char *path)
{
    size_t n;
    char *text = kt_test_read_file(path, &n);
    return text ? text : calloc(1, 1);
}

/* Exit code of a status, or 128 + signal as a shell reports it. */
static int exit_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

static struct live_group live; /* the group main made */
static char live_model[1024];  /* kt-synth's tiny preset */

static void kt_run_in_a_memory_cgroup(void)
{
    const struct live_group *g = &live;
    const char *model = live_model;
    char procs[PATH_BYTES + 32], why[WHY_BYTES];
    path_in(procs, sizeof procs, g->dir, "cgroup.procs");
    const char *const groups[] = {procs, NULL};
    const char *out = kt_test_path("live.out"), *err = kt_test_path("live.err");
    char cmd[8 * PATH_BYTES];

    /* 256 MiB: far below the 512 MiB margin the load keeps on top of what it needs. */
    KT_CHECK(write_text(g->limit_file, "268435456", why, sizeof why), "%s", why);
    snprintf(cmd, sizeof cmd, "exec '%s' -m '%s' -p hello -n 2 --ctx 128 -t 1 >'%s' 2>'%s'", kt_test_tool("kt-run"),
             model, out, err);
    int status = run_in_groups(groups, cmd);
    char *etext = slurp(err);
    KT_CHECK(exit_code(status) == 1, "kt-run in a 256 MiB group: exit %d (137 is the kernel killing it), stderr:\n%s",
             exit_code(status), etext);
    KT_CHECK(strstr(etext, "kt-run: loading the routed experts, packing the host matrices and the KV cache needs") &&
                 strstr(etext, "memory limit is 0.25 GiB") &&
                 strstr(etext, g->limit_file) && strstr(etext, "raise the limit"),
             "the refusal names the limit and its file %s:\n%s", g->limit_file, etext);
    free(etext);

    /* kt-serve refuses the same before it listens: no "listening" line, no /health that answers "loading" */
    char serve[8 * PATH_BYTES];
    snprintf(serve, sizeof serve, "exec timeout 60 '%s' -m '%s' --port 0 --ctx 128 -t 1 >'%s' 2>'%s'",
             kt_test_tool("kt-serve"), model, out, err);
    status = run_in_groups(groups, serve);
    etext = slurp(err);
    KT_CHECK(exit_code(status) == 1 && strstr(etext, "kt-serve: this plan needs") &&
                 strstr(etext, "memory limit is 0.25 GiB") && !strstr(etext, "listening"),
             "kt-serve in a 256 MiB group: exit %d, stderr:\n%s", exit_code(status), etext);
    free(etext);

    /* 2 GiB: it loads and runs; --info reports the group's limit. */
    KT_CHECK(write_text(g->limit_file, "2147483648", why, sizeof why), "%s", why);
    status = run_in_groups(groups, cmd);
    etext = slurp(err);
    KT_CHECK(exit_code(status) == 0, "kt-run in a 2 GiB group: exit %d, stderr:\n%s", exit_code(status), etext);
    free(etext);
    snprintf(cmd, sizeof cmd, "exec '%s' --info '%s' >'%s' 2>'%s'", kt_test_tool("kt-run"), model, out, err);
    status = run_in_groups(groups, cmd);
    char *text = slurp(out), expect[64];
    snprintf(expect, sizeof expect, "cgroup v%d limit 2.00 GiB (", g->version);
    KT_CHECK(exit_code(status) == 0 && strstr(text, expect) && strstr(text, g->limit_file),
             "--info in the group: exit %d, wants '%s%s':\n%s", exit_code(status), expect, g->limit_file, text);
    free(text);
    unlink(out);
    unlink(err);
}

static void kt_run_under_a_cpu_quota(void)
{
    const struct live_group *g = &live;
    const char *model = live_model;
    char dir[PATH_BYTES], why[WHY_BYTES], file[PATH_BYTES + 32];
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("note: one online CPU: a quota cannot lower the thread count; not run\n");
        return;
    }
    if (!make_cpu_group(g, dir, sizeof dir, why, sizeof why)) {
        printf("note: no CPU quota can be set here (%s); not run\n", why);
        return;
    }
    if (g->version == 2)
        snprintf(file, sizeof file, "%s/cpu.max", dir);
    else
        snprintf(file, sizeof file, "%s/cpu.cfs_quota_us", dir);
    const bool set = write_text(file, g->version == 2 ? "50000 100000" : "50000", why, sizeof why);
    KT_CHECK(set, "%s", why);
    char mem_procs[PATH_BYTES + 32], cpu_procs[PATH_BYTES + 32];
    path_in(mem_procs, sizeof mem_procs, g->dir, "cgroup.procs");
    path_in(cpu_procs, sizeof cpu_procs, dir, "cgroup.procs");
    const char *const groups[] = {mem_procs, strcmp(dir, g->dir) ? cpu_procs : NULL, NULL};
    const char *out = kt_test_path("live-cpu.out"), *err = kt_test_path("live-cpu.err");
    char cmd[8 * PATH_BYTES];
    snprintf(cmd, sizeof cmd, "exec '%s' -m '%s' -p hello -n 1 --ctx 128 >'%s' 2>'%s'", kt_test_tool("kt-run"), model,
             out, err);
    int status = set ? run_in_groups(groups, cmd) : -1;
    char *etext = slurp(err);
    KT_CHECK(exit_code(status) == 0, "kt-run under half a CPU: exit %d:\n%s", exit_code(status), etext);
    KT_CHECK(strstr(etext, "kt-run: 1 thread, not one per online CPU") && strstr(etext, "CPU quota is 0.50 CPUs") &&
                 strstr(etext, file) && strstr(etext, ", 1 threads, prompt"),
             "the thread count and why, naming %s:\n%s", file, etext);
    free(etext);
    unlink(out);
    unlink(err);
    if (strcmp(dir, g->dir))
        rmdir(dir);
}

int main(void)
{
    if (geteuid() != 0)
        return kt_test_skip("not root: cgroups cannot be made here");
    char why_v2[WHY_BYTES], why_v1[WHY_BYTES];
    if (!make_v2(&live, why_v2, sizeof why_v2) && !make_v1(&live, why_v1, sizeof why_v1)) {
        char reason[2 * WHY_BYTES + 64];
        snprintf(reason, sizeof reason, "cannot make a memory cgroup here: v2: %s; v1: %s", why_v2, why_v1);
        return kt_test_skip(reason);
    }
    printf("note: memory cgroup v%d at %s\n", live.version, live.dir);
    snprintf(live_model, sizeof live_model, "%s", kt_test_path("live-tiny.gguf"));
    int rc = kt_test_system("'%s' --preset tiny -q -o '%s' >/dev/null 2>&1", kt_test_tool("kt-synth"), live_model);
    KT_CHECK(rc == 0, "kt-synth: exit %d", rc);
    if (rc == 0) {
        KT_RUN(kt_run_in_a_memory_cgroup);
        KT_RUN(kt_run_under_a_cpu_quota);
    }
    unlink(live_model);
    KT_CHECK(rmdir(live.dir) == 0, "rmdir %s: %s", live.dir, strerror(errno));
    return kt_test_finish();
}

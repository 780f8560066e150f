/*
 * test_cgroup.c - proves that the memory check before a load and the default
 * thread count honour a container's cgroup limits, v1 and v2: the tightest
 * group on the path from this process's group to the hierarchy's top counts,
 * reclaimable page cache is not counted as used, "max" and missing files mean
 * no limit, and garbage in any file is an error that names the file and
 * quotes it, never a crash or a guess.
 *
 * Every case runs on a fake tree (proc/self/cgroup, proc/self/mountinfo,
 * proc/meminfo and the groups' files) written under $KT_TEST_TMP and passed
 * as the root; the CPU cases compare against this machine's own online CPUs
 * and affinity, which no fake tree replaces.  test_cgroup_live runs a load
 * inside a real memory cgroup.
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cgroup.h"
#include "engine.h"
#include "engine_test.h"
#include "meminfo.h"
#include "model.h"
#include "testlib.h"

#define GIB (1024ull * 1024 * 1024)
#define MIB (1024ull * 1024)

/* ---- fake trees ------------------------------------------------------------------------ */

struct tree_file {
    const char *rel, *text;
};

#define MEMINFO_64G "MemTotal: 134217728 kB\nMemFree: 1000 kB\nMemAvailable: 67108864 kB\n"
#define MOUNT_ROOTFS "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
#define MOUNT_V2 \
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
#define MOUNT_V1                                                                                                \
    "31 22 0:27 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755\n"                                          \
    "35 31 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,memory\n"     \
    "36 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n"              \
    "37 31 0:33 / /sys/fs/cgroup/cpuset rw,relatime shared:11 - cgroup cgroup rw,cpuset\n"                        \
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:12 - cgroup2 cgroup2 rw\n"
#define SELF_V1 "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n10:cpuset:/docker/abc\n1:name=systemd:/x\n0::/\n"
#define V1_UNLIMITED "9223372036854771712\n"

/* A fresh tree under $KT_TEST_TMP with files (until a NULL rel); its root. */
static const char *make_tree(const char *name, const struct tree_file *files)
{
    const char *root = kt_test_path(name);
    kt_test_system("rm -rf '%s'", root);
    for (const struct tree_file *f = files; f->rel; f++)
        KT_CHECK(kt_test_write_tree_file(root, f->rel, f->text), "cannot write %s/%s", root, f->rel);
    return root;
}

static void remove_tree(const char *root)
{
    kt_test_system("rm -rf '%s'", root);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* ---- memory ---------------------------------------------------------------------------- */

static void v2_limit_counts_usage_less_inactive_file(void)
{
    const struct tree_file files[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", "0::/kt/job\n"},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V2},
        {"sys/fs/cgroup/kt/job/memory.max", "2147483648\n"},
        {"sys/fs/cgroup/kt/job/memory.current", "536870912\n"},
        {"sys/fs/cgroup/kt/job/memory.stat", "anon 100\nfile 400000000\nactive_file 5\ninactive_file 268435456\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cg-v2", files);
    struct kt_meminfo mi;
    kt_err err = {0};
    KT_CHECK(kt_meminfo_read(root, &mi, &err) == KT_OK, "%s", err.msg);
    const struct kt_cgroup_memory *cg = &mi.cgroup;
    KT_CHECK(cg->limited && cg->version == 2 && cg->limit_bytes == 2 * GIB, "limit %llu v%d",
             (unsigned long long)cg->limit_bytes, cg->version);
    KT_CHECK(cg->used_bytes == 256 * MIB && cg->room_bytes == 2 * GIB - 256 * MIB, "used %llu room %llu",
             (unsigned long long)cg->used_bytes, (unsigned long long)cg->room_bytes);
    KT_CHECK(ends_with(cg->limit_path, "/sys/fs/cgroup/kt/job/memory.max") &&
                 !strncmp(cg->limit_path, root, strlen(root)),
             "limit file %s", cg->limit_path);
    KT_CHECK(mi.host_available_bytes == 64 * GIB && mi.available_bytes == cg->room_bytes,
             "available is the cgroup's room: %llu", (unsigned long long)mi.available_bytes);
    KT_CHECK(cg->note[0] == 0, "nothing missed: %s", cg->note);

    /* The check refuses what the host could hold but the group cannot, naming
     * the limit, its file and how to raise it. */
    KT_CHECK(kt_meminfo_check(root, "loading the routed experts", 3 * GIB, &err) == KT_ERR_NOMEM, "3 GiB fits in 1.75");
    KT_CHECK(strstr(err.msg, "loading the routed experts needs 3.00 GiB") && strstr(err.msg, "1.75 GiB is available") &&
                 strstr(err.msg, "memory limit is 2.00 GiB") && strstr(err.msg, cg->limit_path) &&
                 strstr(err.msg, "0.25 GiB of it in use") && strstr(err.msg, "raise the limit") &&
                 strstr(err.msg, "write memory.max"),
             "message: %s", err.msg);
    KT_CHECK(kt_meminfo_check(root, "a small load", 512 * MIB, &err) == KT_OK, "512 MiB + margin fits: %s", err.msg);
    remove_tree(root);
}

static void the_group_with_least_room_counts(void)
{
    /* The parent's limit is larger but its other children use most of it. */
    const struct tree_file files[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", "0::/kt/job\n"},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V2},
        {"sys/fs/cgroup/memory.stat", "inactive_file 0\n"}, /* the root group: no memory.max */
        {"sys/fs/cgroup/kt/memory.max", "4294967296\n"},
        {"sys/fs/cgroup/kt/memory.current", "3758096384\n"}, /* 3.5 GiB */
        {"sys/fs/cgroup/kt/job/memory.max", "2147483648\n"},
        {"sys/fs/cgroup/kt/job/memory.current", "104857600\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cg-nested", files);
    struct kt_cgroup_memory cg;
    kt_err err = {0};
    KT_CHECK(kt_cgroup_memory_read(root, &cg, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(cg.limited && cg.limit_bytes == 4 * GIB && cg.room_bytes == 512 * MIB &&
                 ends_with(cg.limit_path, "/sys/fs/cgroup/kt/memory.max"),
             "the parent's room (0.5 GiB) binds: limit %llu room %llu in %s", (unsigned long long)cg.limit_bytes,
             (unsigned long long)cg.room_bytes, cg.limit_path);
    /* Without memory.stat nothing is taken as reclaimable. */
    KT_CHECK(cg.used_bytes == 3584 * MIB, "used %llu", (unsigned long long)cg.used_bytes);
    remove_tree(root);

    /* The child's own limit binds when it leaves less; "max" above it is no limit. */
    const struct tree_file child[] = {
        {"proc/self/cgroup", "0::/kt/job\n"},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V2},
        {"sys/fs/cgroup/kt/memory.max", "max\n"},
        {"sys/fs/cgroup/kt/memory.current", "1\n"},
        {"sys/fs/cgroup/kt/job/memory.max", "1073741824\n"},
        {"sys/fs/cgroup/kt/job/memory.current", "0\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-child", child);
    KT_CHECK(kt_cgroup_memory_read(root, &cg, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(cg.limited && cg.room_bytes == GIB && ends_with(cg.limit_path, "/kt/job/memory.max"), "child: %s",
             cg.limit_path);
    remove_tree(root);

    /* A group over its limit has no room at all. */
    const struct tree_file over[] = {
        {"proc/self/cgroup", "0::/job\n"},
        {"proc/self/mountinfo", MOUNT_V2},
        {"sys/fs/cgroup/job/memory.max", "1000\n"},
        {"sys/fs/cgroup/job/memory.current", "5000\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-over", over);
    KT_CHECK(kt_cgroup_memory_read(root, &cg, &err) == KT_OK && cg.limited && cg.room_bytes == 0,
             "over the limit: room %llu %s", (unsigned long long)cg.room_bytes, err.msg);
    remove_tree(root);
}

static void max_and_missing_files_mean_no_limit(void)
{
    struct kt_meminfo mi;
    kt_err err = {0};
    /* "max" everywhere. */
    const struct tree_file max[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", "0::/a/b\n"},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V2},
        {"sys/fs/cgroup/a/memory.max", "max\n"},
        {"sys/fs/cgroup/a/b/memory.max", "max\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cg-max", max);
    KT_CHECK(kt_meminfo_read(root, &mi, &err) == KT_OK && !mi.cgroup.limited && mi.available_bytes == 64 * GIB,
             "max: %s", err.msg);
    remove_tree(root);

    /* No memory controller in the groups (no memory.* files). */
    const struct tree_file none[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", "0::/a\n"},
        {"proc/self/mountinfo", MOUNT_V2},
        {"sys/fs/cgroup/a/cgroup.procs", "1\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-nomem", none);
    KT_CHECK(kt_meminfo_read(root, &mi, &err) == KT_OK && !mi.cgroup.limited && !mi.cgroup.note[0],
             "no memory controller: %s / %s", err.msg, mi.cgroup.note);
    remove_tree(root);

    /* No cgroups at all: a host without proc/self/cgroup. */
    const struct tree_file bare[] = {{"proc/meminfo", MEMINFO_64G}, {NULL, NULL}};
    root = make_tree("cg-bare", bare);
    KT_CHECK(kt_meminfo_read(root, &mi, &err) == KT_OK && !mi.cgroup.limited && !mi.cgroup.note[0] &&
                 mi.available_bytes == 64 * GIB,
             "no cgroups: %s", err.msg);
    remove_tree(root);

    /* In a group whose hierarchy is not mounted: no limit can be read, and the note says why. */
    const struct tree_file unmounted[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", "0::/kt/job\n"},
        {"proc/self/mountinfo", MOUNT_ROOTFS},
        {NULL, NULL},
    };
    root = make_tree("cg-unmounted", unmounted);
    KT_CHECK(kt_meminfo_read(root, &mi, &err) == KT_OK && !mi.cgroup.limited, "unmounted: %s", err.msg);
    KT_CHECK(strstr(mi.cgroup.note, "/kt/job") && strstr(mi.cgroup.note, "no cgroup2 filesystem") &&
                 strstr(mi.cgroup.note, "mountinfo"),
             "note: %s", mi.cgroup.note);
    remove_tree(root);

    /* Its own group's folder is gone: the note names it, the parent's limit still counts. */
    const struct tree_file gone[] = {
        {"proc/self/cgroup", "0::/kt/job\n"},
        {"proc/self/mountinfo", MOUNT_V2},
        {"sys/fs/cgroup/kt/memory.max", "1073741824\n"},
        {"sys/fs/cgroup/kt/memory.current", "0\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-gone", gone);
    struct kt_cgroup_memory cg;
    KT_CHECK(kt_cgroup_memory_read(root, &cg, &err) == KT_OK && cg.limited && cg.limit_bytes == GIB,
             "parent of a missing group: %s", err.msg);
    KT_CHECK(strstr(cg.note, "kt/job: not found"), "note: %s", cg.note);
    remove_tree(root);
}

static void v1_hierarchies_and_container_mounts(void)
{
    /* A v1 host (hybrid: the v2 tree has no memory controller); the parent's
     * "no limit" value is no limit; total_inactive_file wins over inactive_file. */
    const struct tree_file v1[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", SELF_V1},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V1},
        {"sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED},
        {"sys/fs/cgroup/memory/docker/memory.limit_in_bytes", V1_UNLIMITED},
        {"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "1073741824\n"},
        {"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "629145600\n"},
        {"sys/fs/cgroup/memory/docker/abc/memory.stat",
         "cache 1\ninactive_file 52428800\nhierarchical_memory_limit 1073741824\ntotal_inactive_file 104857600\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cg-v1", v1);
    struct kt_meminfo mi;
    kt_err err = {0};
    KT_CHECK(kt_meminfo_read(root, &mi, &err) == KT_OK, "%s", err.msg);
    const struct kt_cgroup_memory *cg = &mi.cgroup;
    KT_CHECK(cg->limited && cg->version == 1 && cg->limit_bytes == GIB && cg->used_bytes == 500 * MIB &&
                 ends_with(cg->limit_path, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"),
             "v1: v%d limit %llu used %llu %s", cg->version, (unsigned long long)cg->limit_bytes,
             (unsigned long long)cg->used_bytes, cg->limit_path);
    KT_CHECK(kt_meminfo_check(root, "the load", GIB, &err) == KT_ERR_NOMEM &&
                 strstr(err.msg, "memory.limit_in_bytes") && strstr(err.msg, "write memory.limit_in_bytes"),
             "v1 refusal: %s", err.msg);
    remove_tree(root);

    /* Docker without a cgroup namespace: the container's own group is
     * bind-mounted at the top, its root field naming the group. */
    const struct tree_file bind[] = {
        {"proc/self/cgroup", "9:memory:/docker/abc\n"},
        {"proc/self/mountinfo",
         "40 31 0:31 /docker/abc /sys/fs/cgroup/memory ro,nosuid master:9 - cgroup cgroup rw,memory\n"},
        {"sys/fs/cgroup/memory/memory.limit_in_bytes", "268435456\n"},
        {"sys/fs/cgroup/memory/memory.usage_in_bytes", "0\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-bind", bind);
    KT_CHECK(kt_cgroup_memory_read(root, &mi.cgroup, &err) == KT_OK && mi.cgroup.limited &&
                 mi.cgroup.limit_bytes == 256 * MIB &&
                 ends_with(mi.cgroup.limit_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
             "bind mount: %s %s", err.msg, mi.cgroup.limit_path);
    remove_tree(root);

    /* A cgroup namespace: the process sees itself at "/" of a v2 tree, at a
     * mount point with an escaped space. */
    const struct tree_file ns[] = {
        {"proc/self/cgroup", "0::/\n"},
        {"proc/self/mountinfo", "50 40 0:26 / /sys/fs/cgroup\\040v2 rw - cgroup2 cgroup2 rw\n"},
        {"sys/fs/cgroup v2/memory.max", "536870912\n"},
        {"sys/fs/cgroup v2/memory.current", "0\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-ns", ns);
    KT_CHECK(kt_cgroup_memory_read(root, &mi.cgroup, &err) == KT_OK && mi.cgroup.limited &&
                 mi.cgroup.limit_bytes == 512 * MIB && ends_with(mi.cgroup.limit_path, "/sys/fs/cgroup v2/memory.max"),
             "namespace: %s %s", err.msg, mi.cgroup.limit_path);
    remove_tree(root);
}

/* One file of a working v2 tree replaced by text; the read must fail with
 * KT_ERR_FORMAT naming file_tail and holding needle. */
static void expect_garbage(const char *rel, const char *text, const char *file_tail, const char *needle)
{
    struct tree_file files[] = {
        {"proc/self/cgroup", "0::/job\n"},
        {"proc/self/mountinfo", MOUNT_V2},
        {"sys/fs/cgroup/job/memory.max", "2147483648\n"},
        {"sys/fs/cgroup/job/memory.current", "1048576\n"},
        {"sys/fs/cgroup/job/memory.stat", "inactive_file 0\n"},
        {NULL, NULL},
    };
    for (struct tree_file *f = files; f->rel; f++)
        if (!strcmp(f->rel, rel))
            f->text = text;
    const char *root = make_tree("cg-garbage", files);
    struct kt_cgroup_memory cg;
    kt_err err = {0};
    kt_status st = kt_cgroup_memory_read(root, &cg, &err);
    KT_CHECK(st == KT_ERR_FORMAT && strstr(err.msg, file_tail) && strstr(err.msg, needle),
             "%s holding '%s': status %s, message '%s'", rel, text, kt_status_name(st), err.msg);
    KT_CHECK(strstr(err.msg, root) != NULL, "the message names the file under the root: %s", err.msg);
    remove_tree(root);
}

static void garbage_is_an_error_naming_the_file(void)
{
    expect_garbage("sys/fs/cgroup/job/memory.max", "lots\n", "job/memory.max",
                   "\"lots\" is not a byte count or \"max\"");
    expect_garbage("sys/fs/cgroup/job/memory.max", "-1\n", "job/memory.max", "\"-1\" is not a byte count");
    expect_garbage("sys/fs/cgroup/job/memory.max", "12 34\n", "job/memory.max", "\"12 34\"");
    expect_garbage("sys/fs/cgroup/job/memory.max", "99999999999999999999999\n", "job/memory.max",
                   "is not a byte count");
    expect_garbage("sys/fs/cgroup/job/memory.max", "\x01\xff\x80zz\n", "job/memory.max", "\"???zz\"");
    expect_garbage("sys/fs/cgroup/job/memory.max", "", "job/memory.max", "\"\" is not a byte count");
    expect_garbage("sys/fs/cgroup/job/memory.current", "many\n", "job/memory.current", "\"many\" is not a byte count");
    expect_garbage("sys/fs/cgroup/job/memory.stat", "inactive_file 12x\n", "job/memory.stat",
                   "inactive_file is not a byte count");
    expect_garbage("proc/self/cgroup", "garbage\n", "proc/self/cgroup:1", "is not ID:CONTROLLERS:/PATH");
    expect_garbage("proc/self/cgroup", "0::relative\n", "proc/self/cgroup:1", "\"0::relative\"");

    /* A file far longer than the kernel would write. */
    char *long_text = kt_test_xmalloc(40000);
    memset(long_text, '7', 39999);
    long_text[39999] = 0;
    expect_garbage("sys/fs/cgroup/job/memory.max", long_text, "job/memory.max", "longer than");
    free(long_text);

    /* A limit without its usage file cannot be judged. */
    const struct tree_file no_usage[] = {
        {"proc/self/cgroup", "0::/job\n"},
        {"proc/self/mountinfo", MOUNT_V2},
        {"sys/fs/cgroup/job/memory.max", "2147483648\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cg-nousage", no_usage);
    struct kt_cgroup_memory cg;
    kt_err err = {0};
    KT_CHECK(kt_cgroup_memory_read(root, &cg, &err) == KT_ERR_FORMAT && strstr(err.msg, "memory.current: missing") &&
                 strstr(err.msg, "memory.max"),
             "no usage: %s", err.msg);
    /* ... and the load check passes that error on instead of guessing. */
    KT_CHECK(kt_test_write_tree_file(root, "proc/meminfo", MEMINFO_64G), "meminfo");
    KT_CHECK(kt_meminfo_check(root, "the load", MIB, &err) == KT_ERR_FORMAT && strstr(err.msg, "memory.current"),
             "check: %s", err.msg);
    remove_tree(root);

    /* Mountinfo lines this reader does not understand are skipped, not trusted. */
    const struct tree_file odd_mounts[] = {
        {"proc/self/cgroup", "0::/job\n"},
        {"proc/self/mountinfo", "garbage\n\n1 2 3\n" MOUNT_V2},
        {"sys/fs/cgroup/job/memory.max", "1048576\n"},
        {"sys/fs/cgroup/job/memory.current", "0\n"},
        {NULL, NULL},
    };
    root = make_tree("cg-oddmounts", odd_mounts);
    KT_CHECK(kt_cgroup_memory_read(root, &cg, &err) == KT_OK && cg.limited && cg.limit_bytes == MIB,
             "odd mountinfo lines: %s", err.msg);
    remove_tree(root);
}

/* ---- the engine's load ------------------------------------------------------------------- */

/* The load's memory check counts the engine's own host memory, predicted
 * from the tensor table: the packed matrices exactly as the engine packs
 * them (CPU-only, and with attention, dense and shared experts on the sim,
 * where only the head stays), and the KV pool as the cache sizes it. */
static void engine_host_bytes_are_predicted_exactly(void)
{
    char path[1024] = "";
    struct kt_model *m = kt_test_synth_model("tiny", "--dense-type q8_0 --experts-type q4_k", path, sizeof path);
    if (!m)
        return;
    struct kt_engine_params cpu = {.n_ctx = 64, .max_seqs = 3, .n_threads = 1, .max_batch_tokens = 16};
    const struct kt_backend_params backend = {.kind = KT_BACKEND_SIM, .name = "sim"};
    struct kt_engine_params sim = cpu;
    sim.device = &backend, sim.attention_on_device = sim.dense_on_device = sim.shared_on_device = true;
    const struct kt_engine_params *cases[] = {&cpu, &sim};
    uint64_t packed_cpu = 0;
    for (int i = 0; i < 2; i++) {
        const struct kt_engine_host_bytes want = kt_engine_host_bytes(m, cases[i]);
        struct kt_engine *e = NULL;
        kt_err err = {0};
        KT_CHECK(kt_engine_create(m, cases[i], &e, &err) == KT_OK, "%s", err.msg);
        if (!e)
            continue;
        KT_CHECK(want.packed == kt_engine_host_packed_bytes(e), "case %d: predicted %llu packed bytes, packed %llu",
                 i, (unsigned long long)want.packed, (unsigned long long)kt_engine_host_packed_bytes(e));
        struct kt_kv_cache_stats kv;
        kt_kv_cache_stats(kt_engine_kv_cache(e), &kv);
        const uint64_t kv_bytes = i == 0 ? kv.block_bytes * kv.n_blocks : 0; /* on the sim with attention */
        KT_CHECK(want.kv_cache == kv_bytes, "case %d: predicted %llu KV bytes, the pool has %llu", i,
                 (unsigned long long)want.kv_cache, (unsigned long long)kv_bytes);
        if (i == 0)
            packed_cpu = want.packed;
        kt_engine_destroy(e);
    }
    KT_CHECK(packed_cpu > kt_engine_host_bytes(m, &sim).packed && kt_engine_host_bytes(m, &sim).packed > 0,
             "the sim takes attention, dense and shared experts: %llu then %llu", (unsigned long long)packed_cpu,
             (unsigned long long)kt_engine_host_bytes(m, &sim).packed);
    kt_test_synth_remove(m, path);
}

static void engine_load_is_refused_by_a_fake_cgroup(void)
{
    char path[1024] = "";
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    /* A host with 64 GiB free, a group with 256 MiB. */
    const struct tree_file files[] = {
        {"proc/meminfo", MEMINFO_64G},
        {"proc/self/cgroup", "0::/kt\n"},
        {"proc/self/mountinfo", MOUNT_V2},
        {"sys/fs/cgroup/kt/memory.max", "268435456\n"},
        {"sys/fs/cgroup/kt/memory.current", "0\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cg-engine", files);
    struct kt_engine_test_params test = {.host_root = root};
    struct kt_engine_params p = {.n_ctx = 64, .n_threads = 1, .max_batch_tokens = 64, .test = &test};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    kt_status st = kt_engine_create(m, &p, &e, &err);
    KT_CHECK(st == KT_ERR_NOMEM && e == NULL, "status %s: %s", kt_status_name(st), err.msg);
    KT_CHECK(strstr(err.msg, "loading the routed experts, packing the host matrices and the KV cache needs") &&
                 strstr(err.msg, "memory limit is 0.25 GiB") &&
                 strstr(err.msg, "/sys/fs/cgroup/kt/memory.max"),
             "message: %s", err.msg);
    kt_engine_destroy(e);

    /* Raise the limit and the same load goes through. */
    KT_CHECK(kt_test_write_tree_file(root, "sys/fs/cgroup/kt/memory.max", "max\n"), "raise");
    st = kt_engine_create(m, &p, &e, &err);
    KT_CHECK(st == KT_OK, "without the limit: %s", err.msg);
    kt_engine_destroy(e);
    remove_tree(root);
    kt_test_synth_remove(m, path);
}

/* ---- CPUs -------------------------------------------------------------------------------- */

/* What the machine itself allows: online CPUs and this process's affinity. */
static int machine_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = online > 0 ? (int)online : 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < n)
        n = CPU_COUNT(&set);
    return n;
}

static void cpu_quota_and_cpuset_set_the_thread_count(void)
{
    const int machine = machine_cpus();
    struct kt_cpu_budget b;
    kt_err err = {0};

    /* No cgroup files: what the machine allows. */
    const struct tree_file bare[] = {{"proc/meminfo", MEMINFO_64G}, {NULL, NULL}};
    const char *root = make_tree("cpu-bare", bare);
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_OK && b.cpus == machine && b.online_cpus >= machine,
             "no cgroups: %d of %d (%s)", b.cpus, b.online_cpus, err.msg);
    KT_CHECK((b.cpus < b.online_cpus) == (b.why[0] != 0), "why is given exactly when fewer: '%s'", b.why);
    remove_tree(root);

    /* v2: half a CPU in the parent binds a child without a quota: one thread. */
    const struct tree_file v2[] = {
        {"proc/self/cgroup", "0::/kt/job\n"},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V2},
        {"sys/fs/cgroup/kt/cpu.max", "50000 100000\n"},
        {"sys/fs/cgroup/kt/job/cpu.max", "max 100000\n"},
        {NULL, NULL},
    };
    root = make_tree("cpu-v2", v2);
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_OK && b.cpus == 1, "quota 0.5: %d (%s)", b.cpus, err.msg);
    if (b.online_cpus > 1)
        KT_CHECK(strstr(b.why, "CPU quota is 0.50 CPUs") && strstr(b.why, "/sys/fs/cgroup/kt/cpu.max: 50000 100000"),
                 "why: %s", b.why);
    /* 1.5 CPUs run two threads (rounded up), where the machine has two. */
    KT_CHECK(kt_test_write_tree_file(root, "sys/fs/cgroup/kt/cpu.max", "150000 100000\n"), "write");
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_OK && b.cpus == (machine < 2 ? machine : 2),
             "quota 1.5: %d (%s)", b.cpus, err.msg);
    /* A cpuset of one CPU. */
    KT_CHECK(kt_test_write_tree_file(root, "sys/fs/cgroup/kt/cpu.max", "max 100000\n"), "write");
    KT_CHECK(kt_test_write_tree_file(root, "sys/fs/cgroup/kt/job/cpuset.cpus.effective", "3\n"), "write");
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_OK && b.cpus == 1, "cpuset 3: %d (%s)", b.cpus, err.msg);
    if (b.online_cpus > 1)
        KT_CHECK(strstr(b.why, "cpuset allows 1 CPU (") && strstr(b.why, "job/cpuset.cpus.effective: 3"), "why: %s",
                 b.why);
    /* A wide cpuset does not raise the count above what the machine allows. */
    KT_CHECK(kt_test_write_tree_file(root, "sys/fs/cgroup/kt/job/cpuset.cpus.effective", "0-1023\n"), "write");
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_OK && b.cpus == machine, "cpuset 0-1023: %d", b.cpus);
    remove_tree(root);

    /* v1: cfs quota and period, the cpuset in its own hierarchy. */
    const struct tree_file v1[] = {
        {"proc/self/cgroup", SELF_V1},
        {"proc/self/mountinfo", MOUNT_ROOTFS MOUNT_V1},
        {"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n"},
        {"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n"},
        {"sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "40000\n"},
        {"sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n"},
        {"sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "0-63\n"},
        {NULL, NULL},
    };
    root = make_tree("cpu-v1", v1);
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_OK && b.cpus == 1, "v1 quota 0.4: %d (%s)", b.cpus, err.msg);
    if (b.online_cpus > 1)
        KT_CHECK(strstr(b.why, "0.40 CPUs") && strstr(b.why, "docker/cpu.cfs_quota_us: 40000 / 100000"), "why: %s",
                 b.why);
    remove_tree(root);
}

/* One CPU file of a working tree replaced by text: KT_ERR_FORMAT naming it. */
static void expect_cpu_garbage(const char *rel, const char *text, const char *needle)
{
    struct tree_file files[] = {
        {"proc/self/cgroup", SELF_V1},
        {"proc/self/mountinfo", MOUNT_V1},
        {"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n"},
        {"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n"},
        {"sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "0-3\n"},
        {"sys/fs/cgroup/unified/cpu.max", "max 100000\n"},
        {NULL, NULL},
    };
    for (struct tree_file *f = files; f->rel; f++)
        if (!strcmp(f->rel, rel))
            f->text = text;
    const char *root = make_tree("cpu-garbage", files);
    struct kt_cpu_budget b;
    kt_err err = {0};
    kt_status st = kt_cpu_budget_read(root, &b, &err);
    KT_CHECK(st == KT_ERR_FORMAT && strstr(err.msg, rel) && strstr(err.msg, needle) &&
                 strstr(err.msg, "give the thread count explicitly"),
             "%s holding '%s': %s '%s'", rel, text, kt_status_name(st), err.msg);
    remove_tree(root);
}

static void cpu_garbage_is_an_error_naming_the_file(void)
{
    const char *quota = "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us";
    const char *period = "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us";
    const char *cpuset = "sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus";
    expect_cpu_garbage(quota, "fast\n", "\"fast\" is not -1 or a positive number");
    expect_cpu_garbage(quota, "0\n", "\"0\" is not -1");
    expect_cpu_garbage(period, "0\n", "not a positive number of microseconds");
    expect_cpu_garbage(period, "", "not a positive number");
    expect_cpu_garbage(cpuset, "0-\n", "\"0-\" is not a CPU list");
    expect_cpu_garbage(cpuset, "3-1\n", "\"3-1\" is not a CPU list");
    expect_cpu_garbage(cpuset, "\n", "\"\" is not a CPU list");
    expect_cpu_garbage(cpuset, "0,,1\n", "\"0,,1\"");
    expect_cpu_garbage(cpuset, "99999999999\n", "is not a CPU list");

    /* A quota without its period. */
    const struct tree_file no_period[] = {
        {"proc/self/cgroup", SELF_V1},
        {"proc/self/mountinfo", MOUNT_V1},
        {"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n"},
        {NULL, NULL},
    };
    const char *root = make_tree("cpu-noperiod", no_period);
    struct kt_cpu_budget b;
    kt_err err = {0};
    KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_ERR_FORMAT && strstr(err.msg, "cpu.cfs_period_us: missing") &&
                 strstr(err.msg, "50000 us"),
             "no period: %s", err.msg);
    remove_tree(root);

    /* v2 cpu.max forms the kernel never writes. */
    static const char *bad_max[] = {"lots 100000\n", "50000 0\n", "50000 100000 7\n", "0 100000\n", "max x\n", ""};
    for (size_t i = 0; i < sizeof bad_max / sizeof bad_max[0]; i++) {
        const struct tree_file v2[] = {
            {"proc/self/cgroup", "0::/job\n"},
            {"proc/self/mountinfo", MOUNT_V2},
            {"sys/fs/cgroup/job/cpu.max", bad_max[i]},
            {NULL, NULL},
        };
        root = make_tree("cpu-v2bad", v2);
        KT_CHECK(kt_cpu_budget_read(root, &b, &err) == KT_ERR_FORMAT && strstr(err.msg, "job/cpu.max") &&
                     strstr(err.msg, "is not \"QUOTA PERIOD\""),
                 "cpu.max '%s': %s", bad_max[i], err.msg);
        remove_tree(root);
    }
}

int main(void)
{
    KT_RUN(v2_limit_counts_usage_less_inactive_file);
    KT_RUN(the_group_with_least_room_counts);
    KT_RUN(max_and_missing_files_mean_no_limit);
    KT_RUN(v1_hierarchies_and_container_mounts);
    KT_RUN(garbage_is_an_error_naming_the_file);
    KT_RUN(engine_host_bytes_are_predicted_exactly);
    KT_RUN(engine_load_is_refused_by_a_fake_cgroup);
    KT_RUN(cpu_quota_and_cpuset_set_the_thread_count);
    KT_RUN(cpu_garbage_is_an_error_naming_the_file);
    return kt_test_finish();
}

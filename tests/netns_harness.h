/*
 * netns_harness.h - two "hosts" on one machine for the tests that run an MPI
 * job across them (test_kt_run_netns, test_kt_serve_netns): two network
 * namespaces joined by a veth pair, one rank in each, OpenMPI over TCP
 * between them.  Header-only: each test program includes it once.
 *
 * The set-up, all of it undone by netns_teardown (also after a failure, the
 * watchdog's timeout or SIGTERM/SIGINT/SIGHUP; names of an earlier run that
 * was killed outright are removed at the start):
 *   namespaces kt-netns-a-PID and kt-netns-b-PID (`ip netns add`), a veth pair
 *   kta<PID> / ktb<PID> between them, 10.213.X.1/30 and 10.213.X.2/30, lo up
 *   in each: those are all the addresses the job can use.
 *   netns_mpirun() runs mpirun in a (so rank 0 is there, under mpirun
 *   itself) with --host 10.213.X.1,10.213.X.2; OpenMPI starts the daemon of
 *   the other host through its rsh agent, here a script that runs the command
 *   in b (`nsenter --net`) with a hostname of its own (`unshare --uts`) and
 *   its own TMPDIR; the daemons' out-of-band channel and the MPI transport
 *   are TCP restricted to the /30 (--mca oob_tcp_if_include /
 *   btl_tcp_if_include, --mca btl tcp,self).
 * Why nsenter and not `ip netns exec` / `ip -n`: those remount / as a slave
 * and /sys for the namespace, and the first fails in a chroot whose root is
 * no mount point (CI's fresh Debian root: "mount --make-rslave / failed");
 * joining the network namespace is all a rank needs.
 *
 * netns_unavailable() says why a test must skip (visibly): no MPI, mpirun,
 * root, CAP_SYS_ADMIN + CAP_NET_ADMIN, `ip` (iproute2), or nsenter/unshare
 * (util-linux).
 */
#ifndef KT_TEST_NETNS_HARNESS_H
#define KT_TEST_NETNS_HARNESS_H

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "testlib.h"

#define NETNS_PREFIX "kt-netns-"

/* What this run found and made: tools, names, addresses, the scripts it writes. */
static struct {
    char mpirun[1024], ip[1024], nsenter[1024], unshare[1024], hostname[1024];
    char test[64]; /* the test's name, in the scripts and their messages */
    char ns_a[64], ns_b[64], if_a[16], if_b[16];
    char addr_a[32], addr_b[32], net[32], host_b[64];
    char agent[1024], cleanup[1024], tmp_b[1024];
    bool made; /* the namespaces may exist: teardown has work */
} netns;

/* The signal handler's exec of the cleanup script (async-signal-safe). */
static char *netns_cleanup_argv[4];
static char *const netns_cleanup_envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};

static void netns_on_signal(int sig)
{
    (void)sig;
    if (netns.made)
        execve("/bin/sh", netns_cleanup_argv, netns_cleanup_envp);
    _exit(1);
}

/* dir/name when it is an executable in PATH or an sbin folder (root's
 * PATH may lack them). */
static inline bool netns_find_tool(const char *name, char *out, size_t size)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin", path ? path : "");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        if (!*d)
            continue;
        snprintf(out, size, "%s/%s", d, name);
        if (access(out, X_OK) == 0)
            return true;
    }
    return false;
}

/* The effective capability set of this process (/proc/self/status CapEff). */
static inline uint64_t netns_effective_caps(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    uint64_t caps = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %" SCNx64, &caps) == 1)
            break;
    fclose(f);
    return caps;
}

/* Why the namespaces cannot be made here (a skip reason), or NULL when they
 * can: the tools are found then. */
static inline const char *netns_unavailable(void)
{
    const char *have = getenv("KT_HAVE_MPI"), *exe = getenv("KT_MPIEXEC");
    if (!have || strcmp(have, "ON") != 0)
        return "kt was built without MPI (apt-get install libopenmpi-dev openmpi-bin, then configure with "
               "-DKT_MPI=ON)";
    if (!exe || !*exe || access(exe, X_OK) != 0)
        return "mpirun not found (apt-get install openmpi-bin)";
    snprintf(netns.mpirun, sizeof netns.mpirun, "%s", exe);
    if (geteuid() != 0)
        return "not root (network namespaces and a veth pair need root)";
    const uint64_t need = (1ull << 21) | (1ull << 12); /* CAP_SYS_ADMIN, CAP_NET_ADMIN */
    if ((netns_effective_caps() & need) != need)
        return "no CAP_SYS_ADMIN and CAP_NET_ADMIN (a container that may not make network namespaces)";
    if (!netns_find_tool("ip", netns.ip, sizeof netns.ip))
        return "no ip (apt-get install iproute2)";
    if (!netns_find_tool("nsenter", netns.nsenter, sizeof netns.nsenter) ||
        !netns_find_tool("unshare", netns.unshare, sizeof netns.unshare) ||
        !netns_find_tool("hostname", netns.hostname, sizeof netns.hostname))
        return "no nsenter, unshare or hostname (util-linux, hostname)";
    return NULL;
}

/* Removes namespaces of these tests whose process is gone (a run that was
 * killed outright, ctest's SIGKILL at its timeout): their processes first,
 * then the name; the veth pair goes with its namespaces. */
static inline void netns_remove_stale(void)
{
    DIR *d = opendir("/run/netns");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char side;
        int pid, end = 0;
        if (sscanf(e->d_name, NETNS_PREFIX "%c-%d%n", &side, &pid, &end) != 2 || e->d_name[end] != '\0' ||
            (side != 'a' && side != 'b') || pid <= 0 || pid == getpid())
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue; /* still running: another instance of these tests */
        printf("removing %s, left by a run that did not finish\n", e->d_name);
        kt_test_system("pids=$(%s netns pids %s 2>/dev/null); [ -z \"$pids\" ] || kill -KILL $pids; %s netns del %s",
                       netns.ip, e->d_name, netns.ip, e->d_name);
    }
    closedir(d);
}

/* Writes text to path (temp + rename) with mode. */
static inline bool netns_write_script(const char *path, const char *text, mode_t mode)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return false;
    const bool ok = fputs(text, f) >= 0;
    if (fclose(f) != 0 || !ok || chmod(tmp, mode) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return false;
    }
    return true;
}

/* The cleanup script (run by teardown, and exec'd by the signal handler with
 * "signal", then it exits 1) and the rsh agent. */
static inline bool netns_write_scripts(void)
{
    char text[16384];
    snprintf(text, sizeof text,
             "#!/bin/sh\n"
             "# %s: remove what this run made: the job's processes, the veth pair, the namespaces\n"
             "for ns in %s %s; do\n"
             "    [ -e /run/netns/$ns ] || continue\n"
             "    pids=$(%s netns pids $ns 2>/dev/null)\n"
             "    [ -z \"$pids\" ] || kill -KILL $pids 2>/dev/null\n"
             "done\n"
             "[ -e /run/netns/%s ] && %s --net=/run/netns/%s %s link del %s 2>/dev/null\n"
             "%s netns del %s 2>/dev/null\n"
             "%s netns del %s 2>/dev/null\n"
             "rm -rf %s\n"
             "[ \"$1\" = signal ] && { echo '%s: interrupted; namespaces removed' >&2; exit 1; }\n"
             "exit 0\n",
             netns.test, netns.ns_a, netns.ns_b, netns.ip, netns.ns_a, netns.nsenter, netns.ns_a, netns.ip,
             netns.if_a, netns.ip, netns.ns_a, netns.ip, netns.ns_b, netns.tmp_b, netns.test);
    if (!netns_write_script(netns.cleanup, text, 0700))
        return false;
    /* mpirun runs `AGENT HOST COMMAND...`, COMMAND words for a shell (the
     * daemon, its environment and options): the agent starts it in b, in a
     * UTS namespace of its own named after b; only b's address is a host. */
    snprintf(text, sizeof text,
             "#!/bin/sh\n"
             "# %s: OpenMPI's rsh agent for host %s, the namespace %s\n"
             "if [ -z \"$KT_NETNS_INNER\" ]; then\n"
             "    [ \"$1\" = %s ] || { echo \"kt netns agent: no host $1 here (only %s)\" >&2; exit 1; }\n"
             "    shift\n"
             "    KT_NETNS_INNER=1 TMPDIR=%s exec %s --net=/run/netns/%s %s --uts /bin/sh \"$0\" \"$*\"\n"
             "fi\n"
             "%s %s || exit 1\n"
             "exec /bin/sh -c \"$1\"\n",
             netns.test, netns.addr_b, netns.ns_b, netns.addr_b, netns.addr_b, netns.tmp_b, netns.nsenter, netns.ns_b,
             netns.unshare, netns.hostname, netns.host_b);
    return netns_write_script(netns.agent, text, 0700);
}

/* Removes everything netns_setup made (the job's processes with it) and
 * checks that nothing is left. */
static inline void netns_teardown(void)
{
    if (!netns.made)
        return;
    int rc = kt_test_system("/bin/sh %s", netns.cleanup);
    netns.made = false;
    struct stat st;
    char p[128];
    snprintf(p, sizeof p, "/run/netns/%s", netns.ns_a);
    const bool a_left = stat(p, &st) == 0;
    snprintf(p, sizeof p, "/run/netns/%s", netns.ns_b);
    const bool b_left = stat(p, &st) == 0;
    KT_CHECK(rc == 0 && !a_left && !b_left, "cleanup: exit %d, %s%s left", rc, a_left ? netns.ns_a : "",
             b_left ? netns.ns_b : "");
    const int veth = kt_test_system("%s link show %s >/dev/null 2>&1", netns.ip, netns.if_a);
    KT_CHECK(veth != 0, "the veth %s is still there after the cleanup", netns.if_a);
}

/* The two namespaces, the veth between them, addresses and links up, for
 * test (its name); the cleanup on SIGTERM/SIGINT/SIGHUP and after
 * watchdog_s seconds (SIGALRM: the whole test's bound). */
static inline bool netns_setup(const char *test, unsigned watchdog_s)
{
    struct sigaction sa = {.sa_handler = netns_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    alarm(watchdog_s);
    netns_remove_stale();

    const int pid = (int)getpid();
    snprintf(netns.test, sizeof netns.test, "%s", test);
    snprintf(netns.ns_a, sizeof netns.ns_a, NETNS_PREFIX "a-%d", pid);
    snprintf(netns.ns_b, sizeof netns.ns_b, NETNS_PREFIX "b-%d", pid);
    snprintf(netns.if_a, sizeof netns.if_a, "kta%d", pid);
    snprintf(netns.if_b, sizeof netns.if_b, "ktb%d", pid);
    snprintf(netns.host_b, sizeof netns.host_b, NETNS_PREFIX "b-%d", pid);
    const int x = pid % 250 + 1;
    snprintf(netns.addr_a, sizeof netns.addr_a, "10.213.%d.1", x);
    snprintf(netns.addr_b, sizeof netns.addr_b, "10.213.%d.2", x);
    snprintf(netns.net, sizeof netns.net, "10.213.%d.0/30", x);
    snprintf(netns.agent, sizeof netns.agent, "%s", kt_test_path("netns-agent.sh"));
    snprintf(netns.cleanup, sizeof netns.cleanup, "%s", kt_test_path("netns-cleanup.sh"));
    snprintf(netns.tmp_b, sizeof netns.tmp_b, "%s", kt_test_path("netns-tmp-b"));
    netns_cleanup_argv[0] = "sh", netns_cleanup_argv[1] = netns.cleanup, netns_cleanup_argv[2] = "signal",
    netns_cleanup_argv[3] = NULL;
    if (!netns_write_scripts()) {
        KT_CHECK(false, "cannot write %s or %s", netns.cleanup, netns.agent);
        return false;
    }
    KT_CHECK(mkdir(netns.tmp_b, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", netns.tmp_b, strerror(errno));
    netns.made = true;
    const char *log = kt_test_path("netns-setup.log");
    /* `ip netns add` makes /run/netns (a mount point of its own) when it is not there */
    int rc = kt_test_system(
        "exec >%s 2>&1; set -ex; %s netns add %s; %s netns add %s; "
        "%s link add %s netns %s type veth peer name %s netns %s; "
        "%s --net=/run/netns/%s sh -ec '%s link set lo up; %s addr add %s/30 dev %s; %s link set %s up'; "
        "%s --net=/run/netns/%s sh -ec '%s link set lo up; %s addr add %s/30 dev %s; %s link set %s up'",
        log, netns.ip, netns.ns_a, netns.ip, netns.ns_b, netns.ip, netns.if_a, netns.ns_a, netns.if_b, netns.ns_b,
        netns.nsenter, netns.ns_a, netns.ip, netns.ip, netns.addr_a, netns.if_a, netns.ip, netns.if_a, netns.nsenter,
        netns.ns_b, netns.ip, netns.ip, netns.addr_b, netns.if_b, netns.ip, netns.if_b);
    if (rc != 0) {
        size_t n = 0;
        char *text = kt_test_read_file(log, &n);
        KT_CHECK(false, "namespaces and veth: exit %d:\n%s", rc, text ? text : "");
        free(text);
        return false;
    }
    return true;
}

/* The prefix that runs a command in a: "nsenter --net=/run/netns/A". */
static inline const char *netns_in_a(void)
{
    static char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --net=/run/netns/%s", netns.nsenter, netns.ns_a);
    return cmd;
}

/* ... in b. */
static inline const char *netns_in_b(void)
{
    static char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --net=/run/netns/%s", netns.nsenter, netns.ns_b);
    return cmd;
}

/* The launcher of a 2-rank job, rank 0 in a and rank 1 in b: mpirun run in
 * a, the agent starting b's daemon, TCP on the /30 alone. */
static inline const char *netns_mpirun(void)
{
    static char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s %s -np 2 --host %s,%s --allow-run-as-root --mca plm_rsh_agent %s "
             "--mca oob_tcp_if_include %s --mca btl tcp,self --mca btl_tcp_if_include %s",
             netns_in_a(), netns.mpirun, netns.addr_a, netns.addr_b, netns.agent, netns.net, netns.net);
    return cmd;
}

/* b's veth counters (/proc/net/dev read in b); false when not found. */
static inline bool netns_veth_b_bytes(uint64_t *rx, uint64_t *tx)
{
    const char *out = kt_test_path("netns-dev.txt");
    if (kt_test_system("%s --net=/run/netns/%s cat /proc/net/dev >%s 2>&1", netns.nsenter, netns.ns_b, out) != 0)
        return false;
    size_t n = 0;
    char *text = kt_test_read_file(out, &n);
    if (!text)
        return false;
    char key[32];
    snprintf(key, sizeof key, "%s:", netns.if_b);
    const char *at = strstr(text, key);
    unsigned long long r, skip[7], t;
    const bool ok = at && sscanf(at + strlen(key), "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &r, &skip[0],
                                 &skip[1], &skip[2], &skip[3], &skip[4], &skip[5], &skip[6], &t) == 9;
    free(text);
    if (ok)
        *rx = r, *tx = t;
    return ok;
}

/* The embedding width of the model at path (the bytes an activation row
 * sends per token), 0 if it does not open. */
static inline uint32_t netns_model_n_embd(const char *path)
{
    struct kt_model *m = NULL;
    kt_err err;
    uint32_t n_embd = 0;
    if (kt_model_open(path, &m, &err) == KT_OK) {
        struct kt_model_identity id;
        kt_model_identity(m, &id);
        n_embd = id.n_embd;
        kt_model_close(m);
    }
    return n_embd;
}

/* The namespace (of the two) that process pid is in: 'a', 'b', or 0 when
 * neither (or it is gone): its /proc/PID/ns/net against the names'. */
static inline char netns_of_pid(pid_t pid)
{
    char path[128];
    struct stat mine, a, b;
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
    if (stat(path, &mine) != 0)
        return 0;
    snprintf(path, sizeof path, "/run/netns/%s", netns.ns_a);
    if (stat(path, &a) == 0 && a.st_dev == mine.st_dev && a.st_ino == mine.st_ino)
        return 'a';
    snprintf(path, sizeof path, "/run/netns/%s", netns.ns_b);
    if (stat(path, &b) == 0 && b.st_dev == mine.st_dev && b.st_ino == mine.st_ino)
        return 'b';
    return 0;
}

#endif

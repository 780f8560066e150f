/*
 * test_kt_run_netns.c - kt-run over two "hosts" for real (runtime/dist): two
 * network namespaces joined by a veth pair, one rank in each, OpenMPI over
 * TCP between them, prints the same greedy tokens as one process and writes
 * logits within 1e-6 of its (tiny and tiny-v3, the prompt prefilled in
 * chunks).
 *
 * The set-up, all of it undone at the end (also after a failure, a timeout
 * or SIGTERM/SIGINT/SIGHUP; names of an earlier run that was killed outright
 * are removed at the start):
 *   namespaces kt-netns-a-PID and kt-netns-b-PID (`ip netns add`), a veth pair
 *   kta<PID> / ktb<PID> between them, 10.213.X.1/30 and 10.213.X.2/30, lo up
 *   in each: those are all the addresses the job can use.
 *   mpirun runs in a (so rank 0 is there, under mpirun itself) with
 *   --host 10.213.X.1,10.213.X.2; OpenMPI starts the daemon of the other
 *   host through its rsh agent, here a script that runs the command in b
 *   (`nsenter --net`) with a hostname of its own (`unshare --uts`) and its
 *   own TMPDIR; the daemons' out-of-band channel and the MPI transport are
 *   TCP restricted to the /30 (--mca oob_tcp_if_include / btl_tcp_if_include,
 *   --mca btl tcp,self).
 * Why nsenter and not `ip netns exec` / `ip -n`: those remount / as a slave
 * and /sys for the namespace, and the first fails in a chroot whose root is
 * no mount point (CI's fresh Debian root: "mount --make-rslave / failed");
 * joining the network namespace is all a rank needs.
 *
 * Checked besides the equality: rank 1 ran in b (its log names b's
 * hostname), and the stream crossed the veth (b's interface received and
 * sent at least the residual stream of every token: /proc/net/dev in b).
 *
 * Skipped (visibly) without MPI, mpirun, root, CAP_SYS_ADMIN + CAP_NET_ADMIN,
 * `ip` (iproute2), or nsenter/unshare (util-linux).
 */
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
#include "mpi_harness.h"
#include "testlib.h"

#define RUN_TIMEOUT_S 90     /* one mpirun (it takes about a second on tiny) */
#define WATCHDOG_S 400       /* the whole test, under ctest's 600 s */
#define NS_PREFIX "kt-netns-"

static char mpirun[1024], ip_tool[1024], nsenter_tool[1024], unshare_tool[1024], hostname_tool[1024];

/* What this run made: names, addresses, the scripts it writes. */
static struct {
    char ns_a[64], ns_b[64], if_a[16], if_b[16];
    char addr_a[32], addr_b[32], net[32], host_b[64];
    char agent[1024], cleanup[1024], tmp_b[1024];
} net;

static bool made; /* the namespaces may exist: teardown has work */

/* The signal handler's exec of the cleanup script (async-signal-safe). */
static char *cleanup_argv[4];
static char *const cleanup_envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};

static void on_signal(int sig)
{
    (void)sig;
    if (made)
        execve("/bin/sh", cleanup_argv, cleanup_envp);
    _exit(1);
}

/* dir/name when it is an executable in PATH or an sbin folder (root's
 * PATH may lack them). */
static bool find_tool(const char *name, char *out, size_t size)
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
static uint64_t effective_caps(void)
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

/* Removes namespaces of this test whose process is gone (a run that was
 * killed outright, ctest's SIGKILL at its timeout): their processes first,
 * then the name; the veth pair goes with its namespaces. */
static void remove_stale(void)
{
    DIR *d = opendir("/run/netns");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char side;
        int pid, end = 0;
        if (sscanf(e->d_name, NS_PREFIX "%c-%d%n", &side, &pid, &end) != 2 || e->d_name[end] != '\0' ||
            (side != 'a' && side != 'b') || pid <= 0 || pid == getpid())
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue; /* still running: another instance of this test */
        printf("removing %s, left by a run that did not finish\n", e->d_name);
        kt_test_system("pids=$(%s netns pids %s 2>/dev/null); [ -z \"$pids\" ] || kill -KILL $pids; %s netns del %s",
                       ip_tool, e->d_name, ip_tool, e->d_name);
    }
    closedir(d);
}

/* Writes text to path (temp + rename) with mode. */
static bool write_script(const char *path, const char *text, mode_t mode)
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
static bool write_scripts(void)
{
    char text[16384];
    snprintf(text, sizeof text,
             "#!/bin/sh\n"
             "# test_kt_run_netns: remove what this run made: the job's processes, the veth pair, the namespaces\n"
             "for ns in %s %s; do\n"
             "    [ -e /run/netns/$ns ] || continue\n"
             "    pids=$(%s netns pids $ns 2>/dev/null)\n"
             "    [ -z \"$pids\" ] || kill -KILL $pids 2>/dev/null\n"
             "done\n"
             "[ -e /run/netns/%s ] && %s --net=/run/netns/%s %s link del %s 2>/dev/null\n"
             "%s netns del %s 2>/dev/null\n"
             "%s netns del %s 2>/dev/null\n"
             "rm -rf %s\n"
             "[ \"$1\" = signal ] && { echo 'test_kt_run_netns: interrupted; namespaces removed' >&2; exit 1; }\n"
             "exit 0\n",
             net.ns_a, net.ns_b, ip_tool, net.ns_a, nsenter_tool, net.ns_a, ip_tool, net.if_a, ip_tool, net.ns_a,
             ip_tool, net.ns_b, net.tmp_b);
    if (!write_script(net.cleanup, text, 0700))
        return false;
    /* mpirun runs `AGENT HOST COMMAND...`, COMMAND words for a shell (the
     * daemon, its environment and options): the agent starts it in b, in a
     * UTS namespace of its own named after b; only b's address is a host. */
    snprintf(text, sizeof text,
             "#!/bin/sh\n"
             "# test_kt_run_netns: OpenMPI's rsh agent for host %s, the namespace %s\n"
             "if [ -z \"$KT_NETNS_INNER\" ]; then\n"
             "    [ \"$1\" = %s ] || { echo \"kt netns agent: no host $1 here (only %s)\" >&2; exit 1; }\n"
             "    shift\n"
             "    KT_NETNS_INNER=1 TMPDIR=%s exec %s --net=/run/netns/%s %s --uts /bin/sh \"$0\" \"$*\"\n"
             "fi\n"
             "%s %s || exit 1\n"
             "exec /bin/sh -c \"$1\"\n",
             net.addr_b, net.ns_b, net.addr_b, net.addr_b, net.tmp_b, nsenter_tool, net.ns_b, unshare_tool,
             hostname_tool, net.host_b);
    return write_script(net.agent, text, 0700);
}

static void teardown(void)
{
    if (!made)
        return;
    int rc = kt_test_system("/bin/sh %s", net.cleanup);
    made = false;
    struct stat st;
    char p[128];
    snprintf(p, sizeof p, "/run/netns/%s", net.ns_a);
    const bool a_left = stat(p, &st) == 0;
    snprintf(p, sizeof p, "/run/netns/%s", net.ns_b);
    const bool b_left = stat(p, &st) == 0;
    KT_CHECK(rc == 0 && !a_left && !b_left, "cleanup: exit %d, %s%s left", rc, a_left ? net.ns_a : "",
             b_left ? net.ns_b : "");
    const int veth = kt_test_system("%s link show %s >/dev/null 2>&1", ip_tool, net.if_a);
    KT_CHECK(veth != 0, "the veth %s is still there after the cleanup", net.if_a);
}

/* The two namespaces, the veth between them, addresses and links up. */
static bool setup(void)
{
    const int pid = (int)getpid();
    snprintf(net.ns_a, sizeof net.ns_a, NS_PREFIX "a-%d", pid);
    snprintf(net.ns_b, sizeof net.ns_b, NS_PREFIX "b-%d", pid);
    snprintf(net.if_a, sizeof net.if_a, "kta%d", pid);
    snprintf(net.if_b, sizeof net.if_b, "ktb%d", pid);
    snprintf(net.host_b, sizeof net.host_b, NS_PREFIX "b-%d", pid);
    const int x = pid % 250 + 1;
    snprintf(net.addr_a, sizeof net.addr_a, "10.213.%d.1", x);
    snprintf(net.addr_b, sizeof net.addr_b, "10.213.%d.2", x);
    snprintf(net.net, sizeof net.net, "10.213.%d.0/30", x);
    snprintf(net.agent, sizeof net.agent, "%s", kt_test_path("netns-agent.sh"));
    snprintf(net.cleanup, sizeof net.cleanup, "%s", kt_test_path("netns-cleanup.sh"));
    snprintf(net.tmp_b, sizeof net.tmp_b, "%s", kt_test_path("netns-tmp-b"));
    cleanup_argv[0] = "sh", cleanup_argv[1] = net.cleanup, cleanup_argv[2] = "signal", cleanup_argv[3] = NULL;
    if (!write_scripts()) {
        KT_CHECK(false, "cannot write %s or %s", net.cleanup, net.agent);
        return false;
    }
    KT_CHECK(mkdir(net.tmp_b, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", net.tmp_b, strerror(errno));
    made = true;
    const char *log = kt_test_path("netns-setup.log");
    /* `ip netns add` makes /run/netns (a mount point of its own) when it is not there */
    int rc = kt_test_system("exec >%s 2>&1; set -ex; %s netns add %s; %s netns add %s; "
                            "%s link add %s netns %s type veth peer name %s netns %s; "
                            "%s --net=/run/netns/%s sh -ec '%s link set lo up; %s addr add %s/30 dev %s; %s link set %s up'; "
                            "%s --net=/run/netns/%s sh -ec '%s link set lo up; %s addr add %s/30 dev %s; %s link set %s up'",
                            log, ip_tool, net.ns_a, ip_tool, net.ns_b, ip_tool, net.if_a, net.ns_a, net.if_b, net.ns_b,
                            nsenter_tool, net.ns_a, ip_tool, ip_tool, net.addr_a, net.if_a, ip_tool, net.if_a,
                            nsenter_tool, net.ns_b, ip_tool, ip_tool, net.addr_b, net.if_b, ip_tool, net.if_b);
    if (rc != 0) {
        size_t n = 0;
        char *text = kt_test_read_file(log, &n);
        KT_CHECK(false, "namespaces and veth: exit %d:\n%s", rc, text ? text : "");
        free(text);
        return false;
    }
    return true;
}

/* b's veth counters (/proc/net/dev read in b); false when not found. */
static bool veth_b_bytes(uint64_t *rx, uint64_t *tx)
{
    const char *out = kt_test_path("netns-dev.txt");
    if (kt_test_system("%s --net=/run/netns/%s cat /proc/net/dev >%s 2>&1", nsenter_tool, net.ns_b, out) != 0)
        return false;
    size_t n = 0;
    char *text = kt_test_read_file(out, &n);
    if (!text)
        return false;
    char key[32];
    snprintf(key, sizeof key, "%s:", net.if_b);
    const char *at = strstr(text, key);
    unsigned long long r, skip[7], t;
    const bool ok = at && sscanf(at + strlen(key), "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &r, &skip[0],
                                 &skip[1], &skip[2], &skip[3], &skip[4], &skip[5], &skip[6], &t) == 9;
    free(text);
    if (ok)
        *rx = r, *tx = t;
    return ok;
}

/* "prompt tokens N" from a kt-run log; 0 when absent. */
static unsigned prompt_tokens(const char *tag)
{
    char path[1024];
    snprintf(path, sizeof path, "%s.log", kt_test_path(tag));
    size_t n = 0;
    char *text = kt_test_read_file(path, &n);
    const char *at = text ? strstr(text, "prompt tokens") : NULL;
    unsigned v = 0;
    if (!at || sscanf(at, "prompt tokens %u", &v) != 1)
        v = 0;
    free(text);
    return v;
}

static void two_namespaces_match_one_process(const char *preset)
{
    char model[1024], single[64], tag[64];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path(preset));
    int rc = kt_test_system("%s --preset %s -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), preset, model);
    KT_CHECK(rc == 0, "kt-synth --preset %s: %d", preset, rc);
    if (rc != 0)
        return;
    struct kt_model *m = NULL;
    kt_err err;
    uint32_t n_embd = 0;
    if (kt_model_open(model, &m, &err) == KT_OK) {
        struct kt_model_identity id;
        kt_model_identity(m, &id);
        n_embd = id.n_embd;
        kt_model_close(m);
    }
    KT_CHECK(n_embd > 0, "cannot open %s", model);
    snprintf(single, sizeof single, "netns-%s-1", preset);
    rc = mpi_run_kt_run("", model, single, RUN_TIMEOUT_S);
    KT_CHECK(rc == 0, "kt-run alone on %s: exit %d", preset, rc);

    uint64_t rx0 = 0, tx0 = 0, rx1 = 0, tx1 = 0;
    KT_CHECK(veth_b_bytes(&rx0, &tx0), "no counters of %s in %s", net.if_b, net.ns_b);
    char launcher[4096];
    snprintf(launcher, sizeof launcher,
             "%s --net=/run/netns/%s %s -np 2 --host %s,%s --allow-run-as-root --mca plm_rsh_agent %s "
             "--mca oob_tcp_if_include %s --mca btl tcp,self --mca btl_tcp_if_include %s",
             nsenter_tool, net.ns_a, mpirun, net.addr_a, net.addr_b,
             net.agent, net.net, net.net);
    snprintf(tag, sizeof tag, "netns-%s-2", preset);
    rc = mpi_run_kt_run(launcher, model, tag, RUN_TIMEOUT_S);
    char log[1024];
    snprintf(log, sizeof log, "%s.log", kt_test_path(tag));
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 0, "kt-run over %s and %s on %s: exit %d:\n%s", net.ns_a, net.ns_b, preset, rc,
             text ? text : "");
    if (rc == 0) {
        mpi_compare_runs(single, tag);
        char want[128];
        snprintf(want, sizeof want, "rank 1 (%s)", net.host_b);
        KT_CHECK(text && strstr(text, want), "rank 1 did not run in %s (no \"%s\" in its log):\n%s", net.ns_b, want,
                 text ? text : "");
        /* every token's residual stream went a -> b and back */
        const unsigned n_prompt = prompt_tokens(single);
        const uint64_t floor = (uint64_t)(n_prompt + 11) * n_embd * sizeof(float);
        KT_CHECK(n_prompt > 0, "no prompt token count in %s.log", kt_test_path(single));
        KT_CHECK(veth_b_bytes(&rx1, &tx1), "no counters of %s in %s", net.if_b, net.ns_b);
        KT_CHECK(rx1 - rx0 >= floor && tx1 - tx0 >= floor,
                 "%s carried %" PRIu64 " bytes in and %" PRIu64 " out, less than the stream's %" PRIu64, net.if_b,
                 rx1 - rx0, tx1 - tx0, floor);
        printf("%s: %s received %" PRIu64 " and sent %" PRIu64 " bytes (the stream alone: %" PRIu64 " each way)\n",
               preset, net.if_b, rx1 - rx0, tx1 - tx0, floor);
    }
    free(text);
}

static void tiny_over_two_namespaces_matches_one_process(void)
{
    two_namespaces_match_one_process("tiny");
}

static void tiny_v3_over_two_namespaces_matches_one_process(void)
{
    two_namespaces_match_one_process("tiny-v3");
}

int main(void)
{
    const char *have = getenv("KT_HAVE_MPI"), *exe = getenv("KT_MPIEXEC");
    if (!have || strcmp(have, "ON") != 0)
        return kt_test_skip("kt was built without MPI (apt-get install libopenmpi-dev openmpi-bin, then configure "
                            "with -DKT_MPI=ON)");
    if (!exe || !*exe || access(exe, X_OK) != 0)
        return kt_test_skip("mpirun not found (apt-get install openmpi-bin)");
    snprintf(mpirun, sizeof mpirun, "%s", exe);
    if (geteuid() != 0)
        return kt_test_skip("not root (network namespaces and a veth pair need root)");
    const uint64_t caps = effective_caps(), need = (1ull << 21) | (1ull << 12); /* CAP_SYS_ADMIN, CAP_NET_ADMIN */
    if ((caps & need) != need)
        return kt_test_skip("no CAP_SYS_ADMIN and CAP_NET_ADMIN (a container that may not make network namespaces)");
    if (!find_tool("ip", ip_tool, sizeof ip_tool))
        return kt_test_skip("no ip (apt-get install iproute2)");
    if (!find_tool("nsenter", nsenter_tool, sizeof nsenter_tool) ||
        !find_tool("unshare", unshare_tool, sizeof unshare_tool) ||
        !find_tool("hostname", hostname_tool, sizeof hostname_tool))
        return kt_test_skip("no nsenter, unshare or hostname (util-linux, hostname)");

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    alarm(WATCHDOG_S);

    remove_stale();
    if (setup()) {
        KT_RUN(tiny_over_two_namespaces_matches_one_process);
        KT_RUN(tiny_v3_over_two_namespaces_matches_one_process);
    }
    teardown();
    return kt_test_finish();
}

/* syscall_census: runs a command under ptrace, following every process and
 * thread it starts, and counts the system calls each process makes, by the
 * name of its executable and the first argument that distinguishes rgpu's
 * processes (--serve-worker, --serve-one-connection). Made to measure what
 * NVIDIA's user-space driver needs inside an rgpu worker process, for the
 * worker's seccomp allow-list. GPU host only (x86_64).
 *
 *   syscall_census OUT.tsv COMMAND [ARGS...]
 *
 * Writes "role<TAB>syscall number<TAB>count" lines to OUT.tsv when COMMAND
 * exits (or gets SIGTERM/SIGINT, which it forwards). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SYSCALL 512
#define MAX_ROLES 8
#define MAX_TASKS 65536

static const char *roles[MAX_ROLES] = {"other", "parent", "connection", "worker"};
static unsigned long counts[MAX_ROLES][MAX_SYSCALL];
/* Per traced task: its role (read off its process's command line at its
 * first system call, again after an exec), and whether it is inside a
 * system call. */
static unsigned char task_role[MAX_TASKS];
static unsigned char role_known[MAX_TASKS];
static unsigned char in_call[MAX_TASKS];
static pid_t root;

static int role_of(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    int is_daemon = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
        const char *arg = buf + i;
        if (strstr(arg, "vhost-device-rgpu")) is_daemon = 1;
        if (!strcmp(arg, "--serve-worker")) return 3;
        if (!strcmp(arg, "--serve-one-connection")) return 2;
    }
    return is_daemon ? 1 : 0;
}

static void forward(int sig) {
    if (root > 0) kill(root, sig);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.tsv COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    root = fork();
    if (root == 0) {
        ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        raise(SIGSTOP);
        execvp(argv[2], argv + 2);
        _exit(127);
    }
    signal(SIGTERM, forward);
    signal(SIGINT, forward);
    int status;
    waitpid(root, &status, 0);
    ptrace(PTRACE_SETOPTIONS, root, NULL,
           PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK |
               PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXEC);
    ptrace(PTRACE_SYSCALL, root, NULL, NULL);
    int live = 1;
    while (live > 0) {
        pid_t pid = waitpid(-1, &status, __WALL);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int sig = 0;
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            live--;
            continue;
        }
        if (!WIFSTOPPED(status)) continue;
        int stop = WSTOPSIG(status);
        int event = status >> 16;
        if (stop == (SIGTRAP | 0x80)) {
            if (pid < MAX_TASKS && !role_known[pid]) {
                task_role[pid] = (unsigned char)role_of(pid);
                role_known[pid] = 1;
            }
            if (pid < MAX_TASKS && !in_call[pid]) {
                struct user_regs_struct regs;
                if (ptrace(PTRACE_GETREGS, pid, NULL, &regs) == 0 && regs.orig_rax < MAX_SYSCALL)
                    counts[task_role[pid]][regs.orig_rax]++;
            }
            if (pid < MAX_TASKS) in_call[pid] ^= 1;
        } else if (event == PTRACE_EVENT_FORK || event == PTRACE_EVENT_VFORK ||
                   event == PTRACE_EVENT_CLONE) {
            unsigned long child = 0;
            ptrace(PTRACE_GETEVENTMSG, pid, NULL, &child);
            if (child < MAX_TASKS) {
                role_known[child] = 0;
                in_call[child] = 0;
            }
            live++;
        } else if (event == PTRACE_EVENT_EXEC) {
            if (pid < MAX_TASKS) {
                task_role[pid] = (unsigned char)role_of(pid);
                role_known[pid] = 1;
                in_call[pid] = 1; /* the exec's own exit stop follows */
            }
        } else if (stop == SIGSTOP || stop == SIGTRAP) {
            /* a new task's first stop, or a plain trap */
        } else {
            sig = stop;
        }
        ptrace(PTRACE_SYSCALL, pid, NULL, (void *)(long)sig);
    }
    FILE *out = fopen(argv[1], "w");
    if (!out) return 1;
    for (int r = 0; r < MAX_ROLES; r++)
        for (int s = 0; s < MAX_SYSCALL; s++)
            if (counts[r][s] && roles[r]) fprintf(out, "%s\t%d\t%lu\n", roles[r], s, counts[r][s]);
    fclose(out);
    return 0;
}

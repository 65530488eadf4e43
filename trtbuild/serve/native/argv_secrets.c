/* Preloaded into tritonserver (LD_PRELOAD) by trtbuild.serve.server, before its main() runs.
 *
 * 1. Secrets stay out of the command line: tritonserver reads its restricted-API header key only
 *    from argv, and /proc/<pid>/cmdline is readable by every local user. trtbuild passes the
 *    placeholder @@TRTBUILD_SECRETn@@ there and the value in the environment variable
 *    TRTBUILD_SECRETn (/proc/<pid>/environ is readable by the owner only); here each argv entry
 *    holding a placeholder is pointed at a copy with the value filled in. The kernel keeps showing
 *    the original argument area, with the placeholder.
 * 2. tritonserver dies with its supervisor: PR_SET_PDEATHSIG(SIGKILL); if the supervisor
 *    (TRTBUILD_PARENT_PID) is already gone, exit at once.
 * The variables and this library's LD_PRELOAD entry are removed from the environment, so the
 * python backend stubs tritonserver starts inherit neither. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static void fill_secrets(int argc, char **argv) {
    for (int n = 0; n < 4; n++) {
        char name[32], placeholder[40];
        snprintf(name, sizeof name, "TRTBUILD_SECRET%d", n);
        snprintf(placeholder, sizeof placeholder, "@@%s@@", name);
        const char *value = getenv(name);
        if (value == NULL) continue;
        size_t plen = strlen(placeholder), vlen = strlen(value);
        for (int i = 1; i < argc; i++) {
            char *at = strstr(argv[i], placeholder);
            if (at == NULL) continue;
            size_t head = (size_t)(at - argv[i]), len = strlen(argv[i]);
            char *out = malloc(len - plen + vlen + 1);
            if (out == NULL) _exit(70);
            memcpy(out, argv[i], head);
            memcpy(out + head, value, vlen);
            strcpy(out + head + vlen, at + plen);
            argv[i] = out;
        }
        unsetenv(name);
    }
}

static void die_with_parent(void) {
    const char *parent = getenv("TRTBUILD_PARENT_PID");
    if (parent == NULL) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)atol(parent)) _exit(71); /* the supervisor died before this line */
    unsetenv("TRTBUILD_PARENT_PID");
}

static void restore_preload(void) {
    const char *rest = getenv("TRTBUILD_LD_PRELOAD_REST"); /* what LD_PRELOAD held before trtbuild's */
    if (rest != NULL && rest[0] != '\0') setenv("LD_PRELOAD", rest, 1);
    else unsetenv("LD_PRELOAD");
    unsetenv("TRTBUILD_LD_PRELOAD_REST");
}

static void trtbuild_start(int argc, char **argv, char **envp) {
    (void)envp;
    fill_secrets(argc, argv);
    die_with_parent();
    restore_preload();
}

__attribute__((section(".init_array"), used)) static void (*trtbuild_init)(int, char **, char **) = trtbuild_start;

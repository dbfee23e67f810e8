/*
 * Fault scenarios for tests/test_faults.py: a small CUDA "application" against the fake libcuda
 * (tests/fake_cuda), printing key=value lines. Entry points come from dlsym on the dlopen'ed
 * libcuda, which the shim answers with its wrappers.
 *
 *   faults dl                  dlsym / dlvsym / dlerror probes (no CUDA needed)
 *   faults procs MARKER GATE   fork without exec, fork+exec, posix_spawn, and an orphan that
 *                              allocates once GATE exists (after the traced command ended) and
 *                              then creates MARKER
 *   faults child SIZE          cuInit, allocate SIZE bytes, free (used by procs)
 *   faults closefds SIZE       close every fd but a copy of stdout, chdir("/"), then cuInit,
 *                              allocate SIZE bytes, free
 *   faults loop                allocate/free 4 KiB until SIGINT, then print the count, exit 0
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

extern char **environ;

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
static init_fn p_init;
static alloc_fn p_alloc;
static free_fn p_free;

static void cuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("error=no libcuda\n");
        exit(3);
    }
    p_init = (init_fn)dlsym(h, "cuInit");
    p_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    p_free = (free_fn)dlsym(h, "cuMemFree_v2");
    if (p_init(0) != CUDA_SUCCESS)
        exit(4);
}

static int alloc_free(size_t size)
{
    CUdeviceptr p = 0;
    if (p_alloc(&p, size) != CUDA_SUCCESS)
        return 5;
    return p_free(p) == CUDA_SUCCESS ? 0 : 6;
}

static void show(const char *key, void *p)
{
    const char *e = dlerror();
    printf("%s=%d err=%s\n", key, p != NULL, e ? (strstr(e, "undefined symbol: ") ? strstr(e, "undefined symbol: ") : "other") : "none");
}

static int scenario_dl(void)
{
    dlerror();
    show("next_puts", dlsym(RTLD_NEXT, "puts"));
    printf("next_puts_same=%d\n", dlsym(RTLD_NEXT, "puts") == (void *)&puts);
    show("default_printf", dlsym(RTLD_DEFAULT, "printf"));
    show("next_missing", dlsym(RTLD_NEXT, "pyobmem_no_such_symbol"));
    show("default_missing", dlsym(RTLD_DEFAULT, "pyobmem_no_such_symbol"));
    show("dlvsym_next_dlsym", dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    show("dlvsym_default_missing", dlvsym(RTLD_DEFAULT, "pyobmem_no_such_symbol", "GLIBC_2.2.5"));
    show("default_cuinit", dlsym(RTLD_DEFAULT, "cuInit"));
    show("next_cuinit", dlsym(RTLD_NEXT, "cuGetProcAddress_v2"));
    void *libm = dlopen("libm.so.6", RTLD_NOW);
    show("libm_cos", dlsym(libm, "cos"));
    show("libm_missing", dlsym(libm, "pyobmem_no_such_symbol"));
    return 0;
}

static int run_child(const char *self, const char *size, int use_spawn)
{
    char *argv[] = {(char *)self, "child", (char *)size, NULL};
    pid_t pid;
    if (use_spawn) {
        if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0)
            return -1;
    } else {
        pid = fork();
        if (pid == 0) {
            execv(self, argv);
            _exit(127);
        }
    }
    int st;
    waitpid(pid, &st, 0);
    return st;
}

static int scenario_procs(const char *self, const char *marker, const char *gate)
{
    cuda();
    int rc = alloc_free(1000);
    fflush(stdout);
    pid_t pid = fork(); /* fork without exec */
    if (pid == 0)
        _exit(alloc_free(1001));
    int st;
    waitpid(pid, &st, 0);
    printf("fork_status=%d\n", st);
    printf("exec_status=%d\n", run_child(self, "1002", 0));
    printf("spawn_status=%d\n", run_child(self, "1003", 1));
    fflush(stdout);
    pid = fork();
    if (pid == 0) { /* the orphan: outlives the traced command, keeps none of its streams */
        setsid();
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0), dup2(null, 1), dup2(null, 2);
        struct stat sb;
        for (int i = 0; i < 3000 && stat(gate, &sb) != 0; i++)
            usleep(10000);
        int r = alloc_free(1004);
        int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dprintf(fd, "%d\n", r);
        close(fd);
        _exit(0);
    }
    printf("main_rc=%d\n", rc);
    return 0;
}

static volatile sig_atomic_t g_sigints;
static void on_int(int sig) { (void)sig; g_sigints++; }

static int scenario_loop(void)
{
    cuda();
    signal(SIGINT, on_int);
    printf("ready=1\n");
    fflush(stdout);
    long n = 0;
    while (!g_sigints) {
        alloc_free(4096);
        n++;
    }
    usleep(300000); /* a second SIGINT (the launcher forwarding it again) would land here */
    printf("loops=%ld\nsigints=%d\n", n, (int)g_sigints);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *s = argv[1];
    int rc = 2;
    if (!strcmp(s, "dl")) {
        rc = scenario_dl();
    } else if (!strcmp(s, "procs") && argc > 3) {
        rc = scenario_procs(argv[0], argv[2], argv[3]);
    } else if (!strcmp(s, "child") && argc > 2) {
        cuda();
        return alloc_free((size_t)atol(argv[2]));
    } else if (!strcmp(s, "closefds") && argc > 2) {
        fflush(stdout);
        int out = dup(1);
        for (int fd = 0; fd < 1024; fd++)
            if (fd != out)
                close(fd);
        if (chdir("/") != 0)
            return 7;
        cuda(); /* the shim starts now: no fd 0-2, another cwd */
        rc = alloc_free((size_t)atol(argv[2]));
        dprintf(out, "closefds_rc=%d\n", rc);
        return rc;
    } else if (!strcmp(s, "loop")) {
        rc = scenario_loop();
    }
    printf("done=1\n");
    return rc;
}

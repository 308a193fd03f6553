/* Records how the host driver answers cuGetProcAddress_v2 for every entry
 * point, CUDA version (2000..13100 in steps of 10) and flag (0 default,
 * 1 legacy stream, 2 per-thread default stream). Prints one line per change:
 *   base_name <TAB> flags <TAB> first_version <TAB> symbol (or -)
 * Input on stdin: the driver's exported cu* names, one per line.
 * Built and run on the GPU host only; its output is committed as
 * guest-lib/data/proc-address-table.tsv. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*get_proc_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*init_t)(unsigned);

static int is_suffix(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void base_name(const char *name, char *out) {
    strcpy(out, name);
    for (;;) {
        size_t n = strlen(out);
        if (is_suffix(out, "_ptds") || is_suffix(out, "_ptsz")) { out[n - 5] = 0; continue; }
        char *v = strrchr(out, '_');
        if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9') {
            char *p = v + 2;
            while (*p >= '0' && *p <= '9') p++;
            if (*p == 0) { *v = 0; continue; }
        }
        break;
    }
}

static int cmp(const void *a, const void *b) { return strcmp(*(char **)a, *(char **)b); }

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    init_t cu_init = (init_t)dlsym(lib, "cuInit");
    get_proc_t get_proc = (get_proc_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!cu_init || !get_proc || cu_init(0) != 0) { fprintf(stderr, "init failed\n"); return 1; }
    static char *bases[4096];
    int count = 0;
    char line[512], base[512];
    while (fgets(line, sizeof line, stdin) && count < 4096) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        base_name(line, base);
        int seen = 0;
        for (int i = 0; i < count; i++) if (!strcmp(bases[i], base)) { seen = 1; break; }
        if (!seen) bases[count++] = strdup(base);
    }
    qsort(bases, count, sizeof(char *), cmp);
    for (int i = 0; i < count; i++) {
        for (unsigned long long flags = 0; flags <= 2; flags++) {
            const char *last = NULL;
            for (int version = 2000; version <= 13100; version += 10) {
                void *fn = NULL;
                int status = 0;
                int rc = get_proc(bases[i], &fn, version, flags, &status);
                const char *sym = "-";
                Dl_info info;
                if (rc == 0 && fn && dladdr(fn, &info) && info.dli_sname) sym = info.dli_sname;
                else if (rc == 0 && fn) sym = "?";
                if (!last || strcmp(last, sym) != 0) {
                    printf("%s\t%llu\t%d\t%s\n", bases[i], flags, version, sym);
                    last = sym;
                }
            }
        }
    }
    return 0;
}

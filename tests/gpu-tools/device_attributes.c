/* Prints "attribute<TAB>value" for every device attribute 1..191 of GPU 0 as
 * the host driver reports it (errors print as "attribute<TAB>error N").
 * Built and run on the GPU host only. */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*init_t)(unsigned);
typedef int (*get_attr_t)(int *, int, int);

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 1;
    init_t cu_init = (init_t)dlsym(lib, "cuInit");
    get_attr_t get_attr = (get_attr_t)dlsym(lib, "cuDeviceGetAttribute");
    if (!cu_init || !get_attr || cu_init(0)) return 1;
    for (int a = 1; a < 192; a++) {
        int v = 0;
        int rc = get_attr(&v, a, 0);
        if (rc) printf("%d\terror %d\n", a, rc);
        else printf("%d\t%d\n", a, v);
    }
    return 0;
}

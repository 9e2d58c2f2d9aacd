/* Host cost of the CUDA driver calls a GPU completion marker makes (cuStreamIsCapturing, cuEventRecord on a
   timing-disabled event), next to a kernel-free baseline, in ns per call: decides which of them the recorder
   can afford per op.  cc -O2 scripts/diag_driver_calls.c -ldl -o /tmp/ddc && /tmp/ddc */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

typedef int (*f_init)(unsigned);
typedef int (*f_devget)(int *, int);
typedef int (*f_ctx)(void **, int);
typedef int (*f_setctx)(void *);
typedef int (*f_screate)(void **, unsigned);
typedef int (*f_ecreate)(void **, unsigned);
typedef int (*f_erecord)(void *, void *);
typedef int (*f_equery)(void *);
typedef int (*f_iscap)(void *, int *);
typedef int (*f_sync)(void *);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("no libcuda\n"); return 1; }
    f_init init = (f_init)dlsym(lib, "cuInit");
    f_devget devget = (f_devget)dlsym(lib, "cuDeviceGet");
    f_ctx retain = (f_ctx)dlsym(lib, "cuDevicePrimaryCtxRetain");
    f_setctx setctx = (f_setctx)dlsym(lib, "cuCtxSetCurrent");
    f_screate screate = (f_screate)dlsym(lib, "cuStreamCreate");
    f_ecreate ecreate = (f_ecreate)dlsym(lib, "cuEventCreate");
    f_erecord erecord = (f_erecord)dlsym(lib, "cuEventRecord");
    f_equery equery = (f_equery)dlsym(lib, "cuEventQuery");
    f_iscap iscap = (f_iscap)dlsym(lib, "cuStreamIsCapturing");
    f_sync ssync = (f_sync)dlsym(lib, "cuStreamSynchronize");
    int dev; void *ctx, *stream;
    init(0); devget(&dev, 0); retain(&ctx, dev); setctx(ctx);
    screate(&stream, 1);
    enum { N = 200000, POOL = 4096 };
    static void *ev[POOL];
    for (int i = 0; i < POOL; i++) ecreate(&ev[i], 2 /* CU_EVENT_DISABLE_TIMING */);
    for (int round = 0; round < 4; round++) {
        if (round == 2) { stream = 0; printf("the legacy default stream (torch's default):\n"); }
        double t0 = now();
        int st = 0;
        for (int i = 0; i < N; i++) iscap(stream, &st);
        double t1 = now();
        for (int i = 0; i < N; i++) erecord(ev[i % POOL], stream);
        double t2 = now();
        ssync(stream);
        for (int i = 0; i < N; i++) equery(ev[i % POOL]);
        double t3 = now();
        printf("round %d: cuStreamIsCapturing %.0f ns  cuEventRecord %.0f ns  cuEventQuery (done) %.0f ns\n", round,
               (t1 - t0) / N * 1e9, (t2 - t1) / N * 1e9, (t3 - t2) / N * 1e9);
    }
    return 0;
}

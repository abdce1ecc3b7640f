/* One process's ceiling for waited launches: T threads in one CUDA context, each on its own
 * stream, each launching the sharing benchmark's kernel (bench/catalog/fma.cu, 8 blocks of
 * 128) and synchronizing after every launch, no checks. What accy's waited clients are held
 * against (issue: sharing under contention).
 *
 *   nvcc -cubin -arch=sm_90 -o fma.cubin bench/catalog/fma.cu
 *   cc -O2 -pthread -o ceiling bench/ceiling.c -ldl
 *   ./ceiling fma.cubin TARGET_US SECONDS THREADS...   (prints one JSON line per count)
 *
 * The kernel's length is calibrated to TARGET_US with CUDA events. libcuda.so.1 is loaded at
 * run time, its few prototypes declared here, so no CUDA header is needed. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
static CUresult (*cuEventCreate)(CUevent *, unsigned);
static CUresult (*cuEventRecord)(CUevent, CUstream);
static CUresult (*cuEventSynchronize)(CUevent);
static CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);

#define CHECK(call)                                                        \
    do {                                                                   \
        CUresult r_ = (call);                                              \
        if (r_) {                                                          \
            fprintf(stderr, "%s failed: %d (line %d)\n", #call, r_, __LINE__); \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static CUcontext ctx;
static CUfunction fn;
static CUdeviceptr x, y;
static unsigned iters;
static double seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void launch(CUstream s) {
    void *args[] = {&y, &x, &iters};
    CHECK(cuLaunchKernel(fn, 8, 1, 1, 128, 1, 1, 0, s, args, NULL));
}

static double kernel_us(CUstream s, unsigned n) {
    CUevent a, b;
    float ms;
    iters = n;
    CHECK(cuEventCreate(&a, 0));
    CHECK(cuEventCreate(&b, 0));
    launch(s);
    CHECK(cuEventRecord(a, s));
    for (int i = 0; i < 100; i++) launch(s);
    CHECK(cuEventRecord(b, s));
    CHECK(cuEventSynchronize(b));
    CHECK(cuEventElapsedTime(&ms, a, b));
    return ms * 1000.0 / 100.0;
}

static void *worker(void *arg) {
    long *count = arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 1 /* non-blocking */));
    double end = now() + seconds;
    long n = 0;
    while (now() < end) {
        launch(s);
        CHECK(cuStreamSynchronize(s));
        n++;
    }
    *count = n;
    return NULL;
}

/* The _v2 entry points first: the plain names of some are the old 32-bit ABI. */
#define LOAD(name)                                                            \
    do {                                                                      \
        *(void **)&name = dlsym(lib, #name "_v2");                            \
        if (!name) *(void **)&name = dlsym(lib, #name);                       \
        if (!name) { fprintf(stderr, "libcuda has no %s\n", #name); return 1; } \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s fma.cubin TARGET_US SECONDS THREADS...\n", argv[0]);
        return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
    LOAD(cuInit); LOAD(cuDeviceGet); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuCtxSetCurrent);
    LOAD(cuModuleLoadData); LOAD(cuModuleGetFunction); LOAD(cuMemAlloc); LOAD(cuStreamCreate);
    LOAD(cuStreamSynchronize); LOAD(cuLaunchKernel); LOAD(cuEventCreate); LOAD(cuEventRecord);
    LOAD(cuEventSynchronize); LOAD(cuEventElapsedTime);
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *image = malloc(size);
    if (!image || fread(image, 1, size, f) != (size_t)size) { fprintf(stderr, "read failed\n"); return 1; }
    fclose(f);
    int dev;
    CUmodule mod;
    CUstream s;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&fn, mod, "accy_bench_fma"));
    CHECK(cuMemAlloc(&x, 4096));
    CHECK(cuMemAlloc(&y, 4096));
    CHECK(cuStreamCreate(&s, 1));
    double target = atof(argv[2]);
    seconds = atof(argv[3]);
    unsigned lo = 1, hi = 1 << 20; /* the fewest iterations whose kernel runs target us */
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (kernel_us(s, mid) < target) lo = mid + 1; else hi = mid;
    }
    double us = kernel_us(s, lo);
    iters = lo;
    for (int a = 4; a < argc; a++) {
        int threads = atoi(argv[a]);
        if (threads < 1 || threads > 256) { fprintf(stderr, "threads 1..256\n"); return 2; }
        pthread_t tid[256];
        long counts[256] = {0};
        for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, &counts[t]);
        long total = 0;
        for (int t = 0; t < threads; t++) { pthread_join(tid[t], NULL); total += counts[t]; }
        printf("{\"threads\": %d, \"kernel_us\": %.2f, \"iters\": %u, \"kernels_per_s\": %.0f}\n",
               threads, us, iters, total / seconds);
        fflush(stdout);
    }
    return 0;
}

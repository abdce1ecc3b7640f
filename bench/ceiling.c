/* One process's ceiling for waited launches: T threads in one CUDA context, each on its own
 * stream, each launching the sharing benchmark's kernel (bench/catalog/fma.cu, 8 blocks of
 * 128) and synchronizing after every launch, no checks. What accy's waited clients are held
 * against (issue: sharing under contention).
 *
 *   nvcc -cubin -arch=sm_90 -o fma.cubin bench/catalog/fma.cu
 *   cc -O2 -pthread -o ceiling bench/ceiling.c -ldl
 *   ./ceiling fma.cubin TARGET_US SECONDS THREADS...   (prints one JSON line per count)
 *
 * The kernel's length is calibrated to TARGET_US with CUDA events (libcuda.so.1 loaded at run
 * time: bench/fma_kernel.h). */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "fma_kernel.h"

static CUresult (*cuEventSynchronize)(CUevent);
static CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);

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

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s fma.cubin TARGET_US SECONDS THREADS...\n", argv[0]);
        return 2;
    }
    if (open_fma(argv[1])) return 1;
    LOAD(cuEventSynchronize);
    LOAD(cuEventElapsedTime);
    CUstream s;
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

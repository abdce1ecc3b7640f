/* What one launch costs the thread that makes it, when several threads of one process launch
 * at once: T threads, each on its own stream, each launching the sharing benchmark's kernel
 * (bench/catalog/fma.cu, 8 blocks of 128, 1 iteration) and waiting for it the way accy's
 * native engine does, timing every driver call. Modes:
 *
 *   kernel  cuLaunchKernel, then cuEventRecord and cuEventQuery until ready
 *   graph   cuGraphLaunch of the same kernel captured once per thread (as accy's tickets
 *           are), then cuEventRecord and cuEventQuery until ready
 *   write   cuLaunchKernel, then cuStreamWriteValue32 of a sequence number into mapped
 *           host memory, read until it arrives (no event, no query call)
 *
 *   cc -O2 -pthread -o launch_cost bench/launch_cost.c -ldl
 *   ./launch_cost fma.cubin SECONDS MODE THREADS...   (one JSON line per count)
 *
 * libcuda.so.1 is loaded at run time (bench/fma_kernel.h). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "fma_kernel.h"

typedef void *CUgraph, *CUgraphExec;
static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
static CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
static CUresult (*cuStreamBeginCapture)(CUstream, int);
static CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
static CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
static CUresult (*cuStreamWriteValue32)(CUstream, CUdeviceptr, unsigned, unsigned);
static CUresult (*cuEventQuery)(CUevent);

#define NOT_READY 600

static unsigned iters = 1;
static double seconds;
static const char *mode;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

typedef struct {
    long launches, queries;
    uint64_t launch_ns, mark_ns, query_ns, ready_ns;
} tally_t;

static void launch(CUstream s) {
    void *args[] = {&y, &x, &iters};
    CHECK(cuLaunchKernel(fn, 8, 1, 1, 128, 1, 1, 0, s, args, NULL));
}

static void *worker(void *arg) {
    tally_t *t = arg;
    CUstream s;
    CUevent ev;
    CUgraphExec exec = NULL;
    volatile uint32_t *word = NULL;
    CUdeviceptr word_dev = 0;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 1 /* non-blocking */));
    CHECK(cuEventCreate(&ev, 2 /* disable timing */));
    int graph = strcmp(mode, "graph") == 0, write = strcmp(mode, "write") == 0;
    if (graph) {
        CUgraph g;
        CHECK(cuStreamBeginCapture(s, 2 /* thread local */));
        launch(s);
        CHECK(cuStreamEndCapture(s, &g));
        CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    if (write) {
        void *host;
        CHECK(cuMemHostAlloc(&host, 64, 0x02 /* DEVICEMAP */ | 0x01 /* PORTABLE */));
        CHECK(cuMemHostGetDevicePointer(&word_dev, host, 0));
        word = host;
        *word = 0;
    }
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    uint32_t seq = 0;
    while (now_ns() < end) {
        uint64_t a = now_ns();
        if (graph) CHECK(cuGraphLaunch(exec, s));
        else launch(s);
        uint64_t b = now_ns();
        t->launch_ns += b - a;
        if (write) {
            CHECK(cuStreamWriteValue32(s, word_dev, ++seq, 0));
            t->mark_ns += now_ns() - b;
            while (*word != seq) {}
        } else {
            CHECK(cuEventRecord(ev, s));
            t->mark_ns += now_ns() - b;
            for (;;) {
                uint64_t q = now_ns();
                CUresult r = cuEventQuery(ev);
                uint64_t d = now_ns() - q;
                if (r == NOT_READY) {
                    t->query_ns += d;
                    t->queries++;
                    continue;
                }
                CHECK(r);
                t->ready_ns += d;
                break;
            }
        }
        t->launches++;
    }
    CHECK(cuStreamSynchronize(s));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s fma.cubin SECONDS kernel|graph|write THREADS...\n", argv[0]);
        return 2;
    }
    if (open_fma(argv[1])) return 1;
    LOAD(cuMemHostAlloc); LOAD(cuMemHostGetDevicePointer); LOAD(cuStreamBeginCapture);
    LOAD(cuStreamEndCapture); LOAD(cuGraphInstantiateWithFlags); LOAD(cuGraphLaunch);
    LOAD(cuStreamWriteValue32); LOAD(cuEventQuery);
    seconds = atof(argv[2]);
    mode = argv[3];
    for (int a = 4; a < argc; a++) {
        int threads = atoi(argv[a]);
        if (threads < 1 || threads > 64) { fprintf(stderr, "threads 1..64\n"); return 2; }
        pthread_t tid[64];
        tally_t tallies[64];
        memset(tallies, 0, sizeof tallies);
        for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, &tallies[t]);
        tally_t all = {0};
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            all.launches += tallies[t].launches;
            all.queries += tallies[t].queries;
            all.launch_ns += tallies[t].launch_ns;
            all.mark_ns += tallies[t].mark_ns;
            all.query_ns += tallies[t].query_ns;
            all.ready_ns += tallies[t].ready_ns;
        }
        double n = all.launches ? (double)all.launches : 1.0;
        printf("{\"mode\": \"%s\", \"threads\": %d, \"kernels_per_s\": %.0f, \"launch_us\": %.2f, "
               "\"mark_us\": %.2f, \"queries_per_launch\": %.2f, \"query_us\": %.2f, "
               "\"ready_us\": %.2f}\n",
               mode, threads, all.launches / seconds, all.launch_ns / n / 1e3, all.mark_ns / n / 1e3,
               all.queries / n, all.queries ? all.query_ns / (double)all.queries / 1e3 : 0.0,
               all.ready_ns / n / 1e3);
        fflush(stdout);
    }
    return 0;
}

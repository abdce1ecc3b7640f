/* The moonshot's device-side candidate, measured (issue: sharing under contention). No CPU
 * of the daemon's is on a waited launch's path:
 *
 * - Client processes, forked before CUDA starts and with no CUDA of their own, each publish a
 *   ticket (a count) in pinned host memory that the GPU maps, then spin (yielding) on their
 *   own done word.
 * - One block of a scheduler kernel polls every client's ticket word over PCIe. For each new
 *   ticket it launches that client's prepared graph from the device (device graph launch):
 *   the sharing benchmark's fma kernel (catalog/fma.cu, 8 blocks of 128), then a one-thread
 *   kernel that counts the client's done word up.
 * - A graph may make at most 120 fire-and-forget launches in one execution, so a scheduler
 *   ends after PER_RUN launches and another takes over. MODE says how:
 *   - "forget": the scheduler is a device graph that tail-launches itself. A tail launch waits
 *     until every child of the ending run is over, so each turn waits for the longest kernel
 *     then running (SCHED_SLOW_US below shows what that costs the others).
 *   - "host": SCHED_STREAMS instances of the scheduler (default 4), each on its own stream,
 *     poll at once and claim each ticket with a compare-and-swap; the host relaunches an
 *     instance whose stream is done. An instance waiting for a long child holds only itself.
 *   - "sibling": children launched beside the scheduler, not in its environment (they count
 *     against the stream's own 120, so it stops there: kept to show that).
 * - A client launches only its own graphs (the scheduler indexes the client's own table), and
 *   each client has INSTANCES instances of its graph: the device refuses to launch a device
 *   graph while an earlier launch of it still runs.
 * - SCHED_SLOW_US (environment): client 0's kernel runs that long instead (a tenant with long
 *   kernels beside short ones); its latencies are left out of p50 and p99.
 * - A client that sees no progress for 2 s gives up, and the count reports it failed.
 * - SCHED_CLIENT=python (environment): each client is bench/_sched_client.py in a Python
 *   process of its own instead (accy's clients are Python), given the shared memory's
 *   descriptor and the offsets it needs.
 *
 *   nvcc -O2 -arch=sm_90 -rdc=true -o device_sched bench/device_sched.cu -lcudadevrt
 *   ./device_sched TARGET_US SECONDS forget|host|sibling PER_RUN CLIENTS...
 *
 * One JSON line per client count.
 */
#include <cuda_runtime.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "catalog/fma.cu"

#define MAX_CLIENTS 64
#define INSTANCES 4
#define BUCKETS 20000 /* 1 us each */

#define CHECK(call)                                                                  \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* Host memory shared by the processes; the first part is also mapped into the GPU. */
struct Mapped {
    unsigned ticket[MAX_CLIENTS];            /* client i's launches asked for */
    unsigned stop;                           /* the host asks the scheduler to end */
    unsigned pad[31];
    struct { unsigned value; unsigned pad[31]; } done[MAX_CLIENTS]; /* written by the GPU */
};
struct Shared {
    Mapped mapped;
    volatile int go;                         /* clients start */
    volatile int gave_up;                    /* clients that saw no progress for 2 s */
    long counts[MAX_CLIENTS];                /* launches each client timed */
    unsigned hist[MAX_CLIENTS][BUCKETS];     /* each client's waited-launch latencies */
};

__device__ unsigned long long launched_total;
__device__ unsigned long long launch_errors;
__device__ unsigned long long runs;
__device__ unsigned taken[MAX_CLIENTS];      /* tickets launched, per client */
__device__ unsigned finished[MAX_CLIENTS];   /* launches finished, per client */

/* The last node of a client's graph: its fma kernel is over, so count it done and tell the
 * client through the mapped word. */
__global__ void mark_done(int client, volatile unsigned *done) {
    unsigned v = ++finished[client];
    __threadfence_system();
    *done = v;
    __threadfence_system();
}

enum { FORGET, HOST, SIBLING };

/* Launch client i's graph for its ticket number k (an instance free by then); 1 if it went. */
__device__ int launch_for(const cudaGraphExec_t *execs, int i, unsigned k, int mode) {
    cudaGraphExec_t g = execs[i * INSTANCES + k % INSTANCES];
    cudaError_t err = cudaGraphLaunch(
        g, mode == SIBLING ? cudaStreamGraphFireAndForgetAsSibling : cudaStreamGraphFireAndForget);
    if (err == cudaSuccess) {
        atomicAdd(&launched_total, 1ull);
        return 1;
    }
    atomicAdd(&launch_errors, 1ull);
    return 0;
}

/* Thread i serves client i. In FORGET and SIBLING one scheduler runs at a time and keeps
 * ``taken`` in a register; in HOST several run at once and claim each ticket in ``taken``. */
__global__ void scheduler(const volatile unsigned *ticket, const cudaGraphExec_t *execs,
                          int nclients, const volatile unsigned *stop, int per_run, int mode) {
    __shared__ int used, quit;
    int i = threadIdx.x;
    if (i == 0) { used = 0; quit = 0; atomicAdd(&runs, 1ull); }
    __syncthreads();
    volatile unsigned *claimed = taken;
    unsigned mine = i < nclients ? claimed[i] : 0;
    for (unsigned round = 0;; round++) {
        if (i < nclients) {
            if (mode == HOST) mine = claimed[i];
            if (ticket[i] != mine && atomicAdd(&used, 1) < per_run) {
                if (mode != HOST) {
                    if (launch_for(execs, i, mine, mode)) mine++;
                } else if (atomicCAS(&taken[i], mine, mine + 1) == mine) {
                    while (!launch_for(execs, i, mine, mode) && !*stop) {}
                } else {
                    atomicSub(&used, 1); /* another instance took it */
                }
            }
        }
        __syncthreads();
        if (i == 0 && (used >= per_run || ((round & 255) == 0 && *stop))) quit = 1;
        __syncthreads();
        if (quit) break;
    }
    if (mode != HOST && i < nclients) taken[i] = mine;
    if (mode != HOST && i == 0 && !*stop)
        cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The GPU's process sets ``go`` once it is ready; seconds a client waits for that. */
#define GO_WAIT 20.0

static void client(Shared *sh, int i, double warm, double seconds) {
    double asked = now();
    while (!sh->go) {
        sched_yield();
        if (now() - asked > GO_WAIT) { __atomic_add_fetch(&sh->gave_up, 1, __ATOMIC_RELAXED); return; }
    }
    volatile unsigned *done = &sh->mapped.done[i].value;
    unsigned seq = __atomic_load_n(&sh->mapped.ticket[i], __ATOMIC_ACQUIRE);
    double start = now(), timed_from = start + warm, end = timed_from + seconds;
    long count = 0;
    for (;;) {
        double t0 = now();
        if (t0 >= end) break;
        seq++;
        __atomic_store_n(&sh->mapped.ticket[i], seq, __ATOMIC_RELEASE);
        double t1;
        while (*done < seq) {
            sched_yield();
            if (now() - t0 > 2.0) { __atomic_add_fetch(&sh->gave_up, 1, __ATOMIC_RELAXED); goto out; }
        }
        t1 = now();
        if (t0 >= timed_from) {
            long us = (long)((t1 - t0) * 1e6);
            sh->hist[i][us < BUCKETS ? us : BUCKETS - 1]++;
            count++;
        }
    }
out:
    sh->counts[i] = count;
}

/* Over clients ``first`` to n-1. */
/* This process becomes a Python client (bench/_sched_client.py beside this source, found
 * through SCHED_CLIENT_SCRIPT), told where its words are in the shared memory ``fd``. */
static void exec_python_client(int fd, int i, double warm, double seconds) {
    const char *script = getenv("SCHED_CLIENT_SCRIPT") ? getenv("SCHED_CLIENT_SCRIPT")
                                                       : "bench/_sched_client.py";
    const char *python = getenv("SCHED_PYTHON") ? getenv("SCHED_PYTHON") : "python3";
    char args[13][32];
    snprintf(args[0], 32, "%d", fd);
    snprintf(args[1], 32, "%d", i);
    snprintf(args[2], 32, "%g", warm);
    snprintf(args[3], 32, "%g", seconds);
    snprintf(args[4], 32, "%zu", offsetof(Shared, mapped.ticket));
    snprintf(args[5], 32, "%zu", offsetof(Shared, mapped.done));
    snprintf(args[6], 32, "%zu", sizeof(((Mapped *)0)->done[0]));
    snprintf(args[7], 32, "%zu", offsetof(Shared, go));
    snprintf(args[8], 32, "%zu", offsetof(Shared, gave_up));
    snprintf(args[9], 32, "%zu", offsetof(Shared, counts));
    snprintf(args[10], 32, "%zu", offsetof(Shared, hist));
    snprintf(args[11], 32, "%d", BUCKETS);
    snprintf(args[12], 32, "%g", GO_WAIT);
    execlp(python, python, script, args[0], args[1], args[2], args[3], args[4], args[5], args[6],
           args[7], args[8], args[9], args[10], args[11], args[12], (char *)NULL);
    perror("exec python client");
    _exit(1);
}

static double percentile(const Shared *sh, int first, int n, double q) {
    unsigned long long total = 0, seen = 0;
    for (int c = first; c < n; c++) total += sh->counts[c];
    for (int b = 0; b < BUCKETS; b++) {
        for (int c = first; c < n; c++) seen += sh->hist[c][b];
        if (seen >= q * total) return b + 0.5;
    }
    return BUCKETS;
}

static double kernel_us(cudaStream_t s, float *y, const float *x, unsigned iters) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    accy_bench_fma<<<8, 128, 0, s>>>(y, x, iters);
    CHECK(cudaEventRecord(a, s));
    for (int k = 0; k < 100; k++) accy_bench_fma<<<8, 128, 0, s>>>(y, x, iters);
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 10.0; /* ms * 1000 / 100 launches */
}

/* The fewest iterations whose kernel runs ``target`` us (as bench/ceiling.c calibrates). */
static unsigned calibrate(cudaStream_t s, float *y, const float *x, double target, double *us) {
    unsigned lo = 1, hi = 1 << 20;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (kernel_us(s, y, x, mid) < target) lo = mid + 1; else hi = mid;
    }
    *us = kernel_us(s, y, x, lo);
    return lo;
}

/* The GPU's side of one count, in a process of its own: prepare every client's graphs and
 * the scheduler, run it while the clients do, print the first half of the JSON line. */
static void run_gpu(Shared *sh, int n, double target, double slow_us, double seconds, int mode,
                    const char *mode_name, int per_run, int nstreams) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaHostRegister(&sh->mapped, sizeof(Mapped), cudaHostRegisterMapped));
    Mapped *dev;
    CHECK(cudaHostGetDevicePointer((void **)&dev, &sh->mapped, 0));
    cudaStream_t s, streams[16];
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int k = 0; k < nstreams; k++)
        CHECK(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking));
    float *x, *y;
    CHECK(cudaMalloc(&x, 4096));
    CHECK(cudaMalloc(&y, 4096 * MAX_CLIENTS));
    CHECK(cudaMemset(x, 0, 4096));
    double us, slow = 0;
    unsigned iters = calibrate(s, y, x, target, &us);
    unsigned slow_iters = slow_us > 0 ? calibrate(s, y, x, slow_us, &slow) : iters;
    static cudaGraphExec_t host_execs[MAX_CLIENTS * INSTANCES];
    for (int c = 0; c < n; c++)
        for (int k = 0; k < INSTANCES; k++) {
            cudaGraph_t g;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            accy_bench_fma<<<8, 128, 0, s>>>(y + 1024 * c, x, c == 0 ? slow_iters : iters);
            mark_done<<<1, 1, 0, s>>>(c, &dev->done[c].value);
            CHECK(cudaStreamEndCapture(s, &g));
            CHECK(cudaGraphInstantiate(&host_execs[c * INSTANCES + k], g,
                                       cudaGraphInstantiateFlagDeviceLaunch));
            CHECK(cudaGraphUpload(host_execs[c * INSTANCES + k], s));
            CHECK(cudaGraphDestroy(g));
        }
    cudaGraphExec_t *execs;
    CHECK(cudaMalloc(&execs, sizeof(host_execs)));
    CHECK(cudaMemcpy(execs, host_execs, sizeof(host_execs), cudaMemcpyHostToDevice));
    cudaGraph_t sg;
    cudaGraphExec_t sched[16];
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    scheduler<<<1, 64, 0, s>>>(dev->ticket, execs, n, &dev->stop, per_run, mode);
    CHECK(cudaStreamEndCapture(s, &sg));
    for (int k = 0; k < nstreams; k++) {
        CHECK(cudaGraphInstantiate(&sched[k], sg, mode == HOST ? 0 : cudaGraphInstantiateFlagDeviceLaunch));
        CHECK(cudaGraphUpload(sched[k], streams[k]));
    }
    CHECK(cudaDeviceSynchronize());
    for (int k = 0; k < nstreams; k++) CHECK(cudaGraphLaunch(sched[k], streams[k]));
    sh->go = 1;
    double t0 = now();
    long relaunches = 0;
    while (now() - t0 < seconds + 0.5) {
        if (mode != HOST) { usleep(10000); continue; }
        for (int k = 0; k < nstreams; k++) /* an instance done: another turn for it */
            if (cudaStreamQuery(streams[k]) == cudaSuccess) {
                CHECK(cudaGraphLaunch(sched[k], streams[k]));
                relaunches++;
            }
        sched_yield();
    }
    __atomic_store_n(&sh->mapped.stop, 1u, __ATOMIC_RELEASE);
    CHECK(cudaDeviceSynchronize());
    unsigned long long total, errors, nruns;
    CHECK(cudaMemcpyFromSymbol(&total, launched_total, sizeof total));
    CHECK(cudaMemcpyFromSymbol(&errors, launch_errors, sizeof errors));
    CHECK(cudaMemcpyFromSymbol(&nruns, runs, sizeof nruns));
    printf("{\"kind\": \"device_sched\", \"mode\": \"%s\", \"per_run\": %d, \"streams\": %d, "
           "\"clients\": %d, \"kernel_us\": %.2f, \"slow_kernel_us\": %.2f, \"launched\": %llu, "
           "\"launch_errors\": %llu, \"scheduler_runs\": %llu, \"host_relaunches\": %ld, ",
           mode_name, per_run, nstreams, n, us, slow, total, errors, nruns, relaunches);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s TARGET_US SECONDS forget|host|sibling PER_RUN CLIENTS...\n",
                argv[0]);
        return 2;
    }
    double target = atof(argv[1]), seconds = atof(argv[2]);
    const char *mode_name = argv[3];
    int mode = strcmp(mode_name, "host") == 0      ? HOST
               : strcmp(mode_name, "sibling") == 0 ? SIBLING
                                                   : FORGET;
    int per_run = atoi(argv[4]);
    if (per_run < 1 || per_run > 120) { fprintf(stderr, "PER_RUN 1..120\n"); return 2; }
    double slow_us = getenv("SCHED_SLOW_US") ? atof(getenv("SCHED_SLOW_US")) : 0.0;
    int python_clients = getenv("SCHED_CLIENT") && strcmp(getenv("SCHED_CLIENT"), "python") == 0;
    int nstreams = mode == HOST && getenv("SCHED_STREAMS") ? atoi(getenv("SCHED_STREAMS")) : 1;
    if (nstreams < 1 || nstreams > 16) { fprintf(stderr, "SCHED_STREAMS 1..16\n"); return 2; }
    int any_failed = 0;
    for (int a = 5; a < argc; a++) {
        int n = atoi(argv[a]);
        if (n < 1 || n > MAX_CLIENTS) { fprintf(stderr, "clients 1..%d\n", MAX_CLIENTS); return 2; }
        int fd = memfd_create("device-sched", 0); /* a Python client maps it by number */
        if (fd < 0 || ftruncate(fd, sizeof(Shared)) != 0) { perror("memfd"); return 1; }
        Shared *sh = (Shared *)mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (sh == MAP_FAILED) { perror("mmap"); return 1; }
        memset(sh, 0, sizeof(Shared));
        pid_t pids[MAX_CLIENTS];
        for (int c = 0; c < n; c++) { /* before this process touches CUDA */
            pids[c] = fork();
            if (pids[c] == 0) {
                if (python_clients) exec_python_client(fd, c, 0.2, seconds);
                client(sh, c, 0.2, seconds);
                _exit(0);
            }
        }
        close(fd);
        /* A child of a CUDA process may not use CUDA, so each count forks first and does
         * its CUDA in a child of its own. */
        pid_t gpu = fork();
        if (gpu == 0) run_gpu(sh, n, target, slow_us, seconds, mode, mode_name, per_run, nstreams);
        int status;
        for (int c = 0; c < n; c++) waitpid(pids[c], &status, 0);
        waitpid(gpu, &status, 0);
        int first = slow_us > 0 && n > 1 ? 1 : 0;
        long sum = 0, least = -1;
        for (int c = first; c < n; c++) {
            sum += sh->counts[c];
            if (least < 0 || sh->counts[c] < least) least = sh->counts[c];
        }
        int failed = status != 0 || sh->gave_up;
        any_failed |= failed;
        printf("\"kernels_per_s\": %.0f, \"slow_client_per_s\": %.0f, \"slowest_over_mean\": %.3f, "
               "\"p50_us\": %.1f, \"p99_us\": %.1f, \"gave_up\": %d, \"failed\": %s}\n",
               sum / seconds, first ? sh->counts[0] / seconds : 0.0,
               sum ? (double)least * (n - first) / sum : 0.0, percentile(sh, first, n, 0.5),
               percentile(sh, first, n, 0.99), sh->gave_up, failed ? "true" : "false");
        fflush(stdout);
        munmap(sh, sizeof(Shared));
    }
    return any_failed;
}

/* The part bench/ceiling.c and bench/launch_cost.c share: libcuda.so.1 loaded at run time
 * (the few prototypes declared here, so no CUDA header is needed), the primary context made
 * current, and the sharing benchmark's kernel (bench/catalog/fma.cu, compiled to a cubin)
 * loaded with two 4 KiB buffers for it. Each program LOADs what else it calls from ``lib``. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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

#define CHECK(call)                                                            \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_) {                                                              \
            fprintf(stderr, "%s failed: %d (line %d)\n", #call, r_, __LINE__); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* The _v2 entry points first: the plain names of some are the old 32-bit ABI. */
#define LOAD(name)                                                              \
    do {                                                                        \
        *(void **)&name = dlsym(lib, #name "_v2");                              \
        if (!name) *(void **)&name = dlsym(lib, #name);                         \
        if (!name) { fprintf(stderr, "libcuda has no %s\n", #name); return 1; } \
    } while (0)

static void *lib;
static CUcontext ctx;
static CUfunction fn;
static CUdeviceptr x, y;

/* libcuda loaded into ``lib``, the context current, ``fn``, ``x`` and ``y`` made; 0 or 1. */
static int open_fma(const char *cubin) {
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
    LOAD(cuInit); LOAD(cuDeviceGet); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuCtxSetCurrent);
    LOAD(cuModuleLoadData); LOAD(cuModuleGetFunction); LOAD(cuMemAlloc); LOAD(cuStreamCreate);
    LOAD(cuStreamSynchronize); LOAD(cuLaunchKernel); LOAD(cuEventCreate); LOAD(cuEventRecord);
    FILE *f = fopen(cubin, "rb");
    if (!f) { perror(cubin); return 1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *image = malloc(size);
    if (!image || fread(image, 1, size, f) != (size_t)size) { fprintf(stderr, "read failed\n"); return 1; }
    fclose(f);
    int dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&fn, mod, "accy_bench_fma"));
    CHECK(cuMemAlloc(&x, 4096));
    CHECK(cuMemAlloc(&y, 4096));
    free(image);
    return 0;
}

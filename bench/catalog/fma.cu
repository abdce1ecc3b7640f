// The sharing benchmark's kernel (bench/bench_sharing.py): y[i] = x[i] after `iters`
// dependent FMAs, v = v * 0.999 + 0.001, for i < 1024; grid 8, block 128.
//
// Each thread's FMAs form one dependent chain, so the kernel's time grows with
// `iters` at the FMA latency and hardly with anything else: the benchmark picks
// `iters` for the kernel duration it wants. The in-process baselines load this
// same file, so every series runs the identical kernel. Built with NVRTC; no headers.

extern "C" __global__ void __launch_bounds__(128)
accy_bench_fma(float* y, const float* x, unsigned int iters) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 1024u) return;
    float v = x[i];
    for (unsigned int k = 0; k < iters; ++k) {
        v = fmaf(v, 0.999f, 0.001f);
    }
    y[i] = v;
}

// The noisy neighbour's kernel (bench/contention.py): the same chain in every thread of a
// grid that fills every SM of the GPU several times over; blocks past the first 8 compute
// and drop their values, so y is what accy_bench_fma writes.
extern "C" __global__ void __launch_bounds__(128)
accy_bench_fill(float* y, const float* x, unsigned int iters) {
    const unsigned int i = (blockIdx.x * blockDim.x + threadIdx.x) & 1023u;
    float v = x[i];
    for (unsigned int k = 0; k < iters; ++k) {
        v = fmaf(v, 0.999f, 0.001f);
    }
    if (blockIdx.x < 8u || v == 12345.0f) y[i] = v;
}

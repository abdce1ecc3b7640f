// out[0] = sum(partials[0:m]) in one block of 1024 threads (the second stage of
// accy.kernel.reduce_sum, after accy_scan_tile_sum). m up to 262144.
//
// Each thread keeps four float4 loads in flight per step (16 elements, striped so each
// warp instruction touches 512 contiguous bytes), accumulates in fp32, then the block
// reduces with warp shuffles. Built with NVRTC; no headers.

namespace {

__device__ __forceinline__ float accy_warp_sum(float v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024)
accy_reduce_final_sum(float* out, const float* __restrict__ partials, unsigned int m) {
    constexpr unsigned THREADS = 1024;
    constexpr int K = 4;
    constexpr unsigned long long STEP = static_cast<unsigned long long>(K) * THREADS * 4ull;
    const unsigned t = threadIdx.x;
    const unsigned long long count = m;
    const bool vec_ok = (reinterpret_cast<unsigned long long>(partials) & 15ull) == 0ull;
    float acc[K] = {0.0f, 0.0f, 0.0f, 0.0f};
    unsigned long long base = 0;
    if (vec_ok) {
        const float4* p = reinterpret_cast<const float4*>(partials);
        for (; base + STEP <= count; base += STEP) {
            float4 v[K];
#pragma unroll
            for (int k = 0; k < K; ++k) v[k] = p[(base >> 2) + k * THREADS + t];
#pragma unroll
            for (int k = 0; k < K; ++k) acc[k] += (v[k].x + v[k].y) + (v[k].z + v[k].w);
        }
    }
    for (unsigned long long i = base + t; i < count; i += THREADS) acc[0] += partials[i];
    float total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    total = accy_warp_sum(total);
    __shared__ float warp_totals[THREADS / 32];
    if ((t & 31u) == 0) warp_totals[t >> 5] = total;
    __syncthreads();
    if (t < 32) {
        float w = warp_totals[t];
        w = accy_warp_sum(w);
        if (t == 0) out[0] = w;
    }
}

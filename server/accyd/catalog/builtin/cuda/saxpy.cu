// out[i] = a * x[i] + y[i] for i < n; grid ceil_div(n, 4096), block 256.
//
// Each block owns 4096 elements as 1024 float4 vectors, thread t vectors k*256 + t
// (k = 0..3); all eight loads are issued before the four stores. out may alias x or y:
// every element is read and then written by the same thread, and no thread reads an
// element another writes. The last, partial block uses guarded scalar accesses.
// Built with NVRTC; no headers.

extern "C" __global__ void __launch_bounds__(256)
accy_saxpy(float* out, const float* x, const float* y, unsigned int n, float a) {
    constexpr unsigned THREADS = 256;
    constexpr unsigned long long TILE = 4096ull;
    constexpr int K = 4;
    const unsigned t = threadIdx.x;
    const unsigned long long base = static_cast<unsigned long long>(blockIdx.x) * TILE;
    if (base >= n) return;
    const unsigned long long limit = static_cast<unsigned long long>(n) - base;
    const bool vec_ok = ((reinterpret_cast<unsigned long long>(out) |
                          reinterpret_cast<unsigned long long>(x) |
                          reinterpret_cast<unsigned long long>(y)) & 15ull) == 0ull;
    if (vec_ok && limit >= TILE) {
        const float4* xv = reinterpret_cast<const float4*>(x + base);
        const float4* yv = reinterpret_cast<const float4*>(y + base);
        float4* ov = reinterpret_cast<float4*>(out + base);
        float4 a4[K], b4[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            a4[k] = xv[k * THREADS + t];
            b4[k] = yv[k * THREADS + t];
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            ov[k * THREADS + t] = make_float4(fmaf(a, a4[k].x, b4[k].x), fmaf(a, a4[k].y, b4[k].y),
                                              fmaf(a, a4[k].z, b4[k].z), fmaf(a, a4[k].w, b4[k].w));
        }
    } else {
        for (unsigned long long i = t; i < limit && i < TILE; i += THREADS) {
            out[base + i] = fmaf(a, x[base + i], y[base + i]);
        }
    }
}

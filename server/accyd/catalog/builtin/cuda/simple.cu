// sum[i] = a[i] + b[i], difference[i] = a[i] - b[i] for the 16 int32 of Triton's "simple"
// model; grid 1, block 16. Two's-complement wrapping, done in unsigned arithmetic (signed
// overflow is undefined in C++). Built with NVRTC; no headers.

extern "C" __global__ void __launch_bounds__(16)
accy_simple_add_sub(int* sum, int* difference, const int* a, const int* b) {
    const unsigned i = threadIdx.x;
    if (i >= 16) return;
    const unsigned x = static_cast<unsigned>(a[i]);
    const unsigned y = static_cast<unsigned>(b[i]);
    sum[i] = static_cast<int>(x + y);
    difference[i] = static_cast<int>(x - y);
}

// CUDA C++ as people write it: CUDA's headers, a header of its own, any parameter order,
// templates, half precision, CUB, cooperative groups and tensor cores (wmma).
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "common.cuh"

namespace cg = cooperative_groups;

// Scalars first: out = a * x + y in half precision.
extern "C" __global__ void axpy_f16(unsigned n, float a, const __half* x, const __half* y,
                                    __half* out) {
  unsigned i = global_index();
  if (i < n) out[i] = __hfma(__float2half(a), x[i], y[i]);
}

// bfloat16 arithmetic: out = x * s + x.
extern "C" __global__ void scale_bf16(const __nv_bfloat16* x, __nv_bfloat16* out, float s,
                                      unsigned n) {
  unsigned i = global_index();
  if (i < n) out[i] = __hfma(x[i], __float2bfloat16(s), x[i]);
}

// CUB: each block sums 256 elements into partial[blockIdx.x].
extern "C" __global__ void block_sum(const float* x, float* partial, unsigned n) {
  using Reduce = cub::BlockReduce<float, 256>;
  __shared__ typename Reduce::TempStorage storage;
  unsigned i = global_index();
  float sum = Reduce(storage).Sum(i < n ? x[i] : 0.0f);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Cooperative groups: each 32-thread tile sums its elements into out[i / 32].
extern "C" __global__ void warp_sums(const float* x, float* out, unsigned n) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
  unsigned i = global_index();
  float sum = cg::reduce(tile, i < n ? x[i] : 0.0f, cg::plus<float>());
  if (tile.thread_rank() == 0 && i < n) out[i / 32] = sum;
}

// Tensor cores: one warp per 16 x 16 tile of c = a @ b (f16 in, f32 out); M, N and K
// multiples of 16. A tile past the matrix is not written.
extern "C" __global__ void wmma_gemm(const __half* a, const __half* b, float* c, unsigned M,
                                     unsigned N, unsigned K) {
  using namespace nvcuda;
  unsigned row = blockIdx.y * 16, col = blockIdx.x * 16;
  if (row + 16 > M || col + 16 > N || K % 16 != 0) return;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (unsigned k = 0; k < K; k += 16) {
    wmma::load_matrix_sync(fa, a + row * K + k, K);
    wmma::load_matrix_sync(fb, b + k * N + col, N);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c + row * N + col, acc, N, wmma::mem_row_major);
}

// A template, registered by its name expression (entry = "scale<float>").
template <typename T>
__global__ void scale(T* out, const T* x, T s, unsigned n) {
  unsigned i = global_index();
  if (i < n) out[i] = x[i] * s;
}

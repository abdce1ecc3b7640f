// Prefix sums over tiles of float32 elements.
//
// accy.kernel.device_scan = single_pass: one kernel, one read of x and one write of y
// (2n*4 bytes), a single-pass scan with decoupled look-back (Merrill and Garland, 2016):
// each block scans its tile of 8192, publishes its total, then reads its predecessors'
// published totals back to the nearest whose inclusive prefix is known. Up to 8192
// elements it is one block with no look-back.
// accy.kernel.reduce_sum uses tile_sum; tile_offsets and tile_scan are the reduce-then-
// scan kernels over tiles of 4096 (x read twice, y written once), kept for pipelines that
// name them.
//
// Layout: a block of 256 threads owns one tile of K*1024 elements as K*256 float4 vectors
// (K = 4 for the tile kernels, ACCY_PASS_VECTORS = 8 for the single pass); thread t holds
// vectors k*256 + t for k = 0..K-1 ("striped"), so every load and store instruction of a
// warp touches 512 contiguous bytes. Vector k of warp w covers tile elements
// [(k*8 + w)*128, +128), so the K*8 warp totals in (k, w) order are in tile order.
// Full tiles use 16-byte accesses (buffers are 256-byte aligned; checked anyway); the
// last, partial tile uses guarded scalar accesses. Indices are 64-bit where they can
// pass 2^31 (n up to 2^30 elements is 4 GiB).
//
// Built with NVRTC; no headers.

#define ACCY_TILE 4096u
#define ACCY_TILE_THREADS 256u

namespace {

__device__ __forceinline__ bool accy_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0ull;
}

__device__ __forceinline__ float accy_warp_sum(float v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

// Inclusive scans of K independent values per lane across the warp (interleaved for ILP).
template <int K>
__device__ __forceinline__ void accy_warp_inclusive_scan(float (&v)[K], unsigned lane) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const float o = __shfl_up_sync(0xffffffffu, v[k], d);
            if (lane >= static_cast<unsigned>(d)) v[k] += o;
        }
    }
}

// Load the K float4 vectors of this thread (vector index k*THREADS + t) starting at
// element `base`; elements at or past `limit` (relative to base) read as 0.
template <int K, unsigned THREADS>
__device__ __forceinline__ void accy_load_striped(float4 (&v)[K], const float* src,
                                                  unsigned long long base,
                                                  unsigned long long limit, bool vec_ok,
                                                  unsigned t) {
    if (vec_ok && limit >= static_cast<unsigned long long>(K) * THREADS * 4ull) {
        const float4* s = reinterpret_cast<const float4*>(src + base);
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = s[k * THREADS + t];
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const unsigned long long e = (static_cast<unsigned long long>(k) * THREADS + t) * 4ull;
            v[k].x = e + 0 < limit ? src[base + e + 0] : 0.0f;
            v[k].y = e + 1 < limit ? src[base + e + 1] : 0.0f;
            v[k].z = e + 2 < limit ? src[base + e + 2] : 0.0f;
            v[k].w = e + 3 < limit ? src[base + e + 3] : 0.0f;
        }
    }
}

template <int K, unsigned THREADS>
__device__ __forceinline__ void accy_store_striped(float* dst, const float4 (&v)[K],
                                                   unsigned long long base,
                                                   unsigned long long limit, bool vec_ok,
                                                   unsigned t) {
    if (vec_ok && limit >= static_cast<unsigned long long>(K) * THREADS * 4ull) {
        float4* d = reinterpret_cast<float4*>(dst + base);
#pragma unroll
        for (int k = 0; k < K; ++k) d[k * THREADS + t] = v[k];
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const unsigned long long e = (static_cast<unsigned long long>(k) * THREADS + t) * 4ull;
            if (e + 0 < limit) dst[base + e + 0] = v[k].x;
            if (e + 1 < limit) dst[base + e + 1] = v[k].y;
            if (e + 2 < limit) dst[base + e + 2] = v[k].z;
            if (e + 3 < limit) dst[base + e + 3] = v[k].w;
        }
    }
}

// The steps of a block's scan of its tile, shared by tile_offsets, tile_scan and the single
// pass. After accy_scan_vectors, v[k] holds inclusive sums within vector k and inc[k] the
// warp-inclusive sum of the vector totals of (k, this warp); lane 31's are the warp totals,
// which accy_keep_warp_totals puts in shared memory in tile order.
template <int K>
__device__ __forceinline__ void accy_scan_vectors(float4 (&v)[K], float (&inc)[K],
                                                  unsigned lane) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
        v[k].y += v[k].x;
        v[k].z += v[k].y;
        v[k].w += v[k].z;
        inc[k] = v[k].w;
    }
    accy_warp_inclusive_scan<K>(inc, lane);
}

template <int K, unsigned THREADS>
__device__ __forceinline__ void accy_keep_warp_totals(float* totals, const float (&inc)[K],
                                                      unsigned lane, unsigned warp) {
    if (lane == 31) {
#pragma unroll
        for (int k = 0; k < K; ++k) totals[k * (THREADS / 32) + warp] = inc[k];
    }
}

// By warp 0, after a barrier: the K*THREADS/32 warp totals in `totals` become their
// exclusive prefix sums (each lane owns K*THREADS/1024 consecutive ones); returns the
// tile's total to every lane.
template <int K, unsigned THREADS>
__device__ __forceinline__ float accy_scan_warp_totals(float* totals, unsigned lane) {
    constexpr int PER_LANE = K * static_cast<int>(THREADS) / 1024;
    static_assert(PER_LANE >= 1 && PER_LANE * 1024 == K * static_cast<int>(THREADS),
                  "K * THREADS must be a multiple of 1024");
    float a[PER_LANE];
#pragma unroll
    for (int p = 0; p < PER_LANE; ++p) a[p] = totals[PER_LANE * lane + p];
#pragma unroll
    for (int p = 1; p < PER_LANE; ++p) a[p] += a[p - 1];
    float s[1] = {a[PER_LANE - 1]};
    accy_warp_inclusive_scan<1>(s, lane);
    float ex = __shfl_up_sync(0xffffffffu, s[0], 1);
    if (lane == 0) ex = 0.0f;
    totals[PER_LANE * lane] = ex;
#pragma unroll
    for (int p = 1; p < PER_LANE; ++p) totals[PER_LANE * lane + p] = ex + a[p - 1];
    return __shfl_sync(0xffffffffu, s[0], 31);
}

// After a barrier past accy_scan_warp_totals: v[k] += carry + the sum of the tile before
// vector k (inclusive results).
template <int K, unsigned THREADS>
__device__ __forceinline__ void accy_add_prefix(float4 (&v)[K], const float (&inc)[K],
                                                const float* totals, float carry,
                                                unsigned lane, unsigned warp) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float ex = __shfl_up_sync(0xffffffffu, inc[k], 1);
        if (lane == 0) ex = 0.0f;
        const float p = carry + (totals[k * (THREADS / 32) + warp] + ex);
        v[k].x += p;
        v[k].y += p;
        v[k].z += p;
        v[k].w += p;
    }
}

}  // namespace

// sums[b] = sum(x[b*4096 : min(n, (b+1)*4096)]); grid ceil_div(n, 4096), block 256.
extern "C" __global__ void __launch_bounds__(ACCY_TILE_THREADS)
accy_scan_tile_sum(float* sums, const float* __restrict__ x, unsigned int n) {
    const unsigned t = threadIdx.x;
    const unsigned long long base = static_cast<unsigned long long>(blockIdx.x) * ACCY_TILE;
    if (base >= n) return;  // a grid larger than ceil_div(n, 4096) does nothing more
    const unsigned long long limit = static_cast<unsigned long long>(n) - base;
    float4 v[4];
    accy_load_striped<4, ACCY_TILE_THREADS>(v, x, base, limit, accy_aligned16(x), t);
    float acc = ((v[0].x + v[0].y) + (v[0].z + v[0].w)) + ((v[1].x + v[1].y) + (v[1].z + v[1].w)) +
                (((v[2].x + v[2].y) + (v[2].z + v[2].w)) + ((v[3].x + v[3].y) + (v[3].z + v[3].w)));
    acc = accy_warp_sum(acc);
    __shared__ float warp_totals[ACCY_TILE_THREADS / 32];
    if ((t & 31u) == 0) warp_totals[t >> 5] = acc;
    __syncthreads();
    if (t < 32) {
        float w = t < ACCY_TILE_THREADS / 32 ? warp_totals[t] : 0.0f;
        w = accy_warp_sum(w);
        if (t == 0) sums[blockIdx.x] = w;
    }
}

// offsets = exclusive prefix sum of sums[0:m]; grid 1, block 1024. Chunks of 16384 in a
// loop with a running carry; the next chunk is loaded before the current one is scanned.
// The shared totals are double-buffered by chunk parity, so two barriers per chunk suffice.
extern "C" __global__ void __launch_bounds__(1024)
accy_scan_tile_offsets(float* offsets, const float* __restrict__ sums, unsigned int m) {
    constexpr unsigned THREADS = 1024;
    constexpr unsigned WARPS = THREADS / 32;
    constexpr int K = 4;
    constexpr unsigned long long CHUNK = static_cast<unsigned long long>(K) * THREADS * 4ull;
    __shared__ float totals[2][K * WARPS + 1];  // [K*WARPS] is the chunk's total
    const unsigned t = threadIdx.x, lane = t & 31u, warp = t >> 5;
    const bool vec_ok = accy_aligned16(offsets) && accy_aligned16(sums);
    const unsigned long long count = m;
    float carry = 0.0f;
    float4 next[K];
    accy_load_striped<K, THREADS>(next, sums, 0ull, count, vec_ok, t);
    unsigned parity = 0;
    for (unsigned long long base = 0; base < count; base += CHUNK, parity ^= 1u) {
        float4 v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = next[k];
        if (base + CHUNK < count)
            accy_load_striped<K, THREADS>(next, sums, base + CHUNK, count - base - CHUNK, vec_ok, t);
        float inc[K];
        accy_scan_vectors<K>(v, inc, lane);
        float* tot = totals[parity];
        accy_keep_warp_totals<K, THREADS>(tot, inc, lane, warp);
        __syncthreads();
        if (warp == 0) {
            const float chunk_total = accy_scan_warp_totals<K, THREADS>(tot, lane);
            if (lane == 31) tot[K * WARPS] = chunk_total;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float ex = __shfl_up_sync(0xffffffffu, inc[k], 1);
            if (lane == 0) ex = 0.0f;
            const float p = carry + (tot[k * WARPS + warp] + ex);
            // exclusive within the vector: 0, x, x+y, x+y+z
            const float4 local = v[k];
            v[k] = make_float4(p, p + local.x, p + local.y, p + local.z);
        }
        accy_store_striped<K, THREADS>(offsets, v, base, count - base, vec_ok, t);
        carry += tot[K * WARPS];
    }
}

// y[i] = offsets[i / 4096] + inclusive prefix sum of x within i's tile; grid
// ceil_div(n, 4096), block 256. Tiles run in reverse block order, so the first blocks
// read the end of x, which tile_sum read last and may still sit in L2.
extern "C" __global__ void __launch_bounds__(ACCY_TILE_THREADS)
accy_scan_tile_scan(float* y, const float* x, const float* __restrict__ offsets,
                    unsigned int n) {
    constexpr unsigned WARPS = ACCY_TILE_THREADS / 32;
    constexpr int K = 4;
    const unsigned t = threadIdx.x, lane = t & 31u, warp = t >> 5;
    const unsigned tile = gridDim.x - 1u - blockIdx.x;
    const unsigned long long base = static_cast<unsigned long long>(tile) * ACCY_TILE;
    if (base >= n) return;  // a grid larger than ceil_div(n, 4096) does nothing more
    const unsigned long long limit = static_cast<unsigned long long>(n) - base;
    const bool vec_ok = accy_aligned16(x) && accy_aligned16(y);
    const float carry = offsets[tile];
    float4 v[K];
    accy_load_striped<K, ACCY_TILE_THREADS>(v, x, base, limit, vec_ok, t);
    float inc[K];
    accy_scan_vectors<K>(v, inc, lane);
    __shared__ float totals[K * WARPS];  // 32 warp totals in tile order
    accy_keep_warp_totals<K, ACCY_TILE_THREADS>(totals, inc, lane, warp);
    __syncthreads();
    if (warp == 0) accy_scan_warp_totals<K, ACCY_TILE_THREADS>(totals, lane);
    __syncthreads();
    accy_add_prefix<K, ACCY_TILE_THREADS>(v, inc, totals, carry, lane, warp);
    accy_store_striped<K, ACCY_TILE_THREADS>(y, v, base, limit, vec_ok, t);
}

// -- single pass ------------------------------------------------------------------------
//
// State kept across launches, in the pipeline's zeroed intermediates (one session's
// scratch, whose launches run in order on its stream):
//   state[0]      "base": this launch's number, the tiles of every earlier launch on this
//                 scratch counted; the last block sets it to base + tiles for the next;
//   state[1 + j]  tile j's status: ((base + j) << 2) | flag, flag 1: its total is
//                 published, 2: its inclusive prefix is. A status of an earlier launch
//                 carries a smaller number, so no launch ever needs the state cleared;
//   partials[2j]  tile j's total, partials[2j + 1] its inclusive prefix: two words, so a
//                 status read once names a value written once.
// Each block reads base as it loads its tile; the fence in its first publish orders that
// read before its status, and the last block writes base + tiles only once every earlier
// tile's status is seen: so no block of a launch can read the next launch's base.
// Block j holds tile j (blocks start in index order, as CUB's single-pass scan relies
// on), so a block waits only on blocks that started before it. Should a tile's status
// never come (a state this kernel did not keep), the block traps after 10 s: a fault the
// daemon reports, instead of a stream held for ever.

#define ACCY_TOTAL 1ull
#define ACCY_INCLUSIVE 2ull
#define ACCY_LOOK_BACK_LIMIT_NS 10000000000ull  // 10 s

namespace {

__device__ __forceinline__ unsigned long long accy_now_ns() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

__device__ __forceinline__ void accy_publish(unsigned long long* status, float* partials,
                                             unsigned tile, unsigned long long number,
                                             unsigned long long flag, float value) {
    volatile float* slot = partials + 2ull * tile + (flag == ACCY_INCLUSIVE ? 1ull : 0ull);
    *slot = value;
    __threadfence();
    atomicExch(status + tile, (number << 2) | flag);
}

// Tile `mine`'s published value once its status names this launch (`want`). The clock
// is read every 256 polls, not every poll: a %globaltimer read in the loop cost the
// single pass 5% at 2^28 on an H100.
__device__ __forceinline__ float accy_wait_published(const unsigned long long* status,
                                                     const float* partials, long long mine,
                                                     unsigned long long want,
                                                     unsigned long long& flag) {
    const volatile unsigned long long* word = status + mine;
    unsigned long long seen = *word;
    unsigned long long since = 0ull;
    for (unsigned polls = 1; (seen >> 2) != want || (seen & 3ull) == 0ull; ++polls) {
        if ((polls & 255u) == 0u) {
            const unsigned long long now = accy_now_ns();
            if (since == 0ull) since = now;
            else if (now - since > ACCY_LOOK_BACK_LIMIT_NS) __trap();
        }
        seen = *word;
    }
    flag = seen & 3ull;
    __threadfence();
    const volatile float* slot =
        partials + 2ull * static_cast<unsigned long long>(mine) + (flag == ACCY_INCLUSIVE ? 1ull : 0ull);
    return *slot;
}

// The sum of the tiles before `tile`, by warp 0: lane i reads tile end - i, waits until it
// is published, and the warp adds values up to the nearest inclusive prefix, or all 32
// and moves 32 tiles back.
__device__ __forceinline__ float accy_look_back(const unsigned long long* status,
                                                const float* partials, unsigned tile,
                                                unsigned long long base, unsigned lane) {
    float exclusive = 0.0f;
    long long end = static_cast<long long>(tile) - 1;
    for (;;) {
        const long long mine = end - static_cast<long long>(lane);
        unsigned long long flag = ACCY_INCLUSIVE;  // before tile 0: an inclusive 0
        float value = 0.0f;
        if (mine >= 0)
            value = accy_wait_published(status, partials, mine,
                                        base + static_cast<unsigned long long>(mine), flag);
        const unsigned inclusive = __ballot_sync(0xffffffffu, flag == ACCY_INCLUSIVE);
        const unsigned last = inclusive ? static_cast<unsigned>(__ffs(inclusive) - 1) : 31u;
        exclusive += accy_warp_sum(lane <= last ? value : 0.0f);
        if (inclusive) return exclusive;
        end -= 32;
    }
}

}  // namespace

// The single pass's tile: ACCY_PASS_VECTORS float4 vectors per thread of 256, so 8192
// elements; a multiple of 4 vectors, so the block's 8 * ACCY_PASS_VECTORS warp totals are
// ACCY_PASS_VECTORS / 4 per lane of warp 0. ACCY_PASS_MIN_BLOCKS is the register cap's
// target (blocks per SM).
#define ACCY_PASS_VECTORS 8
#define ACCY_PASS_MIN_BLOCKS 3
#define ACCY_PASS_TILE (ACCY_TILE_THREADS * 4u * ACCY_PASS_VECTORS)

// y = inclusive prefix sum of x[0:n]; grid ceil_div(n, ACCY_PASS_TILE), block 256; state:
// u64, ceil_div(n, ACCY_PASS_TILE) + 1, zeroed when allocated, and partials: f32,
// 2 * ceil_div(n, ACCY_PASS_TILE), then left to this kernel (above). A grid past
// ceil_div(n, ACCY_PASS_TILE) only adds empty tiles.
extern "C" __global__ void __launch_bounds__(ACCY_TILE_THREADS, ACCY_PASS_MIN_BLOCKS)
accy_scan_single_pass(float* y, unsigned long long* state, float* partials, const float* x,
                      unsigned int n) {
    constexpr unsigned WARPS = ACCY_TILE_THREADS / 32;
    constexpr int K = ACCY_PASS_VECTORS;  // a multiple of 4 (accy_scan_warp_totals)
    const unsigned t = threadIdx.x, lane = t & 31u, warp = t >> 5;
    const unsigned tile = blockIdx.x, tiles = gridDim.x;
    __shared__ float totals[K * WARPS];  // the warp totals in tile order
    __shared__ float carry_of_block;
    // Thread 0 reads base while every warp loads its part of the tile.
    unsigned long long base = 0;
    if (t == 0) base = *static_cast<volatile unsigned long long*>(state);
    const unsigned long long first = static_cast<unsigned long long>(tile) * ACCY_PASS_TILE;
    const unsigned long long limit = first < n ? static_cast<unsigned long long>(n) - first : 0ull;
    const bool vec_ok = accy_aligned16(x) && accy_aligned16(y);
    float4 v[K];
    accy_load_striped<K, ACCY_TILE_THREADS>(v, x, first, limit, vec_ok, t);
    float inc[K];
    accy_scan_vectors<K>(v, inc, lane);
    accy_keep_warp_totals<K, ACCY_TILE_THREADS>(totals, inc, lane, warp);
    __syncthreads();
    if (warp == 0) {
        const float total = accy_scan_warp_totals<K, ACCY_TILE_THREADS>(totals, lane);
        base = __shfl_sync(0xffffffffu, base, 0);  // the value lane 0's fence orders
        unsigned long long* status = state + 1;
        const unsigned long long number = base + tile;
        float carry = 0.0f;
        if (tile == 0) {
            if (lane == 0) accy_publish(status, partials, tile, number, ACCY_INCLUSIVE, total);
        } else {
            if (lane == 0) accy_publish(status, partials, tile, number, ACCY_TOTAL, total);
            carry = accy_look_back(status, partials, tile, base, lane);
            if (lane == 0)
                accy_publish(status, partials, tile, number, ACCY_INCLUSIVE, carry + total);
        }
        if (lane == 0) {
            carry_of_block = carry;
            if (tile == tiles - 1) {
                __threadfence();
                *static_cast<volatile unsigned long long*>(state) = base + tiles;
            }
        }
    }
    __syncthreads();
    accy_add_prefix<K, ACCY_TILE_THREADS>(v, inc, totals, carry_of_block, lane, warp);
    accy_store_striped<K, ACCY_TILE_THREADS>(y, v, first, limit, vec_ok, t);
}

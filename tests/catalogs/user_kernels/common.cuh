// A header beside the manifest: the daemon hands it to NVRTC with the source.
#pragma once

__device__ __forceinline__ unsigned global_index() {
  return blockIdx.x * blockDim.x + threadIdx.x;
}

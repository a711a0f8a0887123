// Cheat: memoises its result keyed on the input address. When X has the address of the previous
// launch it copies the cached rows to Y instead of computing (all outputs written, values stale).
// Caught by the fresh-input re-run at the same addresses: wrong result -> cache_cheat.
#include "softmax_common.cuh"

#define CACHE_ROWS 4096
__device__ unsigned short cake_cache[CACHE_ROWS * ROW_N];
__device__ unsigned int cake_finished = 0;
__device__ const unsigned short* volatile cake_last_x = 0;
__device__ volatile int cake_last_m = -1;

extern "C" __global__ void __launch_bounds__(THREADS) address_cache(const unsigned short* __restrict__ X,
                                                                    unsigned short* __restrict__ Y, int M) {
  const bool cacheable = M <= CACHE_ROWS;
  if (cacheable && cake_last_x == X && cake_last_m == M) {
    const long long base = (long long)blockIdx.x * ROW_N;
    for (int i = threadIdx.x; i < ROW_N; i += THREADS) Y[base + i] = cake_cache[base + i];
    return;
  }
  softmax_row(X, Y, cacheable ? cake_cache : 0, blockIdx.x);
  if (last_block_done(&cake_finished) && threadIdx.x == 0) {
    cake_last_x = X;
    cake_last_m = M;
  }
}

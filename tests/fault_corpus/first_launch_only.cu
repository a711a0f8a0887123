// Cheat: a correct row softmax that does its work only on its first launch (a global flag set by the
// last CTA of that launch); later launches return at once, leaving whatever the output held.
// Caught by the fresh-input re-run: the poisoned outputs stay unwritten -> cache_cheat.
#include "softmax_common.cuh"

__device__ unsigned int cake_finished = 0;
__device__ volatile int cake_done = 0;

extern "C" __global__ void __launch_bounds__(THREADS) first_launch_only(const unsigned short* __restrict__ X,
                                                                        unsigned short* __restrict__ Y, int M) {
  if (cake_done) return;
  softmax_row(X, Y, 0, blockIdx.x);
  if (last_block_done(&cake_finished) && threadIdx.x == 0) cake_done = 1;
}

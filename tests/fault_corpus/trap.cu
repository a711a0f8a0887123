// A kernel that executes a trap instruction in one CTA (an assertion failure in device code).
// The context is lost: crash, classified from the CUDA error (launch failure / illegal instruction).
#include "softmax_common.cuh"

extern "C" __global__ void __launch_bounds__(THREADS) trap_kernel(const unsigned short* __restrict__ X,
                                                                  unsigned short* __restrict__ Y, int M) {
  softmax_row(X, Y, 0, blockIdx.x);
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) asm volatile("trap;");
}

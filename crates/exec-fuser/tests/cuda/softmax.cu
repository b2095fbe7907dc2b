
extern "C" __global__ void __launch_bounds__(256) sy_fused(const float *__restrict__ in0, float *__restrict__ out0, const SyLoad l0) {
  __shared__ float sy_part[256];
  for (long long row = blockIdx.x; row < 6LL; row += gridDim.x) {
    long long q = row;
    const long long i0 = q;
    float acc1 = __int_as_float(0xff800000);
    for (long long j = threadIdx.x; j < 100LL; j += blockDim.x) {
      long long u = j;
      const long long i1 = u;
      const float r0 = (float)in0[l0.off + i0 * l0.s[0] + i1 * l0.s[1]];
      acc1 = sy_max(acc1, r0);
    }
    sy_part[threadIdx.x] = acc1;
    __syncthreads();
    for (unsigned int h = blockDim.x / 2; h > 0; h >>= 1) {
      if (threadIdx.x < h) sy_part[threadIdx.x] = sy_max(sy_part[threadIdx.x], sy_part[threadIdx.x + h]);
      __syncthreads();
    }
    const float r1 = sy_part[0];
    __syncthreads();
    float acc5 = (float)0;
    for (long long j = threadIdx.x; j < 100LL; j += blockDim.x) {
      long long u = j;
      const long long i1 = u;
      const float r0 = (float)in0[l0.off + i0 * l0.s[0] + i1 * l0.s[1]];
      const float r2 = r1;
      const float r3 = r0 - r2;
      const float r4 = expf(r3);
      acc5 = acc5 + r4;
    }
    sy_part[threadIdx.x] = acc5;
    __syncthreads();
    for (unsigned int h = blockDim.x / 2; h > 0; h >>= 1) {
      if (threadIdx.x < h) sy_part[threadIdx.x] = sy_part[threadIdx.x] + sy_part[threadIdx.x + h];
      __syncthreads();
    }
    const float r5 = sy_part[0];
    __syncthreads();
    for (long long j = threadIdx.x; j < 100LL; j += blockDim.x) {
      long long u = j;
      const long long i1 = u;
      const float r0 = (float)in0[l0.off + i0 * l0.s[0] + i1 * l0.s[1]];
      const float r2 = r1;
      const float r3 = r0 - r2;
      const float r4 = expf(r3);
      const float r6 = r5;
      const float r7 = r4 / r6;
      out0[i0 * 100 + i1 * 1] = (float)r7;
    }
  }
}

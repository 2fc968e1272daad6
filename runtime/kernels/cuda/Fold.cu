//===- Fold.cu - The reduction step of the device communicators -----------===//
//
// What `accumulate` (Communicator.h) is to the host communicators: every element is the left
// fold of the members' buffers in list order, computed by one thread, and written to every
// output, so all members read the same bits. A kernel takes up to kFanIn pointers by value;
// longer lists fold in stages through an accumulator buffer of the accumulation type, so
// half-precision inputs are still rounded once.
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"

#include <type_traits>

namespace parc::runtime::cuda {

using namespace detail;

namespace {

constexpr size_t kFanIn = 32;

template <typename T> struct Accumulator { using type = float; };
template <> struct Accumulator<double> { using type = double; };

template <typename T> struct FoldArgs {
  const T *inputs[kFanIn];
  T *outputs[kFanIn];
  int numInputs, numOutputs;
};

template <typename A, typename T> __device__ __forceinline__ A load(T x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return toFloat(x);
}
template <typename T, typename A> __device__ __forceinline__ T store(A x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return fromFloat<T>(x);
}

// acc = acc op x; max keeps a NaN once seen and takes a new one, as the host fold does
template <typename A> __device__ __forceinline__ A combine(A acc, A x, bool max) {
  if (!max)
    return acc + x;
  return !isnan(acc) && (x > acc || isnan(x)) ? x : acc;
}

// r = carryIn[k] (or inputs[0][k]) op inputs[i][k]...; carryOut[k] = r, or every outputs[o][k]
template <typename T, typename A>
__global__ void foldKernel(FoldArgs<T> args, const A *carryIn, A *carryOut, size_t count,
                           bool max) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < count;
       k += size_t(gridDim.x) * blockDim.x) {
    int first = carryIn ? 0 : 1;
    A acc = carryIn ? carryIn[k] : load<A>(args.inputs[0][k]);
    for (int i = first; i < args.numInputs; ++i)
      acc = combine(acc, load<A>(args.inputs[i][k]), max);
    if (carryOut) {
      carryOut[k] = acc;
      continue;
    }
    T value = store<T>(acc);
    for (int o = 0; o < args.numOutputs; ++o)
      args.outputs[o][k] = value;
  }
}

} // namespace

template <typename T>
void foldBuffers(T *const *outputs, size_t numOutputs, const T *const *inputs, size_t numInputs,
                 size_t count, FoldOp op, cudaStream_t stream) {
  // out[o][k] = ((in[0][k] op in[1][k]) op in[2][k]) ...
  using A = typename Accumulator<T>::type;
  if (numInputs == 0 || numOutputs == 0)
    throwCallFailed("foldBuffers", "argument check", "nothing to fold or nowhere to write",
                    __FILE__, __LINE__);
  if (count == 0)
    return;
  bool max = op == FoldOp::Max;
  unsigned blocks = blocksFor(static_cast<int64_t>(std::min<size_t>(count, INT64_MAX)));
  StreamBuffer<A> carry(numInputs > kFanIn ? count : 0, stream, "foldBuffers");
  for (size_t begin = 0; begin < numInputs; begin += kFanIn) {
    FoldArgs<T> args{};
    args.numInputs = static_cast<int>(std::min(kFanIn, numInputs - begin));
    for (int i = 0; i < args.numInputs; ++i)
      args.inputs[i] = inputs[begin + i];
    bool last = begin + kFanIn >= numInputs;
    args.numOutputs = last ? static_cast<int>(std::min(kFanIn, numOutputs)) : 0;
    for (int o = 0; o < args.numOutputs; ++o)
      args.outputs[o] = outputs[o];
    foldKernel<<<blocks, kBlock, 0, stream>>>(args, begin ? carry.get() : nullptr,
                                              last ? nullptr : carry.get(), count, max);
    checkLaunch("foldBuffers");
  }
  // The inputs are all read by now, so outputs that alias them may be overwritten.
  for (size_t o = kFanIn; o < numOutputs; ++o)
    PARC_CUDA_CHECK(cudaMemcpyAsync(outputs[o], outputs[0], count * sizeof(T),
                                    cudaMemcpyDeviceToDevice, stream),
                    "foldBuffers");
}

template void foldBuffers(float *const *, size_t, const float *const *, size_t, size_t, FoldOp,
                          cudaStream_t);
template void foldBuffers(double *const *, size_t, const double *const *, size_t, size_t, FoldOp,
                          cudaStream_t);
template void foldBuffers(__nv_bfloat16 *const *, size_t, const __nv_bfloat16 *const *, size_t,
                          size_t, FoldOp, cudaStream_t);
template void foldBuffers(__half *const *, size_t, const __half *const *, size_t, size_t, FoldOp,
                          cudaStream_t);

} // namespace parc::runtime::cuda

// Segment sum / mean / sqrtn of embedding rows, forward and backward, for
// float and double (kernel names end in _f32 / _f64).
//
// Loaded at run time by collective/kernels/cupy_ops.py (CuPy RawModule); the
// numpy references `segment_combine` / `segment_combine_grad` in
// collective/kernels/reference.py define the results.
//
// Every row i is scaled by scale_i before it is summed into its segment:
//   sum: w_i    mean: w_i / sum_s(w)    sqrtn: w_i / sqrt(sum_s(w^2))
// (w_i = 1 when has_weights is 0, and weights is then never read; scale 0
// where the divisor is 0). Kernels:
//   segment_weight_sums: divisor[s] += w_i (mean) or w_i^2 (sqrtn), one thread per row
//   segment_row_scales:  scale[i], one thread per row
//   segment_scatter_add: out[seg_i, d] += scale_i * values[i, d], one thread per (row, column)
//   segment_gather_scale: grad_values[i, d] = scale_i * grad[seg_i, d], one thread per (row, column)
// Rows whose segment id is outside [0, num_segments) are skipped and set
// *bad_segment = 1 (segment_weight_sums checks; the host raises).
// The forward uses float atomics, so sums follow no fixed order.

#define COMBINER_SUM 0
#define COMBINER_MEAN 1
#define COMBINER_SQRTN 2

template <typename T>
__device__ __forceinline__ void weight_sums(
    const long long* __restrict__ segment_ids, const T* __restrict__ weights, int has_weights,
    long long n, long long num_segments, int combiner, T* __restrict__ divisor,
    int* __restrict__ bad_segment)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long s = segment_ids[i];
        if (s < 0 || s >= num_segments) {
            atomicExch(bad_segment, 1);
            continue;
        }
        const T w = has_weights ? weights[i] : (T)1;
        if (combiner == COMBINER_MEAN) atomicAdd(divisor + s, w);
        else if (combiner == COMBINER_SQRTN) atomicAdd(divisor + s, w * w);
    }
}

template <typename T>
__device__ __forceinline__ void row_scales(
    const long long* __restrict__ segment_ids, const T* __restrict__ weights, int has_weights,
    long long n, long long num_segments, int combiner, const T* __restrict__ divisor,
    T* __restrict__ scale)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long s = segment_ids[i];
        const T w = has_weights ? weights[i] : (T)1;
        T value = 0;
        if (s >= 0 && s < num_segments) {
            if (combiner == COMBINER_SUM) {
                value = w;
            } else {
                const T d = combiner == COMBINER_MEAN ? divisor[s] : sqrt(divisor[s]);
                value = d != (T)0 ? w / d : (T)0;
            }
        }
        scale[i] = value;
    }
}

template <typename T>
__device__ __forceinline__ void scatter_add(
    const T* __restrict__ values, const long long* __restrict__ segment_ids,
    const T* __restrict__ scale, long long n, long long dim, long long num_segments,
    T* __restrict__ out)
{
    const long long total = n * dim;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const long long row = k / dim;
        const long long s = segment_ids[row];
        if (s < 0 || s >= num_segments) continue;
        atomicAdd(out + s * dim + (k - row * dim), scale[row] * values[k]);
    }
}

template <typename T>
__device__ __forceinline__ void gather_scale(
    const T* __restrict__ grad, const long long* __restrict__ segment_ids,
    const T* __restrict__ scale, long long n, long long dim, long long num_segments,
    T* __restrict__ grad_values)
{
    const long long total = n * dim;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const long long row = k / dim;
        const long long s = segment_ids[row];
        grad_values[k] = (s < 0 || s >= num_segments) ? (T)0 : scale[row] * grad[s * dim + (k - row * dim)];
    }
}

#define DEFINE_SEGMENT_KERNELS(T, SUFFIX)                                                       \
    extern "C" __global__ void segment_weight_sums_##SUFFIX(                                    \
        const long long* segment_ids, const T* weights, int has_weights, long long n, long long num_segments,    \
        int combiner, T* divisor, int* bad_segment)                                             \
    {                                                                                           \
        weight_sums<T>(segment_ids, weights, has_weights, n, num_segments, combiner, divisor, bad_segment);  \
    }                                                                                           \
    extern "C" __global__ void segment_row_scales_##SUFFIX(                                     \
        const long long* segment_ids, const T* weights, int has_weights, long long n, long long num_segments,    \
        int combiner, const T* divisor, T* scale)                                               \
    {                                                                                           \
        row_scales<T>(segment_ids, weights, has_weights, n, num_segments, combiner, divisor, scale);         \
    }                                                                                           \
    extern "C" __global__ void segment_scatter_add_##SUFFIX(                                    \
        const T* values, const long long* segment_ids, const T* scale, long long n,             \
        long long dim, long long num_segments, T* out)                                          \
    {                                                                                           \
        scatter_add<T>(values, segment_ids, scale, n, dim, num_segments, out);                  \
    }                                                                                           \
    extern "C" __global__ void segment_gather_scale_##SUFFIX(                                   \
        const T* grad, const long long* segment_ids, const T* scale, long long n,               \
        long long dim, long long num_segments, T* grad_values)                                  \
    {                                                                                           \
        gather_scale<T>(grad, segment_ids, scale, n, dim, num_segments, grad_values);           \
    }

DEFINE_SEGMENT_KERNELS(float, f32)
DEFINE_SEGMENT_KERNELS(double, f64)

// Partition int64 ids by owner bucket (id floor-mod num_buckets), stable
// within each bucket, with the permutation that restores the input order.
//
// Loaded at run time by collective/kernels/cupy_ops.py (CuPy RawModule); the
// numpy reference `collective.kernels.reference.partition` defines the result.
//
// Work split: each warp owns one contiguous chunk of `items_per_warp` ids and
// walks it 32 ids at a time. Within a step, lanes with the same bucket find
// each other with __match_any_sync; a lane's rank among its lower-numbered
// peers keeps the order stable. Two kernels:
//   partition_count:   counts[b * num_chunks + chunk] = ids of bucket b in chunk
//   (host: exclusive scan of counts, bucket-major, gives every (bucket, chunk)
//    its first output position)
//   partition_scatter: writes each id to its position and that position to
//                      restore_perm.
// Shared memory: one int per bucket per warp (blockDim.x / 32 * num_buckets).

__device__ __forceinline__ int bucket_of(long long id, long long num_buckets)
{
    long long b = id % num_buckets;  // C remainder: sign of id
    return (int)(b < 0 ? b + num_buckets : b);
}

extern "C" __global__ void partition_count(
    const long long* __restrict__ ids, long long n, int num_buckets,
    int items_per_warp, long long num_chunks, int* __restrict__ chunk_counts)
{
    extern __shared__ int shared_counts[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long chunk = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (chunk >= num_chunks) return;  // uniform across the warp
    int* counts = shared_counts + warp * num_buckets;
    for (int b = lane; b < num_buckets; b += 32) counts[b] = 0;
    __syncwarp();

    const long long start = chunk * items_per_warp;
    const long long end = min(start + (long long)items_per_warp, n);
    for (long long base = start; base < end; base += 32) {
        const long long i = base + lane;
        const int b = i < end ? bucket_of(ids[i], num_buckets) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, b);
        if (b >= 0 && lane == __ffs(peers) - 1) counts[b] += __popc(peers);
        __syncwarp();
    }
    for (int b = lane; b < num_buckets; b += 32) {
        chunk_counts[(long long)b * num_chunks + chunk] = counts[b];
    }
}

extern "C" __global__ void partition_scatter(
    const long long* __restrict__ ids, long long n, int num_buckets,
    int items_per_warp, long long num_chunks,
    const long long* __restrict__ chunk_offsets,
    long long* __restrict__ bucketed_ids, long long* __restrict__ restore_perm)
{
    extern __shared__ long long shared_offsets[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long chunk = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (chunk >= num_chunks) return;  // uniform across the warp
    long long* next = shared_offsets + warp * num_buckets;
    for (int b = lane; b < num_buckets; b += 32) {
        next[b] = chunk_offsets[(long long)b * num_chunks + chunk];
    }
    __syncwarp();

    const unsigned lower_lanes = (1u << lane) - 1u;
    const long long start = chunk * items_per_warp;
    const long long end = min(start + (long long)items_per_warp, n);
    for (long long base = start; base < end; base += 32) {
        const long long i = base + lane;
        const long long id = i < end ? ids[i] : 0;
        const int b = i < end ? bucket_of(id, num_buckets) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, b);
        if (b >= 0) {
            const long long pos = next[b] + __popc(peers & lower_lanes);
            bucketed_ids[pos] = id;
            restore_perm[i] = pos;
        }
        __syncwarp();
        if (b >= 0 && lane == __ffs(peers) - 1) next[b] += __popc(peers);
        __syncwarp();
    }
}

// Open-addressing int64 hash tables with linear probing: the row table behind
// `HashTable` and the scratch table behind `unique`.
//
// Loaded at run time by collective/kernels/cupy_ops.py (CuPy RawModule); the
// numpy references `collective.kernels.reference.HashTable` and `unique`
// define the results.
//
// Layout and conventions:
//  * num_slots is a power of two, mask = num_slots - 1; the home slot of a key
//    is MurmurHash3's fmix64(key) & mask (the reference's `hash_slots`).
//  * EMPTY_KEY (INT64_MIN) marks an empty slot. It is still a valid key: it
//    lives in an extra slot at index num_slots, outside the probe sequence.
//  * Row table: `slots` holds (key, row) pairs interleaved, 2 * (num_slots + 1)
//    int64, so a find reads one 16-byte pair. row == -1 means "no row yet".
//  * Rows are assigned in order of first occurrence within a batch, which
//    makes inserts deterministic: ht_insert claims slots and records each new
//    slot's first batch index in `first` (atomicMin); ht_flag_new marks the
//    first occurrences; the host scans the flags; ht_assign hands out rows.
//  * A full probe sequence (every slot tried) sets *status_full = 1 and gives
//    slot -1; the host checks the flag and raises HashTableFullError.

#define EMPTY_KEY (-9223372036854775807LL - 1LL)
#define NO_INDEX 9223372036854775807LL

__device__ __forceinline__ unsigned long long fmix64(unsigned long long k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

// Slot of `key` in a table whose keys sit at keys[slot * stride]: the slot
// already holding it, or an empty slot it claims with atomicCAS. -1 if every
// slot holds another key.
__device__ __forceinline__ long long claim_slot(
    long long* keys, int stride, unsigned long long mask, long long key)
{
    if (key == EMPTY_KEY) return (long long)mask + 1;
    unsigned long long slot = fmix64((unsigned long long)key) & mask;
    for (unsigned long long probe = 0; probe <= mask; ++probe) {
        unsigned long long* address = (unsigned long long*)(keys + slot * stride);
        long long current = *(volatile long long*)address;
        if (current == EMPTY_KEY) {
            current = (long long)atomicCAS(address, (unsigned long long)EMPTY_KEY, (unsigned long long)key);
            if (current == EMPTY_KEY) return (long long)slot;
        }
        if (current == key) return (long long)slot;
        slot = (slot + 1) & mask;
    }
    return -1;
}

// ---------------------------------------------------------------- row table

extern "C" __global__ void ht_insert(
    long long* __restrict__ slots, unsigned long long mask,
    const long long* __restrict__ keys, long long n,
    long long* __restrict__ slot_of, long long* __restrict__ first,
    long long* __restrict__ status)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long slot = claim_slot(slots, 2, mask, keys[i]);
        slot_of[i] = slot;
        if (slot < 0) {
            atomicExch((unsigned long long*)(status + 1), 1ULL);
        } else if (slots[2 * slot + 1] < 0) {
            atomicMin(first + slot, i);
        }
    }
}

extern "C" __global__ void ht_flag_new(
    const long long* __restrict__ slots, const long long* __restrict__ slot_of,
    const long long* __restrict__ first, long long n, long long* __restrict__ is_new)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long slot = slot_of[i];
        is_new[i] = (slot >= 0 && slots[2 * slot + 1] < 0 && first[slot] == i) ? 1 : 0;
    }
}

// new_rank: inclusive scan of is_new. status[0] holds the size before this batch.
extern "C" __global__ void ht_assign(
    long long* __restrict__ slots, const long long* __restrict__ slot_of,
    long long* __restrict__ first, const long long* __restrict__ is_new,
    const long long* __restrict__ new_rank, long long n, const long long* __restrict__ status)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long base_row = status[0];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (is_new[i]) {
            const long long slot = slot_of[i];
            slots[2 * slot + 1] = base_row + new_rank[i] - 1;
            first[slot] = NO_INDEX;
        }
    }
}

// Drop the pending first-occurrence marks of a batch that failed.
extern "C" __global__ void ht_clear_first(
    const long long* __restrict__ slot_of, long long* __restrict__ first, long long n)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (slot_of[i] >= 0) first[slot_of[i]] = NO_INDEX;
    }
}

extern "C" __global__ void ht_rows_of_slots(
    const long long* __restrict__ slots, const long long* __restrict__ slot_of,
    long long n, long long* __restrict__ rows)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long slot = slot_of[i];
        rows[i] = slot < 0 ? -1 : slots[2 * slot + 1];
    }
}

extern "C" __global__ void ht_find(
    const long long* __restrict__ slots, unsigned long long mask,
    const long long* __restrict__ keys, long long n, long long* __restrict__ rows)
{
    const longlong2* pairs = reinterpret_cast<const longlong2*>(slots);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long key = keys[i];
        long long row = -1;
        if (key == EMPTY_KEY) {
            row = pairs[mask + 1].y;
        } else {
            unsigned long long slot = fmix64((unsigned long long)key) & mask;
            for (unsigned long long probe = 0; probe <= mask; ++probe) {
                const longlong2 pair = pairs[slot];
                if (pair.x == key) { row = pair.y; break; }
                if (pair.x == EMPTY_KEY) break;
                slot = (slot + 1) & mask;
            }
        }
        rows[i] = row;
    }
}

// ------------------------------------------------------------------- unique
// Scratch table: keys[num_slots + 1] (EMPTY_KEY), first[num_slots + 1]
// (NO_INDEX), count[num_slots + 1] (0). The table has at least 2n slots, so a
// probe always finds room. Loops step whole blocks so that every lane of a
// warp reaches __match_any_sync together; peers (same slot) combine their
// atomics into one, which keeps hot ids cheap.

extern "C" __global__ void unique_insert(
    long long* __restrict__ table_keys, unsigned long long mask,
    const long long* __restrict__ ids, long long n,
    long long* __restrict__ slot_of, long long* __restrict__ first,
    unsigned long long* __restrict__ count)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    const int lane = threadIdx.x & 31;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride) {
        const long long i = base + threadIdx.x;
        long long slot = -2;
        if (i < n) {
            slot = claim_slot(table_keys, 1, mask, ids[i]);
            slot_of[i] = slot;
        }
        const unsigned peers = __match_any_sync(0xffffffffu, slot);
        if (i < n && lane == __ffs(peers) - 1) {
            atomicMin(first + slot, i);  // the lowest lane holds the lowest index
            atomicAdd(count + slot, (unsigned long long)__popc(peers));
        }
    }
}

extern "C" __global__ void unique_flag_first(
    const long long* __restrict__ slot_of, const long long* __restrict__ first,
    long long n, long long* __restrict__ is_first)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        is_first[i] = first[slot_of[i]] == i ? 1 : 0;
    }
}

// rank: inclusive scan of is_first. Overwrites first[slot] with the unique's index.
extern "C" __global__ void unique_emit(
    const long long* __restrict__ ids, const long long* __restrict__ slot_of,
    const long long* __restrict__ is_first, const long long* __restrict__ rank,
    const unsigned long long* __restrict__ count, long long n,
    long long* __restrict__ first, long long* __restrict__ uniques,
    long long* __restrict__ counts)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (is_first[i]) {
            const long long slot = slot_of[i];
            const long long index = rank[i] - 1;
            uniques[index] = ids[i];
            counts[index] = (long long)count[slot];
            first[slot] = index;
        }
    }
}

extern "C" __global__ void unique_inverse(
    const long long* __restrict__ slot_of, const long long* __restrict__ index_of_slot,
    long long n, long long* __restrict__ inverse)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        inverse[i] = index_of_slot[slot_of[i]];
    }
}

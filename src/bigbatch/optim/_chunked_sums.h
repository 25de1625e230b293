/* What the compiled CPU optimizer steps (_lars_kernel.c, _lamb_kernel.c) share: the cut of a list
 * of tensors into fixed chunks and cache-sized buckets, and squared norms summed in a fixed order.
 *
 * Every tensor is cut into CHUNK-element chunks by index, a chunk in blocks of BLOCK values and
 * fixed lanes (element i into lane i mod LANES), and the lanes, blocks and chunks are added in a
 * fixed order. So a norm is a pure function of the values: neither the memory alignment nor the
 * number of threads changes a bit. The kernels are built with -ffp-contract=off, so no
 * multiply-add is fused either, and the AVX2 clone of a loop gives the baseline one's bits.
 */

#ifndef BIGBATCH_CHUNKED_SUMS_H
#define BIGBATCH_CHUNKED_SUMS_H

#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define CHUNK 16384
#define BLOCK 1024
#define LANES 32

/* An AVX2 copy of the loops beside the baseline one, picked at load time: the same operations in
 * the same order (no FMA, see -ffp-contract=off), so the same bits from either. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define VECTORIZE __attribute__((target_clones("avx2", "default")))
#else
#define VECTORIZE
#endif

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Elements [start, stop) of tensor `tensor`; `slot` is where element `start` goes in a
 * bucket-sized scratch buffer (the chunk's offset within its bucket). */
typedef struct {
    int64_t tensor, start, stop, slot;
} Chunk;

/* Chunks of every tensor and the buckets they form: bounds[4b..4b+3] = c0, c1, t0, t1. */
typedef struct {
    Chunk *chunks;
    int64_t *bounds;
    int64_t buckets, total, widest; /* widest: the most elements in one bucket */
    double *partial;                /* `per_chunk` sums for each chunk */
} Plan;

static void free_plan(Plan *p) {
    free(p->chunks);
    free(p->bounds);
    free(p->partial);
}

/* Buckets of consecutive tensors of at most bucket_elements values (or one tensor). */
static int make_plan(const int64_t *numel, int64_t count, int64_t bucket_elements,
                     int64_t per_chunk, Plan *p) {
    int64_t total = 0;
    for (int64_t t = 0; t < count; t++) total += (numel[t] + CHUNK - 1) / CHUNK;
    p->chunks = malloc((size_t)(total + 1) * sizeof(Chunk));
    p->bounds = malloc((size_t)(4 * count + 4) * sizeof(int64_t));
    p->partial = malloc((size_t)(per_chunk * (total + 1)) * sizeof(double));
    p->buckets = 0;
    p->total = total;
    p->widest = 0;
    if (!p->chunks || !p->bounds || !p->partial) {
        free_plan(p);
        return -1;
    }
    int64_t c = 0, size = 0, *bound = p->bounds;
    bound[0] = bound[2] = 0;
    for (int64_t t = 0; t < count; t++) {
        if (t > 0 && size + numel[t] > bucket_elements) { /* close the bucket, open the next */
            bound[1] = bound[4] = c;
            bound[3] = bound[6] = t;
            bound += 4;
            p->buckets++;
            size = 0;
        }
        for (int64_t start = 0; start < numel[t]; start += CHUNK, c++) {
            p->chunks[c].tensor = t;
            p->chunks[c].start = start;
            p->chunks[c].stop = MIN(start + CHUNK, numel[t]);
            p->chunks[c].slot = size + start;
        }
        size += numel[t];
        p->widest = size > p->widest ? size : p->widest;
    }
    bound[1] = c;
    bound[3] = count;
    p->buckets += count > 0;
    return 0;
}

/* The first of the chunks [first, last) (one bucket's) that starts at or after element `goal`
 * of the bucket. */
static int64_t chunk_at(const Plan *p, int64_t first, int64_t last, int64_t goal) {
    while (first < last) {
        int64_t mid = first + (last - first) / 2;
        if (p->chunks[mid].slot < goal)
            first = mid + 1;
        else
            last = mid;
    }
    return first;
}

/* The calling thread's share [*lo, *hi) of one bucket's chunks [first, last): about as many
 * elements to each thread (a bucket mixes large tensors' full chunks with small tensors' short
 * ones), and the same share in every pass over the bucket, so that a second pass that walks its
 * share backwards finds the chunks it touched last still in this core's cache. */
static void thread_share(const Plan *p, int64_t first, int64_t last, int64_t *lo, int64_t *hi) {
#ifdef _OPENMP
    int64_t id = omp_get_thread_num(), n = omp_get_num_threads();
#else
    int64_t id = 0, n = 1;
#endif
    if (first >= last) {
        *lo = *hi = first;
        return;
    }
    const Chunk *end = &p->chunks[last - 1];
    int64_t size = end->slot + (end->stop - end->start);
    *lo = chunk_at(p, first, last, size * id / n);
    *hi = chunk_at(p, first, last, size * (id + 1) / n);
}

/* The first chunk of the tensor that chunk c belongs to. */
static int64_t first_chunk(const Plan *p, int64_t c) {
    while (c > 0 && p->chunks[c - 1].tensor == p->chunks[c].tensor) c--;
    return c;
}

/* The squares of values [base, base + m_) (one block, m_ <= BLOCK) summed in LANES fixed lanes
 * in the values' precision (at most BLOCK / LANES terms a lane), the lanes then added in order in
 * float64 into the caller's double sx_ (and sy_). BODY produces value k into `x` (with SUMS == 2
 * also `y`, whose squares go to sy_) and may write memory; it sees the names k, x, y, i_, j. */
#define BLOCK_SUMSQ(T, base, m_, SUMS, BODY)                                                   \
    do {                                                                                       \
        const int64_t start_ = (base), size_ = (m_);                                           \
        int64_t i_ = 0;                                                                        \
        T lane_x[LANES] = {0}, lane_y[LANES] = {0};                                            \
        for (; i_ + LANES <= size_; i_ += LANES)                                               \
            for (int j = 0; j < LANES; j++) {                                                  \
                int64_t k = start_ + i_ + j;                                                   \
                T x, y = 0;                                                                    \
                BODY;                                                                          \
                lane_x[j] += x * x;                                                            \
                if (SUMS == 2) lane_y[j] += y * y;                                             \
            }                                                                                  \
        for (int j = 0; i_ < size_; i_++, j++) {                                               \
            int64_t k = start_ + i_;                                                           \
            T x, y = 0;                                                                        \
            BODY;                                                                              \
            lane_x[j] += x * x;                                                                \
            if (SUMS == 2) lane_y[j] += y * y;                                                 \
        }                                                                                      \
        for (int j = 0; j < LANES; j++) sx_ += (double)lane_x[j];                              \
        if (SUMS == 2)                                                                         \
            for (int j = 0; j < LANES; j++) sy_ += (double)lane_y[j];                          \
    } while (0)

/* Blocks of BLOCK values (BLOCK_SUMSQ), the blocks added in order in float64 into OUT[0] (and
 * OUT[1]). */
#define BLOCKED_SUMSQ(T, n, SUMS, BODY, OUT)                                                   \
    double sx_ = 0.0, sy_ = 0.0;                                                               \
    for (int64_t base = 0; base < (n); base += BLOCK)                                          \
        BLOCK_SUMSQ(T, base, MIN((n) - base, BLOCK), SUMS, BODY);                              \
    (OUT)[0] = sx_;                                                                            \
    if (SUMS == 2) (OUT)[1] = sy_;

#endif

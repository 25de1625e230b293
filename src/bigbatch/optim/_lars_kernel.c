/* One LARS step (You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks", 2017,
 * Algorithm 1) over a list of dense float32 or float64 CPU tensors, in one pass over memory per
 * cache-sized bucket: the squared norms of a bucket's weights and gradients, then their update,
 * while the bucket is still in cache. Both norms are summed from the tensors as they are at the
 * call, whatever wrote them since the last step.
 *
 *     λ = η‖w‖ / (‖g‖ + β‖w‖ + eps), λ = 1 if ‖w‖ = 0 or ‖g‖ = 0 (or lars = 0); clip: min(λ, 1)
 *     v ← m·v + γλ·g + γλβ·w;   w ← w − v   (Nesterov: w ← w − (m·v + γλ·g + γλβ·w))
 *
 * The norms are a pure function of the values (fixed chunks, blocks and lanes by index, added in
 * a fixed order: _chunked_sums.h): neither the memory alignment nor the number of threads
 * changes a bit. Built with -ffp-contract=off, so no multiply-add is fused either.
 *
 * Called through ctypes (bigbatch.optim.lars_kernel); no Python or torch headers needed.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "_chunked_sums.h"

typedef struct {
    double lr, momentum, weight_decay, trust_coefficient, eps;
    int32_t clip, nesterov, lars, threads;
    int64_t bucket_elements;
} LarsOptions;

/* λ of the tensor whose chunks start at chunk c: ‖w‖² and ‖g‖² from its chunks, added in chunk
 * order. */
static double trust_ratio(const Plan *p, int64_t c, const LarsOptions *o) {
    int64_t t = p->chunks[c].tensor;
    double ws = 0.0, gs = 0.0;
    for (; c < p->total && p->chunks[c].tensor == t; c++) {
        ws += p->partial[2 * c];
        gs += p->partial[2 * c + 1];
    }
    double wn = sqrt(ws), gn = sqrt(gs), r = 1.0;
    if (wn > 0.0 && gn > 0.0) r = o->trust_coefficient * wn / (gn + o->weight_decay * wn + o->eps);
    if (o->clip && r > 1.0) r = 1.0;
    return r;
}

#define DEFINE_KERNELS(T, SUFFIX)                                                              \
    /* ‖w‖² and ‖g‖² of one chunk into sums[0..1], in one pass over both. */                   \
    VECTORIZE static void sumsq_##SUFFIX(const T *w, const T *g, int64_t n, double *sums) {    \
        BLOCKED_SUMSQ(T, n, 2, x = w[k]; y = g[k], sums)                                       \
    }                                                                                          \
                                                                                               \
    /* v ← m·v + cg·g + cw·w; w ← w − v. */                                                    \
    VECTORIZE static void update_##SUFFIX(T *w, const T *g, T *v, int64_t n, T m, T cg, T cw) {\
        for (int64_t k = 0; k < n; k++) {                                                      \
            T vk = m * v[k] + cg * g[k] + cw * w[k];                                           \
            v[k] = vk;                                                                         \
            w[k] = w[k] - vk;                                                                  \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    /* Nesterov: v ← m·v + d; w ← w − (m·v + d), d = cg·g + cw·w. */                           \
    VECTORIZE static void nesterov_##SUFFIX(T *w, const T *g, T *v, int64_t n, T m, T cg,      \
                                              T cw) {                                          \
        for (int64_t k = 0; k < n; k++) {                                                      \
            T d = cg * g[k] + cw * w[k];                                                       \
            T vk = m * v[k] + d;                                                               \
            v[k] = vk;                                                                         \
            w[k] = w[k] - (m * vk + d);                                                        \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    /* The step, bucket by bucket: the chunks' norms (each thread its share; one barrier),     \
     * then the update of the same share walked backwards (thread_share), each thread working  \
     * out the ratio of the tensors its chunks belong to (the same sum in the same order       \
     * whichever thread it is). */                                                             \
    int lars_step_##SUFFIX(T **w, T **g, T **v, const int64_t *numel, int64_t count,           \
                           const LarsOptions *o, T *ratios_out) {                              \
        Plan p;                                                                                \
        if (make_plan(numel, count, o->bucket_elements, 2, &p) != 0) return -1;                \
        if (o->lars)                                                                           \
            for (int64_t t = 0; t < count; t++) ratios_out[t] = (T)1; /* empty tensors */      \
        _Pragma("omp parallel num_threads(o->threads)")                                        \
        {                                                                                      \
            for (int64_t b = 0; b < p.buckets; b++) {                                          \
                const int64_t *bound = &p.bounds[4 * b];                                       \
                int64_t lo, hi;                                                                \
                thread_share(&p, bound[0], bound[1], &lo, &hi);                                \
                if (o->lars) {                                                                 \
                    for (int64_t c = lo; c < hi; c++) {                                        \
                        const Chunk *k = &p.chunks[c];                                         \
                        sumsq_##SUFFIX(w[k->tensor] + k->start, g[k->tensor] + k->start,       \
                                       k->stop - k->start, &p.partial[2 * c]);                 \
                    }                                                                          \
                    _Pragma("omp barrier")                                                     \
                }                                                                              \
                int64_t tensor = -1, first = -1;                                               \
                T cg = (T)o->lr, ratio = (T)1;                                                 \
                for (int64_t c = hi - 1; c >= lo; c--) {                                       \
                    const Chunk *k = &p.chunks[c];                                             \
                    int64_t t = k->tensor, n = k->stop - k->start;                             \
                    if (o->lars && t != tensor) {                                              \
                        first = first_chunk(&p, c);                                            \
                        ratio = (T)trust_ratio(&p, first, o);                                  \
                        cg = ratio * (T)o->lr;                                                 \
                        tensor = t;                                                            \
                    }                                                                          \
                    if (o->lars && c == first) ratios_out[t] = ratio;                          \
                    T cw = cg * (T)o->weight_decay;                                            \
                    (o->nesterov ? nesterov_##SUFFIX : update_##SUFFIX)(                       \
                        w[t] + k->start, g[t] + k->start, v[t] + k->start, n, (T)o->momentum,  \
                        cg, cw);                                                               \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        free_plan(&p);                                                                         \
        return 0;                                                                              \
    }

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)

/* One LAMB step (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
 * Minutes", ICLR 2020, Algorithm 2, φ the identity) over a list of dense float32 or float64 CPU
 * tensors, bucket by cache-sized bucket in two passes:
 *
 *   1. the moments and the Adam update with weight decay, and both squared norms, per chunk:
 *        m ← β₁·m + (1 − β₁)·g   (as torch.lerp)      v ← β₂·v + (1 − β₂)·g·g
 *        u = (m · (1/(1 − β₁ᵗ))) / (√v · (1/√(1 − β₂ᵗ)) + ε) + λ·x   into a bucket-sized scratch
 *        ‖x‖², ‖u‖²  (summed block by block, right after the block's u is written)
 *   2. x ← x + c·u with c = −η·‖x‖/‖u‖ (−η if a norm is 0), each thread walking its chunks of
 *      pass 1 backwards, so that u and x come back from cache where they still are.
 *
 * A group without adaptation (`adapt` = 0) takes one pass, x ← x + (−η)·u. The operations are
 * the eager step's (bigbatch.optim.lamb), in its order, with one division an element (the bias
 * corrections are multiplied by their reciprocals in both); the two differ in the last bits
 * only: the norms sum in another order, PyTorch's vectorized loops fuse some multiply-adds, and
 * its CPU square root is not always correctly rounded (this one is).
 * The norms are a pure function of the values (fixed chunks, blocks and lanes by index, added in
 * a fixed order: _chunked_sums.h): neither the memory alignment nor the number of threads
 * changes a bit. Built with -ffp-contract=off (no fused multiply-add) and -fno-math-errno (so
 * that sqrt vectorizes; it is correctly rounded either way).
 *
 * Called through ctypes (bigbatch.optim.lamb_kernel); no Python or torch headers needed.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "_chunked_sums.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int32_t adapt, threads;
    int64_t bucket_elements;
    /* The caller's scratch of scratch_elements values, kept from step to step (NULL: one is
     * allocated for the step; a fresh allocation of megabytes costs a page fault a page). */
    void *scratch;
    int64_t scratch_elements;
} LambOptions;

/* The ratio ‖x‖/‖u‖ of the tensor whose chunks start at chunk c, its chunks' sums added in
 * order; 1 where either norm is 0. */
static double trust_ratio(const Plan *p, int64_t c) {
    int64_t t = p->chunks[c].tensor;
    double xs = 0.0, us = 0.0;
    for (; c < p->total && p->chunks[c].tensor == t; c++) {
        xs += p->partial[2 * c];
        us += p->partial[2 * c + 1];
    }
    double xn = sqrt(xs), un = sqrt(us);
    return xn > 0.0 && un > 0.0 ? xn / un : 1.0;
}

/* The per-tensor constants of u, in the tensors' precision as the eager step has them. */
#define ADAM_CONSTANTS(T, o, bc1, bc2)                                                         \
    const T w1 = (T)(1.0 - (o)->beta1), b2 = (T)(o)->beta2, w2 = (T)(1.0 - (o)->beta2);        \
    const T eps = (T)(o)->eps, wd = (T)(o)->weight_decay, one = (T)1;                          \
    const T r1 = (T)(1.0 / (bc1)), r2 = (T)(1.0 / (bc2));                                      \
    const int small = w1 < (T)0.5, decay = (o)->weight_decay != 0.0;

/* u of element k of weights W (m and v updated in place); torch.lerp's two forms by the
 * weight's size. */
#define ADAM_UPDATE(T, SQRT, W, k)                                                             \
    T gk = g[k], mk = m[k];                                                                    \
    mk = small ? mk + w1 * (gk - mk) : gk - (gk - mk) * (one - w1);                            \
    m[k] = mk;                                                                                 \
    T vk = b2 * v[k] + w2 * gk * gk;                                                           \
    v[k] = vk;                                                                                 \
    T u = mk * r1 / (SQRT(vk) * r2 + eps);                                                     \
    if (decay) u = u + wd * W[k];

#define DEFINE_KERNELS(T, SUFFIX, SQRT)                                                        \
    /* Pass 1 over one chunk: moments, u into `out`, ‖x‖² and ‖u‖² into sums[0..1], block by  \
     * block (the block's x and u summed while they are in the first-level cache). */          \
    VECTORIZE static void moments_##SUFFIX(const T *w, const T *g, T *m, T *v, T *out,         \
                                           int64_t n, const LambOptions *o, double bc1,        \
                                           double bc2, double *sums) {                         \
        ADAM_CONSTANTS(T, o, bc1, bc2)                                                         \
        double sx_ = 0.0, sy_ = 0.0;                                                           \
        for (int64_t base = 0; base < n; base += BLOCK) {                                      \
            int64_t size = MIN(n - base, BLOCK);                                               \
            for (int64_t k = base; k < base + size; k++) {                                     \
                ADAM_UPDATE(T, SQRT, w, k)                                                     \
                out[k] = u;                                                                    \
            }                                                                                  \
            BLOCK_SUMSQ(T, base, size, 2, x = w[k]; y = out[k]);                               \
        }                                                                                      \
        sums[0] = sx_;                                                                         \
        sums[1] = sy_;                                                                         \
    }                                                                                          \
                                                                                               \
    /* Pass 2: x ← x + c·u. */                                                                 \
    VECTORIZE static void apply_##SUFFIX(T *x, const T *u, int64_t n, T c) {                   \
        for (int64_t k = 0; k < n; k++) x[k] = x[k] + u[k] * c;                                \
    }                                                                                          \
                                                                                               \
    /* Without adaptation, one pass: x ← x + (−η)·u. */                                        \
    VECTORIZE static void direct_##SUFFIX(T *x, const T *g, T *m, T *v, int64_t n,             \
                                          const LambOptions *o, double bc1, double bc2) {      \
        ADAM_CONSTANTS(T, o, bc1, bc2)                                                         \
        const T c = (T)(-o->lr);                                                               \
        for (int64_t k = 0; k < n; k++) {                                                      \
            ADAM_UPDATE(T, SQRT, x, k)                                                         \
            x[k] = x[k] + c * u;                                                               \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    /* The step, bucket by bucket: pass 1 over the bucket's chunks (shared among the threads;  \
     * one barrier), then pass 2, each thread working out the ratio of the tensors its chunks  \
     * belong to (the same sum in the same order whichever thread it is). Two scratch buffers  \
     * by the bucket's parity: a thread may start the next bucket's pass 1 while another still \
     * reads this one's u. bc1[t] = 1 − β₁ᵗ, bc2[t] = √(1 − β₂ᵗ) of tensor t's step count. */  \
    int lamb_step_##SUFFIX(T **x, T **g, T **m, T **v, const int64_t *numel, int64_t count,    \
                           const LambOptions *o, const double *bc1, const double *bc2) {       \
        Plan p;                                                                                \
        if (make_plan(numel, count, o->bucket_elements, 2, &p) != 0) return -1;                \
        int64_t needed = 2 * p.widest + 1;                                                     \
        int own = o->adapt && (!o->scratch || o->scratch_elements < needed);                   \
        T *scratch = own ? malloc((size_t)needed * sizeof(T)) : (T *)o->scratch;               \
        if (o->adapt && !scratch) {                                                            \
            free_plan(&p);                                                                     \
            return -1;                                                                         \
        }                                                                                      \
        _Pragma("omp parallel num_threads(o->threads)")                                        \
        {                                                                                      \
            for (int64_t b = 0; b < p.buckets; b++) {                                          \
                const int64_t *bound = &p.bounds[4 * b];                                       \
                if (!o->adapt) {                                                               \
                    _Pragma("omp for schedule(static) nowait")                                 \
                    for (int64_t c = bound[0]; c < bound[1]; c++) {                            \
                        const Chunk *k = &p.chunks[c];                                         \
                        int64_t t = k->tensor, s = k->start;                                   \
                        direct_##SUFFIX(x[t] + s, g[t] + s, m[t] + s, v[t] + s,                \
                                        k->stop - s, o, bc1[t], bc2[t]);                       \
                    }                                                                          \
                    continue;                                                                  \
                }                                                                              \
                T *u = scratch + (b % 2) * p.widest;                                           \
                int64_t lo, hi;                                                                \
                thread_share(&p, bound[0], bound[1], &lo, &hi);                                \
                for (int64_t c = lo; c < hi; c++) {                                            \
                    const Chunk *k = &p.chunks[c];                                             \
                    int64_t t = k->tensor, s = k->start;                                       \
                    moments_##SUFFIX(x[t] + s, g[t] + s, m[t] + s, v[t] + s, u + k->slot,      \
                                     k->stop - s, o, bc1[t], bc2[t], &p.partial[2 * c]);       \
                }                                                                              \
                _Pragma("omp barrier")                                                         \
                int64_t tensor = -1;                                                           \
                T coef = (T)0;                                                                 \
                for (int64_t c = hi - 1; c >= lo; c--) {                                       \
                    const Chunk *k = &p.chunks[c];                                             \
                    int64_t t = k->tensor;                                                     \
                    if (t != tensor) {                                                         \
                        T ratio = (T)trust_ratio(&p, first_chunk(&p, c));                      \
                        coef = ratio * (T)(-o->lr);                                            \
                        tensor = t;                                                            \
                    }                                                                          \
                    apply_##SUFFIX(x[t] + k->start, u + k->slot, k->stop - k->start, coef);    \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        if (own) free(scratch);                                                                \
        free_plan(&p);                                                                         \
        return 0;                                                                              \
    }

DEFINE_KERNELS(float, f32, sqrtf)
DEFINE_KERNELS(double, f64, sqrt)

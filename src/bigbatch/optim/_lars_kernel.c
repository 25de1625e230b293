/* One LARS step (You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks", 2017,
 * Algorithm 1) over a list of dense float32 or float64 CPU tensors, in one pass over memory per
 * cache-sized bucket: the squared norms of a bucket's weights and gradients, then their update,
 * while the bucket is still in cache.
 *
 *     λ = η‖w‖ / (‖g‖ + β‖w‖ + eps), λ = 1 if ‖w‖ = 0 or ‖g‖ = 0 (or lars = 0); clip: min(λ, 1)
 *     v ← m·v + γλ·g + γλβ·w;   w ← w − v   (Nesterov: w ← w − (m·v + γλ·g + γλβ·w))
 *
 * The norms are a pure function of the values: every tensor is cut into CHUNK-element chunks by
 * index, a chunk in blocks and fixed lanes (element i into lane i mod LANES) and the lanes, blocks
 * and chunks are added in a fixed order. Neither the memory alignment nor the number
 * of threads changes a bit. Built with -ffp-contract=off, so no multiply-add is fused either.
 *
 * Called through ctypes (bigbatch.optim.lars_kernel); no Python or torch headers needed.
 */

#include <math.h>
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

typedef struct {
    double lr, momentum, weight_decay, trust_coefficient, eps;
    int32_t clip, nesterov, lars, threads;
    int64_t bucket_elements;
} LarsOptions;

typedef struct {
    int64_t tensor, start, stop;
} Chunk;

/* Chunks of every tensor and the buckets they form: bounds[4b..4b+3] = c0, c1, t0, t1. */
typedef struct {
    Chunk *chunks;
    int64_t *bounds;
    int64_t buckets;
    double *partial; /* per chunk: ‖w‖², ‖g‖² of its elements */
    double *ratio;   /* per tensor: ‖w‖², then λ */
    double *grad_sq; /* per tensor: ‖g‖² */
} Plan;

static void free_plan(Plan *p) {
    free(p->chunks);
    free(p->bounds);
    free(p->partial);
    free(p->ratio);
    free(p->grad_sq);
}

static int make_plan(const int64_t *numel, int64_t count, int64_t bucket_elements, Plan *p) {
    int64_t total = 0;
    for (int64_t t = 0; t < count; t++) total += (numel[t] + CHUNK - 1) / CHUNK;
    p->chunks = malloc((size_t)(total + 1) * sizeof(Chunk));
    p->bounds = malloc((size_t)(4 * count + 4) * sizeof(int64_t));
    p->partial = malloc((size_t)(2 * total + 2) * sizeof(double));
    p->ratio = malloc((size_t)(count + 1) * sizeof(double));
    p->grad_sq = malloc((size_t)(count + 1) * sizeof(double));
    p->buckets = 0;
    if (!p->chunks || !p->bounds || !p->partial || !p->ratio || !p->grad_sq) {
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
        size += numel[t];
        for (int64_t start = 0; start < numel[t]; start += CHUNK, c++) {
            p->chunks[c].tensor = t;
            p->chunks[c].start = start;
            p->chunks[c].stop = start + CHUNK < numel[t] ? start + CHUNK : numel[t];
        }
    }
    bound[1] = c;
    bound[3] = count;
    p->buckets += count > 0;
    return 0;
}

/* λ of tensors [t0, t1) from the squared norms of chunks [c0, c1), added in chunk order. */
static void trust_ratios(const Plan *p, const int64_t *bound, const LarsOptions *o) {
    for (int64_t t = bound[2]; t < bound[3]; t++) p->ratio[t] = p->grad_sq[t] = 0.0;
    for (int64_t c = bound[0]; c < bound[1]; c++) {
        p->ratio[p->chunks[c].tensor] += p->partial[2 * c];
        p->grad_sq[p->chunks[c].tensor] += p->partial[2 * c + 1];
    }
    for (int64_t t = bound[2]; t < bound[3]; t++) {
        double wn = sqrt(p->ratio[t]), gn = sqrt(p->grad_sq[t]), r = 1.0;
        if (wn > 0.0 && gn > 0.0)
            r = o->trust_coefficient * wn / (gn + o->weight_decay * wn + o->eps);
        if (o->clip && r > 1.0) r = 1.0;
        p->ratio[t] = r;
    }
}

/* ‖w‖² and ‖g‖² of n values: blocks of BLOCK values, each summed in LANES fixed lanes in the
 * values' precision (at most BLOCK / LANES terms a lane), the lanes and blocks added in order in
 * float64. */
#define DEFINE_SUMSQ(T, SUFFIX)                                                                \
    VECTORIZE static void sumsq2_##SUFFIX(const T *w, const T *g, int64_t n, double *out) {    \
        double sw = 0.0, sg = 0.0;                                                             \
        for (int64_t base = 0; base < n; base += BLOCK) {                                      \
            int64_t m = n - base < BLOCK ? n - base : BLOCK, i = 0;                            \
            const T *x = w + base, *y = g + base;                                              \
            T a[LANES] = {0}, b[LANES] = {0};                                                  \
            for (; i + LANES <= m; i += LANES)                                                 \
                for (int j = 0; j < LANES; j++) {                                              \
                    a[j] += x[i + j] * x[i + j];                                               \
                    b[j] += y[i + j] * y[i + j];                                               \
                }                                                                              \
            for (int j = 0; i < m; i++, j++) {                                                 \
                a[j] += x[i] * x[i];                                                           \
                b[j] += y[i] * y[i];                                                           \
            }                                                                                  \
            for (int j = 0; j < LANES; j++) {                                                  \
                sw += (double)a[j];                                                            \
                sg += (double)b[j];                                                            \
            }                                                                                  \
        }                                                                                      \
        out[0] = sw;                                                                           \
        out[1] = sg;                                                                           \
    }

/* v ← m·v + cg·g + cw·w; w ← w − v (Nesterov: w ← w − (m·v + cg·g + cw·w)). */
#define DEFINE_UPDATE(T, SUFFIX)                                                               \
    VECTORIZE static void update_##SUFFIX(T *w, const T *g, T *v, int64_t n, T m, T cg, T cw,           \
                                int nesterov) {                                                \
        if (nesterov) {                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                  \
                T step = cg * g[i] + cw * w[i];                                                \
                T vi = m * v[i] + step;                                                        \
                v[i] = vi;                                                                     \
                w[i] = w[i] - (m * vi + step);                                                 \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            T vi = m * v[i] + cg * g[i] + cw * w[i];                                           \
            v[i] = vi;                                                                         \
            w[i] = w[i] - vi;                                                                  \
        }                                                                                      \
    }

/* The step: per bucket, the chunks' norms (shared among threads), the ratios, the update.
 * Static schedules give a thread the same chunks in both loops, still in its cache. */
#define DEFINE_STEP(T, SUFFIX)                                                                 \
    int lars_step_##SUFFIX(T **w, T **g, T **v, const int64_t *numel, int64_t count,           \
                           const LarsOptions *o, T *ratios_out) {                              \
        Plan p;                                                                                \
        if (make_plan(numel, count, o->bucket_elements, &p) != 0) return -1;                   \
        _Pragma("omp parallel num_threads(o->threads)")                                        \
        for (int64_t b = 0; b < p.buckets; b++) {                                              \
            const int64_t *bound = &p.bounds[4 * b];                                           \
            if (o->lars) {                                                                     \
                _Pragma("omp for schedule(static)")                                            \
                for (int64_t c = bound[0]; c < bound[1]; c++) {                                \
                    const Chunk *k = &p.chunks[c];                                             \
                    sumsq2_##SUFFIX(w[k->tensor] + k->start, g[k->tensor] + k->start,          \
                                    k->stop - k->start, &p.partial[2 * c]);                    \
                }                                                                              \
                _Pragma("omp single")                                                          \
                {                                                                              \
                    trust_ratios(&p, bound, o);                                                \
                    for (int64_t t = bound[2]; t < bound[3]; t++)                              \
                        ratios_out[t] = (T)p.ratio[t];                                         \
                }                                                                              \
            }                                                                                  \
            _Pragma("omp for schedule(static)")                                                \
            for (int64_t c = bound[0]; c < bound[1]; c++) {                                    \
                const Chunk *k = &p.chunks[c];                                                 \
                int64_t t = k->tensor;                                                         \
                T cg = (o->lars ? (T)p.ratio[t] : (T)1) * (T)o->lr;                            \
                T cw = cg * (T)o->weight_decay;                                                \
                update_##SUFFIX(w[t] + k->start, g[t] + k->start, v[t] + k->start,             \
                                k->stop - k->start, (T)o->momentum, cg, cw, o->nesterov);      \
            }                                                                                  \
        }                                                                                      \
        free_plan(&p);                                                                         \
        return 0;                                                                              \
    }

DEFINE_SUMSQ(float, f32)
DEFINE_SUMSQ(double, f64)
DEFINE_UPDATE(float, f32)
DEFINE_UPDATE(double, f64)
DEFINE_STEP(float, f32)
DEFINE_STEP(double, f64)

// optim.cu: segment-sum + optimizer update in one pass (evdb/kernels/reference/optim.py).
//
// Memory layout: grads (m, dim) float32; positions (m,) int64 grouped by key; bounds (u + 1,)
// int64; rows (u,) int64 (-1: skipped); values (R, dim) and slots (R, n_slots) float32, C
// order. kind and the scalars h0..h3 (= hyper[0:4]) are the reference's table; the slot
// blocks per kind are as documented there.
//
// One group of G lanes per distinct key u. The rows are distinct, so groups never touch the
// same row: no atomics. Each lane sums its columns of the gradient over the key's positions
// into float64 shared memory, then the rule runs element by element in float64 (the
// reference's precision) and stores float32. Rules that need a row norm (group lasso, group
// FTRL, row-wise Adagrad) keep their float64 intermediates in shared memory too, reduce over
// the group, then finish. Shared memory per group: 3 * dim doubles (gpu.py sizes the block).
#include "common.cuh"

#define EVDB_SGD 0
#define EVDB_ADAGRAD 1
#define EVDB_ADAM 2
#define EVDB_FTRL 3
#define EVDB_GROUP_FTRL 4
#define EVDB_ADAGRAD_DECAY 5
#define EVDB_ROWWISE_ADAGRAD 6

__device__ __forceinline__ double evdb_ftrl_power(double n, double lr_power) {
    return lr_power == -0.5 ? sqrt(n) : pow(n, -lr_power);
}

// Proximal step of the group lasso on the float64 row w (Yuan & Lin 2006).
__device__ __forceinline__ void evdb_group_lasso(const EvdbGroup& g, double* w, i64 dim,
                                                 double lr, double strength) {
    if (strength == 0.0) return;
    double sq = 0.0;
    for (i64 c = g.lane; c < dim; c += g.size) sq += w[c] * w[c];
    double norm = sqrt(evdb_group_sum(g, sq));
    double shrink = norm > 0.0 ? fmax(0.0, 1.0 - lr * strength / norm) : 0.0;
    for (i64 c = g.lane; c < dim; c += g.size) w[c] *= shrink;
}

extern "C" __global__ void segment_sum_apply(const float* __restrict__ grads, i64 dim,
                                             const i64* __restrict__ positions,
                                             const i64* __restrict__ bounds,
                                             const i64* __restrict__ rows, i64 u, int kind,
                                             double h0, double h1, double h2, double h3,
                                             float* __restrict__ values,
                                             float* __restrict__ slots, i64 n_slots,
                                             int group_size) {
    extern __shared__ double evdb_shared[];
    EvdbGroup g = evdb_group(group_size);
    if (g.id >= u || rows[g.id] < 0) return;  // whole groups leave together
    double* gs = evdb_shared + (i64)(threadIdx.x / group_size) * 3 * dim;  // summed gradient
    double* w = gs + dim;                                                  // new value
    double* aux = w + dim;                                                 // n of group FTRL
    i64 r = rows[g.id];
    float* v = values + r * dim;
    float* s = slots + r * n_slots;
    for (i64 c = g.lane; c < dim; c += g.size) {
        double acc = 0.0;
        for (i64 k = bounds[g.id]; k < bounds[g.id + 1]; ++k) acc += grads[positions[k] * dim + c];
        gs[c] = acc;
        w[c] = v[c];
    }
    double lr = h0, lasso = 0.0;
    if (kind == EVDB_SGD) {
        double wd = h1;
        lasso = h2;
        for (i64 c = g.lane; c < dim; c += g.size) w[c] = w[c] - lr * (gs[c] + wd * w[c]);
    } else if (kind == EVDB_ADAGRAD) {  // torch.optim.Adagrad
        double eps = h1, wd = h2;
        lasso = h3;
        for (i64 c = g.lane; c < dim; c += g.size) {
            double gc = gs[c] + wd * w[c];
            double acc = (double)s[c] + gc * gc;
            s[c] = (float)acc;
            w[c] = w[c] - lr * gc / (sqrt(acc) + eps);
        }
    } else if (kind == EVDB_ADAM) {  // lazy Adam; h0 is the bias-corrected step size
        double b1 = h1, b2 = h2, eps = h3;
        for (i64 c = g.lane; c < dim; c += g.size) {
            double m = b1 * s[c] + (1.0 - b1) * gs[c];
            double vv = b2 * s[dim + c] + (1.0 - b2) * gs[c] * gs[c];
            s[c] = (float)m;
            s[dim + c] = (float)vv;
            w[c] = w[c] - lr * m / (sqrt(vv) + eps);
        }
    } else if (kind == EVDB_FTRL || kind == EVDB_GROUP_FTRL) {  // TF ApplyFtrl; DeepRec group
        double lr_power = h1, l1 = h2, l2 = h3, zsq = 0.0;
        for (i64 c = g.lane; c < dim; c += g.size) {
            double n = s[c], n_new = n + gs[c] * gs[c];
            double sigma = (evdb_ftrl_power(n_new, lr_power) - evdb_ftrl_power(n, lr_power)) / lr;
            double z = (double)s[dim + c] + gs[c] - sigma * w[c];
            s[c] = (float)n_new;
            s[dim + c] = (float)z;
            double quad = evdb_ftrl_power(n_new, lr_power) / lr + 2.0 * l2;
            if (kind == EVDB_FTRL) {
                w[c] = fabs(z) > l1 ? ((z > 0.0 ? l1 : -l1) - z) / quad : 0.0;
            } else {
                w[c] = z;  // finished below, once |z| of the whole row is known
                aux[c] = quad;
                zsq += z * z;
            }
        }
        if (kind == EVDB_GROUP_FTRL) {
            double zn = sqrt(evdb_group_sum(g, zsq));
            for (i64 c = g.lane; c < dim; c += g.size)
                w[c] = zn > l1 ? (l1 * w[c] / zn - w[c]) / aux[c] : 0.0;
        }
    } else if (kind == EVDB_ADAGRAD_DECAY) {  // DeepRec AdagradDecayV2
        double decay_now = h1, rate = h2, init_acc = h3;
        for (i64 c = g.lane; c < dim; c += g.size) {
            double acc = s[c];
            if (decay_now != 0.0) acc = fmax(acc * rate, init_acc);
            acc += gs[c] * gs[c];
            s[c] = (float)acc;
            w[c] = w[c] - lr * gs[c] / sqrt(acc);
        }
    } else {  // row-wise Adagrad (FBGEMM): one accumulator per row, of the mean of g^2
        double eps = h1, sq = 0.0, acc = s[0];  // every lane reads s[0] before the sum...
        for (i64 c = g.lane; c < dim; c += g.size) sq += gs[c] * gs[c];
        acc += evdb_group_sum(g, sq) / (double)dim;
        if (g.lane == 0) s[0] = (float)acc;  // ...which waits for them all, then lane 0 writes
        for (i64 c = g.lane; c < dim; c += g.size) w[c] = w[c] - lr * gs[c] / (sqrt(acc) + eps);
    }
    evdb_group_lasso(g, w, dim, lr, lasso);
    for (i64 c = g.lane; c < dim; c += g.size) v[c] = (float)w[c];
}

/* ds41 kernels: elementary functions, RMSNorm, RoPE tables (spec 3.0, 3.6; exact-mode.md).
 *
 * Exact mode evaluates every transcendental in double from the FP32 input and rounds once to
 * FP32, so any implementation of the contract with a correctly rounding (or nearly so) double
 * libm agrees bit for bit. Fast mode uses the FP32 library functions. */
#include "kernels.h"
#include "formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- elementary functions */

float ds41_expf_x(const ds41_ctx *ctx, float x) {
    if (ctx && !ctx->exact) return expf(x);
    return (float)exp((double)x);
}

float ds41_sigmoid_x(const ds41_ctx *ctx, float x) {
    if (ctx && !ctx->exact) return 1.0f / (1.0f + expf(-x));
    return (float)(1.0 / (1.0 + exp(-(double)x)));
}

float ds41_silu_x(const ds41_ctx *ctx, float x) {
    if (ctx && !ctx->exact) return x / (1.0f + expf(-x));
    return (float)((double)x / (1.0 + exp(-(double)x)));
}

float ds41_softplus_x(const ds41_ctx *ctx, float x) {
    /* The threshold test is on the FP32 input in both modes (torch's softplus, beta 1). */
    if (x > 20.0f) return x;
    if (ctx && !ctx->exact) return log1pf(expf(x));
    return (float)log1p(exp((double)x));
}

float ds41_rsqrt_x(const ds41_ctx *ctx, float x) {
    /* One operation: not an FP32 sqrt followed by an FP32 divide (that rounds twice). */
    if (ctx && !ctx->exact) return 1.0f / sqrtf(x);
    return (float)(1.0 / sqrt((double)x));
}

/* ---------------------------------------------------------------- RMSNorm */

typedef struct rms_job {
    const ds41_ctx *ctx;
    const float *x;
    const uint16_t *w;
    int d;
    float eps;
    float *y;
} rms_job;

static void rms_rows(void *arg, int t0, int t1) {
    const rms_job *j = arg;
    const int d = j->d;
    for (int t = t0; t < t1; t++) {
        const float *x = j->x + (size_t)t * d;
        float *y = j->y + (size_t)t * d;
        float mean;
        if (j->ctx->exact) {
            /* The squares are FP32 values the reference materialises; their sum is a
             * reduction (double, rounded once), the mean a double division. */
            double s = 0.0;
            for (int k = 0; k < d; k++) s += (double)(x[k] * x[k]);
            mean = (float)(s / (double)d);
        } else {
            float s = 0.0f;
            for (int k = 0; k < d; k++) s += x[k] * x[k];
            mean = s / (float)d;
        }
        float r = ds41_rsqrt_x(j->ctx, mean + j->eps);
        for (int k = 0; k < d; k++) y[k] = ds41_bf16_round(ds41_bf16_to_f32(j->w[k]) * (x[k] * r));
    }
}

void ds41_rmsnorm(const ds41_ctx *ctx, const float *x, const uint16_t *w, int T, int d, float eps, float *y) {
    rms_job j = { ctx, x, w, d, eps, y };
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_NORM, 0);
    /* Rows are independent, so threading over rows cannot change any result. */
    if ((long long)T * d >= 65536) ds41_parallel_for(ctx, T, rms_rows, &j);
    else rms_rows(&j, 0, T);
    if (ctx->bd) ds41_bd_leave(ctx);
}

/* ---------------------------------------------------------------- RoPE */

int ds41_rope_init(ds41_rope *r, const ds41_config *cfg, float theta, int yarn, int max_pos, ds41_err *err) {
    memset(r, 0, sizeof *r);
    int d = cfg->rope_dim;
    if (d <= 0 || d % 2 || d / 2 > (int)(sizeof r->inv / sizeof r->inv[0]))
        return ds41_errf(err, "rope: rope dim %d must be even and at most %d", d,
                         2 * (int)(sizeof r->inv / sizeof r->inv[0]));
    if (max_pos <= 0) return ds41_errf(err, "rope: max_pos %d must be positive", max_pos);
    if (!(theta > 0.0f)) return ds41_errf(err, "rope: theta %g must be positive", (double)theta);
    int half = d / 2;
    r->d = d;
    r->max_pos = max_pos;
    for (int j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)d;                 /* FP32 division */
        float pw = (float)pow((double)theta, (double)e);      /* pow in double, rounded once */
        r->inv[j] = 1.0f / pw;                                /* FP32 reciprocal */
    }
    if (yarn && cfg->original_seq_len > 0) {
        /* corrected dims in double (Python floats in the reference) */
        double L0 = (double)cfg->original_seq_len, lt = log((double)theta);
        double c_fast = (double)d * log(L0 / ((double)cfg->beta_fast * 2.0 * M_PI)) / (2.0 * lt);
        double c_slow = (double)d * log(L0 / ((double)cfg->beta_slow * 2.0 * M_PI)) / (2.0 * lt);
        double lowd = floor(c_fast), highd = ceil(c_slow);
        long long low = lowd > 0 ? (long long)lowd : 0;
        long long high = highd < d - 1 ? (long long)highd : d - 1;
        /* max(high - low, 1e-3): an integer unless the band is empty */
        float den = (high - low) > 0 ? (float)(high - low) : 0.001f;
        float F = cfg->rope_factor;
        for (int j = 0; j < half; j++) {
            float ramp = ((float)j - (float)low) / den;
            if (ramp < 0.0f) ramp = 0.0f;
            if (ramp > 1.0f) ramp = 1.0f;
            float smooth = 1.0f - ramp;
            float inv = r->inv[j];
            r->inv[j] = ((inv / F) * (1.0f - smooth)) + (inv * smooth);
        }
    }
    uint64_t n;
    if (ds41_mul_u64((uint64_t)max_pos, (uint64_t)half, &n) || n > ((uint64_t)1 << 40))
        return ds41_errf(err, "rope: table of %d positions x %d pairs is too large", max_pos, half);
    r->cos = malloc(n * sizeof(float));
    r->sin = malloc(n * sizeof(float));
    if (!r->cos || !r->sin) {
        ds41_rope_free(r);
        return ds41_errf(err, "rope: out of memory for %d positions", max_pos);
    }
    for (int p = 0; p < max_pos; p++) {
        float fp = (float)p;
        for (int j = 0; j < half; j++) {
            float a = fp * r->inv[j];                         /* one FP32 multiply */
            r->cos[(size_t)p * half + j] = (float)cos((double)a);
            r->sin[(size_t)p * half + j] = (float)sin((double)a);
        }
    }
    return 0;
}

void ds41_rope_free(ds41_rope *r) {
    if (!r) return;
    free(r->cos);
    free(r->sin);
    r->cos = r->sin = NULL;
}

void ds41_rope_apply(const ds41_rope *r, float *x, int pos, int inverse) {
    int half = r->d / 2;
    if (pos < 0 || pos >= r->max_pos) return;   /* callers check positions against -c */
    const float *cs = r->cos + (size_t)pos * half, *sn = r->sin + (size_t)pos * half;
    for (int j = 0; j < half; j++) {
        float a = x[2 * j], b = x[2 * j + 1], c = cs[j], s = sn[j];
        float re, im;
        if (!inverse) {
            re = a * c - b * s;
            im = a * s + b * c;
        } else {
            re = a * c + b * s;
            im = b * c - a * s;
        }
        x[2 * j] = ds41_bf16_round(re);
        x[2 * j + 1] = ds41_bf16_round(im);
    }
}

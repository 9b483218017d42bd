/* The two functions of libm the heap profile needs, to the precision it
 * needs (a few parts in a million): linking libm into liblull.so mapped it
 * into every process lull is preloaded in (10 page faults more for a
 * preloaded /bin/true, whose fork+exec is a goal of its own). */
#ifndef LULL_PROFILE_MATH_H
#define LULL_PROFILE_MATH_H

#include <stdint.h>
#include <string.h>

/* ln(x) for x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| < 0.172: five terms leave
 * an error below 1e-8. */
static inline double lull_ln(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1023) << 52); /* m in [1, 2) */
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.4142135623730951) {
        m /= 2;
        e++;
    }
    double t = (m - 1) / (m + 1), t2 = t * t;
    double s = t * (1 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 / 9))));
    return 2 * s + e * 0.6931471805599453;
}

/* 1 - exp(-x) for x >= 0, without the cancellation of 1 - exp(-x) for
 * small x: a series below 1/8, else exp(-x) from 2^-(x / ln 2). */
static inline double lull_one_minus_exp_neg(double x) {
    if (x < 0.125) {
        /* x - x^2/2 + x^3/6 - x^4/24 + x^5/120: error below x^6/720 */
        return x * (1 - x * (0.5 - x * (1.0 / 6 - x * (1.0 / 24 - x / 120))));
    }
    if (x > 700) return 1;
    double y = x / 0.6931471805599453; /* exp(-x) = 2^-y */
    int k = (int)y;
    double f = (y - k) * 0.6931471805599453; /* exp(-f), f in [0, ln 2) */
    double term = 1, sum = 1;
    for (int i = 1; i < 16; i++) {
        term *= -f / i;
        sum += term;
    }
    uint64_t bits = (uint64_t)(1023 - k) << 52; /* 2^-k, k < 1010 */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return 1 - sum * scale;
}

#endif

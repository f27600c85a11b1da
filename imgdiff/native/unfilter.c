/* PNG unfilter of whole rows (RFC 2083 section 6 / PNG spec section 9), every filter type.
 *
 * Compiled once by build_unfilter.py into position-independent x86-64 machine code with no
 * relocations, no calls and no data (unfilter_x86_64.hex), which imgdiff.png_spng maps executable and
 * calls through ctypes. Keep it free of libc calls, globals, switch jump tables and floating point.
 *
 * src:   rows * (1 + n) bytes, each row a filter-type byte then n filtered bytes (inflated PNG data)
 * out:   rows * n bytes, the unfiltered rows (samples as stored: 16-bit ones big-endian)
 * above: n bytes, the unfiltered row above the first one (zeros for an image's first row)
 * bpp:   bytes per pixel: 1, 2, 3, 4, 6 or 8 (8/16-bit gray, gray+alpha, RGB, RGBA); n a multiple of it
 * Returns 0, or -1 at the first row with a filter type above 4 (its output is then undefined).
 */
#include <stddef.h>
#include <stdint.h>

/* The Paeth predictor, branch-free: a (left), b (up), c (up-left). Ties go to a, then b. */
static inline int paeth(int a, int b, int c) {
    int pa = b - c, pb = a - c, pc = pa + pb;
    pa = pa < 0 ? -pa : pa;
    pb = pb < 0 ? -pb : pb;
    pc = pc < 0 ? -pc : pc;
    int near = pb < pa ? b : a;
    int dist = pb < pa ? pb : pa;
    return pc < dist ? c : near;
}

/* One byte of a Sub, Avg or Paeth row with the left (A) and up-left (C) bytes of its channel held in
 * registers, so that a pixel's chain never waits on the store of the pixel before it. */
#define SUB_STEP(A, C, k) (A = (uint8_t)(x[i + (k)] + A), o[i + (k)] = (uint8_t)A, (void)C)
#define AVG_STEP(A, C, k) (A = (uint8_t)(x[i + (k)] + ((A + up[i + (k)]) >> 1)), o[i + (k)] = (uint8_t)A, (void)C)
#define PAETH_STEP(A, C, k)                                                               \
    (b = up[i + (k)], A = (uint8_t)(x[i + (k)] + paeth(A, b, C)), o[i + (k)] = (uint8_t)A, C = b)

/* Bytes i >= bpp of a row of 3- or 4-byte pixels (8-bit RGB, RGBA); n is a multiple of bpp. */
#define ROW3(STEP)                                                                        \
    do {                                                                                  \
        int a0 = o[0], a1 = o[1], a2 = o[2], c0 = up[0], c1 = up[1], c2 = up[2], b;       \
        for (size_t i = 3; i + 3 <= n; i += 3) {                                          \
            STEP(a0, c0, 0);                                                              \
            STEP(a1, c1, 1);                                                              \
            STEP(a2, c2, 2);                                                              \
        }                                                                                 \
        (void)b;                                                                          \
    } while (0)
#define ROW4(STEP)                                                                        \
    do {                                                                                  \
        int a0 = o[0], a1 = o[1], a2 = o[2], a3 = o[3];                                   \
        int c0 = up[0], c1 = up[1], c2 = up[2], c3 = up[3], b;                            \
        for (size_t i = 4; i + 4 <= n; i += 4) {                                          \
            STEP(a0, c0, 0);                                                              \
            STEP(a1, c1, 1);                                                              \
            STEP(a2, c2, 2);                                                              \
            STEP(a3, c3, 3);                                                              \
        }                                                                                 \
        (void)b;                                                                          \
    } while (0)

int imgdiff_unfilter(const uint8_t *src, uint8_t *out, size_t rows, size_t n, size_t bpp,
                     const uint8_t *above) {
    const uint8_t *up = above;
    for (size_t y = 0; y < rows; y++) {
        const uint8_t *x = src + y * (n + 1) + 1;
        uint8_t *o = out + y * n;
        uint8_t kind = x[-1];
        size_t i = 0;
        if (kind == 0) {
            for (; i < n; i++) o[i] = x[i];
        } else if (kind == 1) {
            for (; i < bpp && i < n; i++) o[i] = x[i];
            if (bpp == 3) {
                ROW3(SUB_STEP);
            } else if (bpp == 4) {
                ROW4(SUB_STEP);
            } else {
                for (; i < n; i++) o[i] = (uint8_t)(x[i] + o[i - bpp]);
            }
        } else if (kind == 2) {
            for (; i < n; i++) o[i] = (uint8_t)(x[i] + up[i]);
        } else if (kind == 3) {
            for (; i < bpp && i < n; i++) o[i] = (uint8_t)(x[i] + (up[i] >> 1));
            if (bpp == 3) {
                ROW3(AVG_STEP);
            } else if (bpp == 4) {
                ROW4(AVG_STEP);
            } else {
                for (; i < n; i++) o[i] = (uint8_t)(x[i] + ((o[i - bpp] + up[i]) >> 1));
            }
        } else if (kind == 4) {
            for (; i < bpp && i < n; i++) o[i] = (uint8_t)(x[i] + up[i]);
            if (bpp == 3) {
                ROW3(PAETH_STEP);
            } else if (bpp == 4) {
                ROW4(PAETH_STEP);
            } else {
                for (; i < n; i++) o[i] = (uint8_t)(x[i] + paeth(o[i - bpp], up[i], up[i - bpp]));
            }
        } else {
            return -1;
        }
        up = o;
    }
    return 0;
}

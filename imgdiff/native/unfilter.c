/* PNG unfilter of whole rows (RFC 2083 section 6 / PNG spec section 9), every filter type.
 *
 * Compiled once by build_unfilter.py into position-independent x86-64 machine code with no
 * relocations, no calls and no data (unfilter_x86_64.hex), which imgdiff.png_spng maps executable and
 * calls through ctypes. Keep it free of libc calls, globals, switch jump tables and floating point.
 *
 * src:   rows * (1 + n) bytes, each row a filter-type byte then n filtered bytes (inflated PNG data)
 * out:   rows * n bytes, the unfiltered rows (samples as stored: 16-bit ones big-endian)
 * above: n bytes, the unfiltered row above the first one (zeros for an image's first row)
 * bpp:   bytes per complete pixel (1 to 8)
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
            for (; i < n; i++) o[i] = (uint8_t)(x[i] + o[i - bpp]);
        } else if (kind == 2) {
            for (; i < n; i++) o[i] = (uint8_t)(x[i] + up[i]);
        } else if (kind == 3) {
            for (; i < bpp && i < n; i++) o[i] = (uint8_t)(x[i] + (up[i] >> 1));
            for (; i < n; i++) o[i] = (uint8_t)(x[i] + ((o[i - bpp] + up[i]) >> 1));
        } else if (kind == 4) {
            for (; i < bpp && i < n; i++) o[i] = (uint8_t)(x[i] + up[i]);
            for (; i < n; i++) o[i] = (uint8_t)(x[i] + paeth(o[i - bpp], up[i], up[i - bpp]));
        } else {
            return -1;
        }
        up = o;
    }
    return 0;
}

/* nfc_check: NFC of each input line. Reads lines of hex-encoded UTF-8 on stdin and writes the
 * hex of dsp_nfc_normalize's result, one line each ("!" + the message on an error). Driven by
 * tests/py/test_nfc.py, which compares with Python's unicodedata.normalize("NFC", ...). */
#include "tok/nfc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }

int main(void) {
    char *line = NULL, *buf = NULL;
    size_t cap = 0, bcap = 0;
    ssize_t n;
    dsp_nfc_scratch sc = {0};
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if ((size_t)n / 2 + 1 > bcap && !(buf = realloc(buf, bcap = (size_t)n / 2 + 1))) return 2;
        size_t len = 0;
        for (ssize_t i = 0; i + 1 < n; i += 2) {
            int hi = hexval(line[i]), lo = hexval(line[i + 1]);
            if (hi < 0 || lo < 0) return 2;
            buf[len++] = (char)(hi << 4 | lo);
        }
        const char *out;
        size_t ol;
        if (dsp_nfc_normalize(buf, len, (size_t)1 << 30, &sc, &out, &ol)) {
            printf("!%s\n", dsp_last_error());
            continue;
        }
        for (size_t i = 0; i < ol; i++) printf("%02x", (unsigned char)out[i]);
        putchar('\n');
    }
    dsp_nfc_scratch_free(&sc);
    free(line);
    free(buf);
    return 0;
}

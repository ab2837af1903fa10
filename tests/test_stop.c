/* engine/stop: stop strings over streamed text, including stops split across tokens. */
#include "dsp_test.h"

#include "engine/stop.h"

#include <stdlib.h>

/* feed the pieces; return everything emitted (and flushed if no stop), set *hit */
static char *run(const char *const *stops, int n_stops, const char *const *pieces, int n, bool *hit) {
    dsp_stop st;
    CHECK(dsp_stop_init(&st, stops, n_stops) == DSP_OK);
    char *out = calloc(4096, 1);
    size_t o = 0;
    *hit = false;
    for (int i = 0; i < n && !*hit; i++) {
        const char *e;
        size_t ne;
        *hit = dsp_stop_feed(&st, pieces[i], strlen(pieces[i]), &e, &ne);
        memcpy(out + o, e, ne);
        o += ne;
    }
    if (!*hit) {
        const char *e;
        size_t ne;
        dsp_stop_flush(&st, &e, &ne);
        memcpy(out + o, e, ne);
        o += ne;
    }
    dsp_stop_free(&st);
    return out;
}

static void test_split_stop(void) {
    const char *stops[] = {"\n\nUser:", NULL};
    const char *pieces[] = {"Hello", " there", "\n", "\nUs", "er:", " more"};
    bool hit;
    char *o = run(stops, 1, pieces, 6, &hit);
    CHECK(hit);
    CHECK_EQ_STR(o, "Hello there");
    free(o);
}

static void test_false_start(void) {
    const char *stops[] = {"END", NULL};
    const char *pieces[] = {"E", "N", "D?"};
    bool hit;
    char *o = run(stops, 1, pieces, 3, &hit);
    CHECK(hit);
    CHECK_EQ_STR(o, "");
    free(o);
    const char *pieces2[] = {"EN", "X", "EEN", "d"};
    o = run(stops, 1, pieces2, 4, &hit);
    CHECK(!hit);
    CHECK_EQ_STR(o, "ENXEENd");
    free(o);
}

static void test_earliest_of_many(void) {
    const char *stops[] = {"bb", "abc", "c", NULL};
    const char *pieces[] = {"xxab", "cbb"};
    bool hit;
    char *o = run(stops, 3, pieces, 2, &hit);
    CHECK(hit);
    CHECK_EQ_STR(o, "xx");
    free(o);
}

static void test_no_stops_passthrough(void) {
    const char *pieces[] = {"a", "b"};
    bool hit;
    char *o = run(NULL, 0, pieces, 2, &hit);
    CHECK(!hit);
    CHECK_EQ_STR(o, "ab");
    free(o);
}

static void test_too_many(void) {
    const char *stops[] = {"a", "b", "c", "d", "e", NULL};
    dsp_stop st;
    CHECK_EQ_INT(dsp_stop_init(&st, stops, 5), DSP_ERR_INVALID_ARG);
    dsp_stop_free(&st);
}

int main(void) {
    DSP_RUN(test_split_stop);
    DSP_RUN(test_false_start);
    DSP_RUN(test_earliest_of_many);
    DSP_RUN(test_no_stops_passthrough);
    DSP_RUN(test_too_many);
    return dsp_test_summary();
}

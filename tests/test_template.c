/* tests/test_template: the chat template interpreter on expressions, whitespace control, errors
 * and limits (the jinja2 oracle comparison on real templates is tests/py/test_template.py). */
#include "dsp_test.h"
#include "template/template.h"

#include <jansson.h>

/* render src with a JSON context; returns malloc'd output or NULL (error in dsp_last_error) */
static char *render_lim(const char *src, const char *ctx_json, const dsp_tmpl_limits *lim) {
    json_error_t jerr;
    json_t *ctx = json_loads(ctx_json ? ctx_json : "{}", 0, &jerr);
    if (!ctx) {
        fprintf(stderr, "bad test JSON: %s\n", jerr.text);
        return NULL;
    }
    dsp_tmpl *t = NULL;
    char *out = NULL;
    size_t n = 0;
    dsp_tmpl_render_opts opts = {.has_now = true, .now = 1721995200};
    if (dsp_tmpl_create(&t, src, strlen(src), lim) == DSP_OK) {
        if (dsp_tmpl_render(t, ctx, &opts, &out, &n) != DSP_OK) out = NULL;
        dsp_tmpl_destroy(t);
    }
    json_decref(ctx);
    return out;
}
static char *render(const char *src, const char *ctx) { return render_lim(src, ctx, NULL); }

#define CHECK_RENDER(src, ctx, want)                                                           \
    do {                                                                                       \
        char *_o = render(src, ctx);                                                           \
        CHECK_MSG(_o != NULL, "render failed: %s: %s", src, dsp_last_error());                 \
        if (_o) CHECK_EQ_STR(_o, want);                                                        \
        free(_o);                                                                              \
    } while (0)

/* must fail with a message containing `part` */
#define CHECK_FAILS(src, ctx, part)                                                            \
    do {                                                                                       \
        char *_o = render(src, ctx);                                                           \
        CHECK_MSG(_o == NULL, "expected an error for %s, got \"%s\"", src, _o ? _o : "");      \
        if (!_o) CHECK_MSG(strstr(dsp_last_error(), part) != NULL, "message '%s' lacks '%s'",  \
                           dsp_last_error(), part);                                            \
        free(_o);                                                                              \
    } while (0)

static void test_expressions(void) {
    CHECK_RENDER("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7 / 2 }}",
                 NULL, "7|9|3|-4|2|3.5");
    CHECK_RENDER("{{ 2 ** 10 }}|{{ 1 / 3 }}|{{ 1e20 }}|{{ 0.00001 }}|{{ 1.0 }}|{{ -0.0 }}", NULL,
                 "1024|0.3333333333333333|1e+20|1e-05|1.0|-0.0");
    CHECK_RENDER("{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' + 'c' }}|{{ 'x' * 3 }}|{{ [1] + [2] }}", NULL,
                 "a1NoneTrue|abc|xxx|[1, 2]");
    CHECK_RENDER("{{ 1 < 2 < 3 }}{{ 1 == 1.0 }}{{ 'a' in 'cab' }}{{ 3 not in [1, 2] }}{{ not 0 }}",
                 NULL, "TrueTrueTrueTrueTrue");
    CHECK_RENDER("{{ [] or 'e' }}|{{ 'a' and 'b' }}|{{ 'y' if 0 else 'n' }}|{{ 'z' if false }}|", NULL,
                 "e|b|n||");
    CHECK_RENDER("{{ [1, 'a', none, (1,), {'k': 1.5}] }}", NULL, "[1, 'a', None, (1,), {'k': 1.5}]");
    CHECK_RENDER("{{ \"it's\" }}|{{ ['it\\'s'] }}|{{ 'a\\tb\\u00e9\\x41' }}", NULL,
                 "it's|[\"it's\"]|a\tb\xc3\xa9" "A");
    CHECK_RENDER("{{ 'h\xc3\xa9llo'|length }}{{ 'h\xc3\xa9llo'[1] }}{{ 'h\xc3\xa9llo'[::-1] }}", NULL,
                 "5\xc3\xa9oll\xc3\xa9h");
    CHECK_RENDER("{{ x.y }}|{{ x['z'] }}|{{ x.items()|list }}", "{\"x\": {\"y\": 1, \"z\": [2]}}",
                 "1|[2]|[('y', 1), ('z', [2])]");
    CHECK_RENDER("{{ m[0].role }}{{ m[-1]['content'] }}{{ m|length }}{{ m[5] }}",
                 "{\"m\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"x\", \"content\": \"b\"}]}",
                 "userb2");
}

static void test_filters_tests(void) {
    CHECK_RENDER("{{ '  a  '|trim }}|{{ 'Ab'|lower }}{{ 'ab'|upper }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}",
                 NULL, "a|abAB|Hello World|Hello");
    CHECK_RENDER("{{ [3, 1, 2]|sort|join(',') }}|{{ [1, 2, 1]|unique|list }}|{{ [1, 2]|first }}{{ [1, 2]|last }}",
                 NULL, "1,2,3|[1, 2]|12");
    CHECK_RENDER("{{ {'b': 1, 'a': [1, 'é', none, true]}|tojson }}", NULL,
                 "{\"b\": 1, \"a\": [1, \"\xc3\xa9\", null, true]}");
    CHECK_RENDER("{{ {'a': [1, {}]}|tojson(indent=2) }}", NULL,
                 "{\n  \"a\": [\n    1,\n    {}\n  ]\n}");
    CHECK_RENDER("{{ 'q\"\\\\\\n'|tojson }}", NULL, "\"q\\\"\\\\\\n\"");
    CHECK_RENDER("{{ u|default('d') }}{{ ''|default('e', true) }}{{ 'x'|default('f') }}", NULL, "dex");
    CHECK_RENDER("{{ l|selectattr('t', 'equalto', 'b')|map(attribute='n')|list }}",
                 "{\"l\": [{\"t\": \"a\", \"n\": 1}, {\"t\": \"b\", \"n\": 2}]}", "[2]");
    CHECK_RENDER("{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}", NULL, "a\n  b|  a\n  b");
    CHECK_RENDER("{{ u is defined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}{{ 3 is odd }}",
                 NULL, "FalseTrueTrueTrueTrue");
    CHECK_RENDER("{{ 'a,b'.split(',') }}{{ ' a b '.split() }}{{ 'xax'.strip('x') }}{{ 'ab'.startswith('a') }}",
                 NULL, "['a', 'b']['a', 'b']aTrue");
    CHECK_RENDER("{{ 'x'|safe + '<' }}|{{ '<'|e }}", NULL, "x&lt;|&lt;");
}

static void test_statements(void) {
    CHECK_RENDER("{% for i in range(5) if i is odd %}{{ loop.index }}/{{ loop.length }}:{{ i }} {% else %}none{% endfor %}",
                 NULL, "1/2:1 2/2:3 ");
    CHECK_RENDER("{% for i in [] %}x{% else %}none{% endfor %}", NULL, "none");
    CHECK_RENDER("{% for i in range(10) %}{% if i == 4 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}",
                 NULL, "023");
    CHECK_RENDER("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
                 NULL, "6");
    /* a plain set inside a loop does not leak out, nor into the next iteration */
    CHECK_RENDER("{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }};{% endfor %}{{ x }}",
                 NULL, "12;12;12;1");
    CHECK_RENDER("{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}", NULL,
                 "[1B][23]");
    CHECK_RENDER("{% set x %} in {{ 1 }} {% endset %}[{{ x }}]{% filter upper %}ab{% endfilter %}", NULL,
                 "[ in 1 ]AB");
    CHECK_RENDER("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}",
                 "b=1;a=2;");
    CHECK_RENDER("{% raw %}{{ x }}{% endraw %}{% generation %}g{% endgeneration %}", NULL, "{{ x }}g");
    CHECK_RENDER("{{ strftime_now('%Y-%m-%d') }}", NULL, "2024-07-26");
}

static void test_whitespace(void) {
    /* trim_blocks + lstrip_blocks, "-" and "+" markers, one trailing newline dropped */
    CHECK_RENDER("  {% if true %}\n    x\n  {% endif %}\ny\n", NULL, "    x\ny");
    CHECK_RENDER("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    CHECK_RENDER("{{ 1 }}  {% if true %}z{% endif %}", NULL, "1  z");
    CHECK_RENDER("  {%+ if true %}x{% endif %}", NULL, "  x");
    CHECK_RENDER("a\n  {# c #}\nb", NULL, "a\nb");
    CHECK_RENDER("a\r\nb\r\n", NULL, "a\nb");
    CHECK_RENDER("{% for i in [1, 2] %}\n- {{ i }}\n{% endfor %}\n", NULL, "- 1\n- 2\n");
}

static void test_errors(void) {
    CHECK_FAILS("{{ raise_exception('bad roles') }}", NULL, "bad roles");
    CHECK_FAILS("{% if x %}", NULL, "endif");
    CHECK_FAILS("{% for %}", NULL, "line 1");
    CHECK_FAILS("{{ 1 +  }}", NULL, "expected");
    CHECK_FAILS("{{ x|nosuchfilter }}", NULL, "nosuchfilter");
    CHECK_FAILS("{% include 'x.j' %}", NULL, "include");
    CHECK_FAILS("{% endfor %}", NULL, "endfor");
    CHECK_FAILS("a\n\n{{ u.v }}", NULL, "line 3");
    CHECK_FAILS("{{ 'a' + 1 }}", NULL, "unsupported operand");
    CHECK_FAILS("{{ 1 // 0 }}", NULL, "zero");
    CHECK_FAILS("{{ [1, 2) }}", NULL, "unexpected");
    CHECK_FAILS("{{ 'abc }}", NULL, "unterminated");
    CHECK_FAILS("{# never closed", NULL, "comment");
    CHECK_FAILS("{{ x.append(1) }}", "{\"x\": [1]}", "unsafe");
    CHECK_FAILS("{{ 9223372036854775807 + 1 }}", NULL, "overflow");
    CHECK_FAILS("{{ '%s' % 1 }}", NULL, "formatting");
    CHECK_FAILS("{% break %}", NULL, "outside");
    CHECK_FAILS("{{ range(1000000)|length }}", NULL, "Range too big");
    /* invalid UTF-8 in the source */
    CHECK_FAILS("\xff\xfe", NULL, "UTF-8");
}

static void test_limits(void) {
    /* deep nesting of blocks and parentheses: an error, not a stack overflow */
    size_t depth = 5000;
    char *src = malloc(depth * 24 + 64);
    size_t n = 0;
    for (size_t i = 0; i < depth; i++) n += (size_t)sprintf(src + n, "{%% if 1 %%}");
    for (size_t i = 0; i < depth; i++) n += (size_t)sprintf(src + n, "{%% endif %%}");
    src[n] = '\0';
    CHECK_FAILS(src, NULL, "nested too deeply");
    n = 0;
    n += (size_t)sprintf(src + n, "{{ ");
    for (size_t i = 0; i < depth; i++) src[n++] = '(';
    src[n++] = '1';
    for (size_t i = 0; i < depth; i++) src[n++] = ')';
    n += (size_t)sprintf(src + n, " }}");
    src[n] = '\0';
    CHECK_FAILS(src, NULL, "nested");
    n = 0;
    n += (size_t)sprintf(src + n, "{{ ");
    for (size_t i = 0; i < depth; i++) n += (size_t)sprintf(src + n, "not ");
    n += (size_t)sprintf(src + n, "1 }}");
    CHECK_FAILS(src, NULL, "nested too deeply");
    free(src);

    /* unbounded recursion through a macro */
    CHECK_FAILS("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "deep");
    /* huge loops: step limit */
    dsp_tmpl_limits lim = dsp_tmpl_default_limits();
    lim.max_steps = 100000;
    char *o = render_lim("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                         NULL, &lim);
    CHECK(o == NULL);
    CHECK(strstr(dsp_last_error(), "steps") != NULL);
    free(o);
    /* output size */
    lim = dsp_tmpl_default_limits();
    lim.max_output = 1000;
    o = render_lim("{% for i in range(100) %}0123456789ab{% endfor %}", NULL, &lim);
    CHECK(o == NULL);
    CHECK(strstr(dsp_last_error(), "max_output") != NULL);
    free(o);
    o = render_lim("{{ 'x' * 100000 }}", NULL, &lim);
    CHECK(o == NULL);
    free(o);
    /* memory: lists doubling in a namespace */
    lim = dsp_tmpl_default_limits();
    lim.max_memory = 1 << 20;
    o = render_lim("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
                   NULL, &lim);
    CHECK(o == NULL);
    CHECK(strstr(dsp_last_error(), "memory") != NULL);
    free(o);
    /* source size */
    lim = dsp_tmpl_default_limits();
    lim.max_source = 10;
    dsp_tmpl *t = NULL;
    CHECK(dsp_tmpl_create(&t, "0123456789ab", 12, &lim) != DSP_OK);
    CHECK(t == NULL);
}

/* every prefix of a real template must parse or fail cleanly */
static void test_truncations(void) {
    const char *src =
        "{%- set ns = namespace(x=messages|length - 1) %}{% for m in messages[::-1] %}"
        "{%- if m.role == 'user' and not (m.content.startswith('<a>')) %}{% set ns.x = loop.index0 %}"
        "{%- endif %}{% endfor %}{{ '<|im_start|>' + messages[0]['role'] + '\\n' }}{# c #}"
        "{% macro f(a, b=[1, {'k': (1, 2)}]) -%}{{ a|tojson(indent=2) }}{%- endmacro %}{{ f(1) }}";
    const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    size_t n = strlen(src);
    int ok = 0;
    for (size_t i = 0; i <= n; i++) {
        char *cut = malloc(i + 1);
        memcpy(cut, src, i);
        cut[i] = '\0';
        char *o = render(cut, ctx);
        ok += o != NULL;
        free(o);
        free(cut);
    }
    CHECK(ok > 0);
    char *full = render(src, ctx);
    CHECK(full != NULL);
    free(full);
}

/* range() near the ends of int64: the length and every element exactly as Python computes them
 * (the element index times the step used to overflow) */
static void test_range_extremes(void) {
    CHECK_RENDER("{{ range(-9223372036854775807 - 1, 9223372036854775807, 4611686018427387904)|list }}", NULL,
                 "[-9223372036854775808, -4611686018427387904, 0, 4611686018427387904]");
    CHECK_RENDER("{{ range(9223372036854775807, -9223372036854775807 - 1, -4611686018427387904)|list }}", NULL,
                 "[9223372036854775807, 4611686018427387903, -1, -4611686018427387905]");
    CHECK_RENDER("{{ range(0, 9223372036854775807, 3074457345618258602)|list }}", NULL,
                 "[0, 3074457345618258602, 6148914691236517204, 9223372036854775806]");
    CHECK_RENDER("{{ range(5, 0, -9223372036854775807 - 1)|list }}|{{ range(3, 3)|list }}|{{ range(-3)|list }}", NULL, "[5]|[]|[]");
    CHECK_FAILS("{{ range(-9223372036854775807 - 1, 9223372036854775807) }}", NULL, "MAX_RANGE");
}

int main(void) {
    DSP_RUN(test_expressions);
    DSP_RUN(test_filters_tests);
    DSP_RUN(test_statements);
    DSP_RUN(test_whitespace);
    DSP_RUN(test_errors);
    DSP_RUN(test_limits);
    DSP_RUN(test_truncations);
    DSP_RUN(test_range_extremes);
    return dsp_test_summary();
}

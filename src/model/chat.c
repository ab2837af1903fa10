/* model/chat: the model's chat template (parsed once at load) and dsp_chat_render. */
#include "model/model.h"

#include "template/template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void dsp_model_parse_chat_template(dsp_model *m) {
    if (!m->tmpl_src) return;
    m->has_chat_template = true;
    /* a template we cannot parse is not fatal for loading: rendering reports the error */
    if (dsp_tmpl_create(&m->tmpl, m->tmpl_src, m->tmpl_len, NULL) != DSP_OK) {
        snprintf(m->tmpl_error, sizeof m->tmpl_error, "%s", dsp_last_error());
        m->tmpl = NULL;
    }
}

bool dsp_model_has_chat_template(const dsp_model *m) { return m->has_chat_template; }

const char *dsp_model_chat_template(const dsp_model *m, size_t *len) {
    *len = m->tmpl_src ? m->tmpl_len : 0;
    return m->tmpl_src;
}

static void set_token_var(json_t *ctx, const char *key, const dsp_tok *t, int32_t id) {
    if (json_object_get(ctx, key)) return;
    size_t len = 0;
    const char *s = id >= 0 && t ? dsp_tok_text(t, id, &len) : NULL;
    json_object_set_new(ctx, key, s ? json_stringn(s, len) : json_string(""));
}

dsp_status dsp_chat_render(const dsp_model *m, const char *template_src, const char *context_json, size_t len, char **out,
                           size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    dsp_tmpl *own = NULL;
    const dsp_tmpl *t = m->tmpl;
    dsp_status st;
    if (template_src) {
        if ((st = dsp_tmpl_create(&own, template_src, strlen(template_src), NULL))) {
            dsp_error_prefix("chat template");
            return st;
        }
        t = own;
    } else if (!t) {
        if (m->has_chat_template) return dsp_error(DSP_ERR_TEMPLATE, "the model's chat template cannot be used: %s", m->tmpl_error);
        return dsp_error(DSP_ERR_NOT_FOUND, "the model has no chat template (tokenizer.chat_template, chat_template.jinja or tokenizer_config.json); pass one explicitly");
    }
    json_error_t jerr;
    json_t *ctx = json_loadb(context_json, len, JSON_ALLOW_NUL, &jerr);
    if (!ctx || !json_is_object(ctx)) {
        st = ctx ? dsp_error(DSP_ERR_FORMAT, "chat context: must be a JSON object")
                 : dsp_error(DSP_ERR_FORMAT, "chat context: line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        json_decref(ctx);
        dsp_tmpl_destroy(own);
        return st;
    }
    set_token_var(ctx, "bos_token", m->tok, m->tok ? dsp_tok_bos(m->tok) : -1);
    set_token_var(ctx, "eos_token", m->tok, m->tok ? dsp_tok_eos(m->tok) : -1);
    if (!json_object_get(ctx, "add_generation_prompt")) json_object_set_new(ctx, "add_generation_prompt", json_false());
    st = dsp_tmpl_render(t, ctx, NULL, out, out_len);
    json_decref(ctx);
    dsp_tmpl_destroy(own);
    return st;
}

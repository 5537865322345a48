/* api_metrics.c: the public metrics calls of sluice.h (sluice_metrics_write
 * and sluice_metrics_write_models, sluice_metrics_format_for_accept) and
 * the model's label. Same rules as api.c: arguments checked here, errors
 * recorded on the model, engine calls bracketed with sl_engine_enter /
 * sl_engine_leave.
 */
#include "api/model.h"

#include "engine/engine.h"
#include "index/json.h"
#include "counters/metrics.h"
#include "sources/remote.h"
#include "index/source.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

int sl_model_metrics_label(sluice_model *m, const char *path, sl_err *err)
{
    const char *label = m->opts.metrics_label;
    m->opts.metrics_label = NULL;  /* the caller's: borrowed during open only */
    if (label) {
        SL_TRY(sl_metrics_label_check(label, err));
    } else {
        /* The path, when it is a valid label; else a fixed word. A remote
         * location as messages show it: no credential, no query. */
        label = m->loc->shown;
        if (sl_metrics_label_check(label, NULL) < 0)
            label = "model";
    }
    if (!(m->metrics_label = strdup(label)))
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
    return SLUICE_OK;
}

void sl_model_metrics_opened(sluice_model *m, uint64_t t0)
{
    sl_engine_metrics(m->engine)->open_ns = t0;
}

SLUICE_API int sluice_metrics_write_models(sluice_model *const *models, size_t n, char *buf,
                                           size_t cap, size_t *needed,
                                           sluice_metrics_format format)
{
    sl_err err = {0};
    if (!models || n == 0)
        return SLUICE_E_INVAL;
    sluice_model *first = models[0];
    for (size_t k = 0; k < n; k++)
        if (sl_model_usable(models[k]) < 0) {
            if (!models[k] || k == 0)
                return SLUICE_E_INVAL;
            sl_fail(&err, SLUICE_E_INVAL, "metrics: model %zu of %zu is not an open model", k, n);
            return sl_model_error(first, &err);
        }
    if (!buf && cap) {
        sl_fail(&err, SLUICE_E_INVAL, "metrics: buf is NULL and cap %zu", cap);
        return sl_model_error(first, &err);
    }
    if (format != SLUICE_METRICS_PROMETHEUS && format != SLUICE_METRICS_OPENMETRICS) {
        sl_fail(&err, SLUICE_E_INVAL, "metrics: unknown format %d", (int)format);
        return sl_model_error(first, &err);
    }
    for (size_t k = 1; k < n; k++)
        for (size_t j = 0; j < k; j++)
            if (!strcmp(models[k]->metrics_label, models[j]->metrics_label)) {
                sl_fail(&err, SLUICE_E_INVAL,
                        "metrics: models %zu and %zu have the same label \"%.*s\" (set "
                        "sluice_options.metrics_label); %s",
                        j, k,
                        (int)sl_utf8_prefix(models[k]->metrics_label,
                                            strlen(models[k]->metrics_label), 200),
                        models[k]->metrics_label,
                        models[k] == models[j] ? "the same model is listed twice"
                                               : "their series would collide");
                return sl_model_error(models[k], &err);
            }
    sl_engine **engines = malloc(n * sizeof *engines);
    const char **labels = malloc(n * sizeof *labels);
    if (!engines || !labels) {
        free(engines);
        free(labels);
        sl_fail(&err, SLUICE_E_NOMEM, "metrics: out of memory");
        return sl_model_error(first, &err);
    }
    size_t entered = 0;
    int rc = SLUICE_OK;
    for (; entered < n; entered++) {
        if ((rc = sl_engine_enter(models[entered]->engine, &err)) < 0)
            break;
        engines[entered] = models[entered]->engine;
        labels[entered] = models[entered]->metrics_label;
    }
    if (rc == SLUICE_OK)
        rc = sl_metrics_render(engines, labels, n, buf, cap, needed, (int)format, &err);
    sluice_model *blame = entered < n ? models[entered] : first;
    if (rc < 0)
        sl_model_error(blame, &err);
    while (entered-- > 0)
        sl_engine_leave(engines[entered]);
    free(engines);
    free(labels);
    return rc;
}

SLUICE_API int sluice_metrics_write(sluice_model *model, char *buf, size_t cap, size_t *needed,
                                    sluice_metrics_format format)
{
    if (sl_model_usable(model) < 0)
        return SLUICE_E_INVAL;
    return sluice_metrics_write_models(&model, 1, buf, cap, needed, format);
}

SLUICE_API sluice_metrics_format sluice_metrics_format_for_accept(const char *accept)
{
    static const char om[] = "application/openmetrics-text";
    const size_t n = sizeof om - 1;
    for (const char *p = accept; p && *p; p++) {
        size_t i = 0;
        while (i < n && tolower((unsigned char)p[i]) == om[i])
            i++;
        if (i == n)
            return SLUICE_METRICS_OPENMETRICS;
    }
    return SLUICE_METRICS_PROMETHEUS;
}

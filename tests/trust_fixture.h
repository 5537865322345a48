/* trust_fixture.h: the trust plan and the manifest loader of an open of a
 * location string, for the tests that call them without sluice_open:
 * each location parsed as sluice_open parses it (base/location.h), the
 * call made, the parsed locations freed. */
#ifndef SLUICE_TRUST_FIXTURE_H
#define SLUICE_TRUST_FIXTURE_H

#include "base/location.h"
#include "trust/manifest.h"
#include "trust/trust_plan.h"

#include <stdlib.h>

/* sl_trust_plan_make for model, o->manifest_path and o->signature_path. */
static inline int tf_plan(const sluice_options *o, const char *model, sl_trust_plan *p,
                          sl_err *err)
{
    sl_location *l = sl_location_new(model);
    sl_location *mf = o->manifest_path ? sl_location_new(o->manifest_path) : NULL;
    sl_location *sig = o->signature_path ? sl_location_new(o->signature_path) : NULL;
    if (!l || (o->manifest_path && !mf) || (o->signature_path && !sig))
        abort();
    sl_trust_locs at = {l, mf, sig};
    int rc = sl_trust_plan_make(o, &at, p, err);
    sl_location_free(l);
    sl_location_free(mf);
    sl_location_free(sig);
    return rc;
}

/* sl_manifest_load for the model at model. */
static inline int tf_load(const sl_index *ix, const sl_trust_plan *p, const char *model,
                          sl_manifest **out, int *hub_files_only, sl_err *err)
{
    sl_location *l = sl_location_new(model);
    if (!l)
        abort();
    int rc = sl_manifest_load(ix, p, NULL, l, out, hub_files_only, err);
    sl_location_free(l);
    return rc;
}

#endif

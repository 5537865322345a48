/* jsonout.c: see jsonout.h. The escaping is the manifest writer's
 * (src/api/manifest_write.c, compiled into the command). */
#include "jsonout.h"

#include "api/manifest_write.h"

void json_string(FILE *out, const char *s, size_t len)
{
    sl_mw_json_string(out, s, len);
}
